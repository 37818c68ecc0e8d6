"""The pinned versions live in requirements.txt alone, and the running environment matches them."""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

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


def test_every_requirement_is_pinned_exactly():
    assert {"torch", "torchvision", "numpy", "jupyterlab", "nbval", "pytest", "pytest-xdist"} <= set(
        pins(REPO / "requirements.txt"))
    assert pins(REPO / "requirements-d2l.txt") == {"d2l": "1.0.3"}


def test_the_running_environment_matches_the_pins():
    # stored outputs are made and compared in this environment: it must be the pinned one
    expected = pins(REPO / "requirements.txt") | pins(REPO / "requirements-d2l.txt")
    installed = {name: version(name) for name in expected}
    assert installed == expected


def test_other_installers_use_requirements_txt_and_pin_nothing_else():
    makefile = (REPO / "Makefile").read_text()
    assert "pip install -r requirements.txt" in makefile
    assert "pip install --no-deps -r requirements-d2l.txt" in makefile
    conda = (REPO / "environment.yml").read_text()
    assert "- -r requirements.txt" in conda
    assert "pip install --no-deps -r requirements-d2l.txt" in conda  # told to the reader, in its comments
    assert not re.search(r"^\s*-\s*(?!python=)[\w.-]+\s*[=<>]=?", conda, flags=re.M), "a pin in environment.yml"
    binder = requirement_lines(REPO / "binder" / "requirements.txt")
    assert binder[0] == "-r ../requirements.txt"
    # Binder-only extras (its base environment's notebook must match our jupyterlab) are exact pins
    # and never override a pin of requirements.txt; tools/envs/binder.py checks the full build
    matches = [PIN.match(line) for line in binder[1:]]
    assert all(matches), f"Binder-only extras must be exact pins: {binder[1:]}"
    extras = {match[1].lower() for match in matches if match}
    assert not extras & set(pins(REPO / "requirements.txt"))
    post_build = (REPO / "binder" / "postBuild").read_text()
    assert "pip install --no-deps -r requirements-d2l.txt" in post_build
    assert "pip install --no-deps -e ." in post_build


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
