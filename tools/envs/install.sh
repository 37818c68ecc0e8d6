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
pip() {
  if [ "$print" = 1 ]; then echo "$python -m pip install $*"; else "$python" -m pip install "$@"; fi
}
if [ -n "$requirements" ]; then pip -r "$requirements"; fi
pip --no-deps -r requirements-d2l.txt
pip --no-deps -e .
if [ "$dev" = 1 ]; then pip -r requirements-dev.txt; fi
