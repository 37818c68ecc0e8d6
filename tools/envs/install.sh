#!/usr/bin/env bash
# The course's one install recipe: the Makefile (make env, make dev), Binder's postBuild, the matrix's and Colab's
# environments and CONTRIBUTING's "without make" all run this script, so the steps are written once.
#
#   tools/envs/install.sh PYTHON [--dev] [--requirements FILE | --no-requirements] [--print]
#
# 1. the pinned packages: requirements.txt (what the notebooks and JupyterLab need), or FILE (Colab's stack), or
#    none (Binder, whose build installs binder/requirements.txt itself);
# 2. d2l without its hard pins (numpy==1.23.5, ...: they break on Python 3.12 and on Colab): requirements-d2l.txt,
#    --no-deps; its real imports are in requirements.txt;
# 3. this course's helper package d2l_ext, editable, --no-deps;
# 4. with --dev: the test, lint and type-check tools (requirements-dev.txt), which learners never run.
# --print: print the pip commands instead of running them (what the tests and tools/envs/binder.py read).
#
# Each step runs `uv pip install --compile-bytecode --link-mode=copy` with the same arguments where it can: uv
# (pinned below, installed into the environment by pip first) is faster than pip (the dev environment with cold
# caches here: pip 117 s, uv 38 s hard-linked, 59 s copied with a warm cache; the same packages, issue 45), and
# writes bytecode and copied files as pip does (see below).
# It is given pip's own indexes, wheel folders and caps (tools/envs/uv_options.py), as it does not read pip's
# configuration. D2L_EXT_INSTALLER=pip uses pip alone (Binder's postBuild, whose two steps install no package);
# where uv cannot be installed, or a step fails under uv, pip runs that step, after one line that says so.
set -euo pipefail
absolute() { case "$1" in /*) echo "$1" ;; */*) echo "$PWD/$1" ;; *) echo "$1" ;; esac; }
if [ $# -lt 1 ] || [[ "$1" == --* ]]; then
  echo "usage: tools/envs/install.sh PYTHON [--dev] [--requirements FILE | --no-requirements] [--print]" >&2
  exit 2
fi
python=$(absolute "$1")  # a path is taken from where the script was called; a bare name from PATH
shift
requirements=requirements.txt dev=0 print=0
while [ $# -gt 0 ]; do
  case "$1" in
    --dev) dev=1 ;;
    --no-requirements) requirements="" ;;
    --requirements) requirements=$(absolute "${2:?--requirements needs a file}"); shift ;;
    --print) print=1 ;;
    *) echo "install.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
cd "$(dirname "$0")/../.."  # requirements*.txt and the package are the repository's
UV_PIN=uv==0.13.9
installer=${D2L_EXT_INSTALLER:-uv}
case "$installer" in uv|pip) ;; *) echo "install.sh: D2L_EXT_INSTALLER=$installer: expected uv or pip" >&2; exit 2 ;; esac
uv_options=()
uv_ready() {  # whether uv can run the steps: installed (once) and given pip's settings
  [ "$installer" = uv ] || return 1
  if [ ${#uv_options[@]} -eq 0 ]; then
    if ! "$python" -m uv --version >/dev/null 2>&1 && ! "$python" -m pip install --quiet "$UV_PIN"; then
      echo "install.sh: $UV_PIN could not be installed; pip installs everything" >&2
      installer=pip
      return 1
    fi
    local line
    while IFS= read -r line; do  # an empty line would reach uv as an empty argument
      if [ -n "$line" ]; then uv_options+=("$line"); fi
    done < <("$python" tools/envs/uv_options.py)
    uv_options+=(--python "$python")  # never empty from here on
    local option
    for option in "${uv_options[@]}"; do
      case "$option" in SSL_CERT_FILE=*) export "$option" ;; esac
    done
  fi
}
pip() {
  if [ "$print" = 1 ]; then echo "$python -m pip install $*"; return; fi
  if uv_ready; then
    local options=() option
    for option in "${uv_options[@]}"; do case "$option" in SSL_CERT_FILE=*) ;; *) options+=("$option") ;; esac; done
    # --compile-bytecode, as pip does: where PYTHONDONTWRITEBYTECODE is set (this machine, CI) no .pyc would ever be
    # written, and every kernel would compile torch from source (CI of a3afb0e: kernels 100 MiB larger, make test
    # 12.7 min instead of about 7.5)
    # --link-mode=copy, as pip writes its files: uv's default hard-links them to its cache, and a kernel of a venv
    # so linked held about 100 MiB more of torch's libraries resident (libtorch_cpu.so 76 MiB against 52, page
    # cache dropped; measured here), which failed chapters 3 and 8 under check-memory's budget, while Binder, which
    # installs with pip, would not see it
    if "$python" -m uv pip install --compile-bytecode --link-mode=copy ${PIP_QUIET:+--quiet} "${options[@]}" "$@"
    then return; fi
    echo "install.sh: uv could not install $*; pip tries" >&2
  fi
  "$python" -m pip install "$@"
}
if [ -n "$requirements" ]; then pip -r "$requirements"; fi
pip --no-deps -r requirements-d2l.txt
pip --no-deps -e .
if [ "$dev" = 1 ]; then pip -r requirements-dev.txt; fi
