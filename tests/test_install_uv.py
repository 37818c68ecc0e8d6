"""tools/envs/install.sh runs its steps with uv where it can, given pip's settings (tools/envs/uv_options.py), and
with pip where uv cannot be installed or a step fails under it (issue 45)."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from tools import REPO
from tools.envs.uv_options import options

# `pip config list` on this machine (2026-11-29): a folder of wheels, two local indexes, a cap on torch's version
THIS_MACHINE = """\
global.cert='/etc/ssl/certs/ca-certificates.crt'
global.constraint='/etc/xdg/pip/constraints.txt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/opt/wheels'
:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='180'
:env:.disable-pip-version-check='1'
:env:.find-links='/opt/wheels'
"""


def test_uv_is_given_pips_indexes_wheels_and_caps():
    assert options(THIS_MACHINE) == [
        "--extra-index-url=file:///opt/pypi/simple", "--extra-index-url=file:///opt/pypi-more/simple",
        "--find-links=/opt/wheels",  # once, though a file and a variable both give it
        "--constraint=/etc/xdg/pip/constraints.txt",
        "--index-strategy=unsafe-best-match",  # pip's way: the best version from every index
        "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"]
    mirror = "global.index-url='https://files.example/simple'\n:env:.index-url='https://mirror.example/simple'\n"
    assert options(mirror) == ["--index-url=https://mirror.example/simple"]  # a variable beats a file, as in pip
    assert options("global.no-index='true'\nglobal.find-links='/w'\n") == ["--no-index", "--find-links=/w"]
    assert options("") == []  # an unconfigured pip: PyPI, uv's default too


# A stand-in for the new environment's Python: it logs each call, and `-m uv` or `-m pip install uv==...` fail
# where FAIL names them
FAKE_PYTHON = """#!/bin/bash
echo "$*" >> "$LOG"
case "$1 $2 $3" in
  "-m uv --version") [[ "$FAIL" == *uv-missing* ]] && exit 1; exit 0 ;;
  "-m uv pip") [[ "$FAIL" == *uv-step* ]] && exit 1; exit 0 ;;
  "-m pip install") [[ "$FAIL" == *uv-install* && "$*" == *uv==* ]] && exit 1; exit 0 ;;
  "-m pip config") exit 0 ;;
esac
exec python3 "$@"
"""


def install(tmp_path: Path, fail: str = "", installer: str | None = None) -> tuple[subprocess.CompletedProcess,
                                                                                    list[str]]:
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "calls.log"
    environment = {**os.environ, "LOG": str(log), "FAIL": fail}
    environment.pop("D2L_EXT_INSTALLER", None)
    if installer:
        environment["D2L_EXT_INSTALLER"] = installer
    done = subprocess.run(["bash", str(REPO / "tools" / "envs" / "install.sh"), str(python)], env=environment,
                          capture_output=True, text=True, timeout=60)
    calls = log.read_text().splitlines() if log.exists() else []
    return done, [call for call in calls if " install " in f" {call} "]


def test_each_step_runs_under_uv_with_this_environments_python(tmp_path):
    done, calls = install(tmp_path)
    assert done.returncode == 0 and done.stderr == ""
    python = str(tmp_path / "python")
    assert [call.split(" --python ")[-1] for call in calls] == [
        f"{python} -r requirements.txt", f"{python} --no-deps -r requirements-d2l.txt", f"{python} --no-deps -e ."]
    # .pyc and copied files, as pip writes them
    assert all(call.startswith("-m uv pip install --compile-bytecode --link-mode=copy") for call in calls)


def test_without_uv_pip_installs_it_first_and_then_runs_the_steps(tmp_path):
    done, calls = install(tmp_path, fail="uv-missing")
    assert done.returncode == 0
    assert calls[0] == "-m pip install --quiet uv==0.13.9" and calls[1].startswith("-m uv pip install")


def test_where_uv_cannot_be_installed_pip_runs_every_step_and_says_so(tmp_path):
    done, calls = install(tmp_path, fail="uv-missing uv-install")
    assert done.returncode == 0
    assert done.stderr.strip() == "install.sh: uv==0.13.9 could not be installed; pip installs everything"
    assert calls[1:] == ["-m pip install -r requirements.txt", "-m pip install --no-deps -r requirements-d2l.txt",
                         "-m pip install --no-deps -e ."]


def test_a_step_that_fails_under_uv_is_run_by_pip(tmp_path):
    done, calls = install(tmp_path, fail="uv-step")
    assert done.returncode == 0
    assert "install.sh: uv could not install -r requirements.txt; pip tries" in done.stderr
    assert calls[:2] == [calls[0], "-m pip install -r requirements.txt"] and calls[0].startswith("-m uv pip")


def test_the_installer_can_be_pip_alone_and_nothing_else(tmp_path):
    _, calls = install(tmp_path, installer="pip")
    assert calls == ["-m pip install -r requirements.txt", "-m pip install --no-deps -r requirements-d2l.txt",
                     "-m pip install --no-deps -e ."]
    wrong, _ = install(tmp_path, installer="conda")
    assert wrong.returncode == 2 and wrong.stderr.strip() == "install.sh: D2L_EXT_INSTALLER=conda: expected uv or pip"


def test_a_quiet_pip_still_gives_uv_its_settings(tmp_path):
    """make test-matrix builds Colab's environment with PIP_QUIET=1, under which `pip config list` prints nothing:
    uv then got one empty argument and failed every step (CI at 15:12, 2026-11-29; pip took over)."""
    import sys

    config = tmp_path / "pip.conf"
    config.write_text("[global]\nfind-links = /planted/wheels\n")
    environment = {**os.environ, "PIP_QUIET": "1", "PIP_CONFIG_FILE": str(config)}
    done = subprocess.run([sys.executable, str(REPO / "tools" / "envs" / "uv_options.py")], env=environment,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--find-links=/planted/wheels" in done.stdout.splitlines()
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    done = subprocess.run([sys.executable, str(REPO / "tools" / "envs" / "uv_options.py"), str(empty)],
                          capture_output=True, text=True, timeout=60)
    assert done.stdout == ""  # not an empty line, which would reach uv as an empty argument
