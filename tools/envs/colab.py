"""`make test-colab`: the notebook suite on Colab's stack (tests/envs/colab.txt) and Colab's Python.

Colab is where most learners meet a GPU, and its packages are not ours: another torch, an old ipykernel and
ipywidgets 7. This builds that environment in .venv-colab with the Python given (it must be the version
colab.txt names: no other is taken in its place) and runs every notebook under nbval, as `make notebooks`
does, and the sliders' tests (tests/test_widgets.py: Colab's ipywidgets is 7, make test's 8). Outputs tagged
`build-dependent` are compared only under the torch build that made them (the harness
reads it from the notebook's metadata), so they run here but are not compared.

Usage: python -m tools.envs.colab --python PYTHON [--venv .venv-colab] [--remove-venv] [pytest arguments ...]

CI does not call it: the matrix's Python 3.13 run (tools/envs/matrix.py) builds this environment with build()
and runs its own pass there.

It also writes tests/envs/colab.txt, from Colab's published package list (`freeze`).

Google publishes what Colab's GPU runtime holds in the public repository googlecolab/backend-info
(`pip-freeze.gpu.txt`, and the Python version in `os-info-gpu.txt`). When Colab moves, download the new
`pip-freeze.gpu.txt`, run this tool on it, run `make test-colab PYTHON=<that Python>`, and commit the list:

    python -m tools.envs.colab freeze pip-freeze.gpu.txt --source "googlecolab/backend-info@a724079, 2026-08-19" \\
        --python 3.13.15

It keeps Colab's versions of the packages the notebooks import (and of the kernel that runs them), drops the
`+cu128`-style local version (PyPI's wheel of that version is what pip can install; without a GPU the CUDA
variant does not matter), and adds the test tools at the versions `requirements-dev.txt` pins.

Why this module: pip-tools and uv resolve versions, but none picks Colab's versions of what the notebooks import.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tools import REPO
from tools.envs.venvs import COLAB_VENV_GIB, find_python, free_gib
from tools.outputs.colab_cells import colab_lacks  # what the setup cells install on Colab (torchao, ...)
from tools.outputs.run import NBVAL_OPTIONS, TEST_ENVIRONMENT  # as make test runs the notebooks

FREEZE_HELP = "Write tests/envs/colab.txt from Colab's pip-freeze.gpu.txt"
TARGET = REPO / "tests" / "envs" / "colab.txt"
INSTALL = REPO / "tools" / "envs" / "install.sh"  # the course's one install recipe

# what the notebooks and d2l import at run time, and the kernel that runs them on Colab
COLAB_PACKAGES = ["torch", "torchvision", "numpy", "pandas", "scipy", "matplotlib", "matplotlib-inline",
                  "ipython", "ipykernel", "ipywidgets", "jupyter-client", "requests", "pillow", "psutil",
                  "numba", "numba-cuda"]  # numba: chapter 12's CUDA simulator (numba-cuda holds it on Colab)
# what runs the notebooks as tests: not on Colab, taken at requirements-dev.txt's pins
TEST_TOOLS = ["nbval", "pytest", "pytest-xdist", "pytest-doctestplus"]


def normalized(name: str) -> str:
    """Return a package name as pip compares it (PEP 503: case and -_. do not matter)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(text: str) -> dict[str, str]:
    """Return {normalized name: version} for the ``name==version`` lines of a pip freeze or requirements file."""
    found = {}
    for line in text.splitlines():
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)", line.strip())
        if match:
            found[normalized(match[1])] = match[2].split("+")[0]  # 2.11.0+cu128 -> 2.11.0
    return found


def colab_requirements(freeze: str, requirements: str, source: str, python: str) -> str:
    """Return the text of tests/envs/colab.txt from Colab's pip freeze and this repository's requirements."""
    colab, ours = pins(freeze), pins(requirements)
    missing = [name for name in COLAB_PACKAGES if normalized(name) not in colab]
    if missing:
        raise ValueError(f"Colab's list has no {', '.join(missing)}: is it a pip-freeze.gpu.txt?")
    lines = [
        "# Colab's GPU runtime for `make test-colab` (written by python -m tools.envs.colab freeze: do not edit)",
        f"# source: {source} (googlecolab/backend-info, pip-freeze.gpu.txt and os-info-gpu.txt)",
        f"# python: {python}",
        *(f"{name}=={colab[normalized(name)]}" for name in COLAB_PACKAGES),
        "# the test tools, at requirements-dev.txt's pins (not on Colab)",
        *(f"{name}=={ours[normalized(name)]}" for name in TEST_TOOLS),
    ]
    return "\n".join(lines) + "\n"


def colab_python(text: str) -> str:
    """Return the Python version (e.g. 3.13.15) that tests/envs/colab.txt names."""
    match = re.search(r"^# python: (\d+\.\d+)(?:\.\d+)?", text, flags=re.M)
    if not match:
        raise ValueError("tests/envs/colab.txt names no Python ('# python: 3.13.15')")
    return match[1]


def interpreter(name: str, wanted: str) -> str:
    """Return the path of the Python ``name`` (on PATH, a path, or under pyenv); exit with one line if it is not
    version ``wanted`` (e.g. 3.13) or does not run."""
    path = name if os.sep in name else find_python(name)
    version = None
    if path is not None:
        done = subprocess.run([path, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                              capture_output=True, text=True)
        version = done.stdout.strip() if done.returncode == 0 else None
    if version != wanted:
        found = f"{name} is Python {version}" if version else f"{name} was not found"
        sys.exit(f"make test-colab needs Colab's Python {wanted} (tests/envs/colab.txt); {found}. Install Python "
                 f"{wanted} (e.g. `pyenv install {wanted}`) and run: make test-colab PYTHON=python{wanted}")
    assert path is not None
    return path


def stack() -> str:
    """Return what .venv-colab installs: Colab's list (colab.txt) and what the notebooks' setup cells add on
    Colab, at requirements.txt's pins (tools/outputs/colab_cells.py's COLAB_LACKS: torchao)."""
    return TARGET.read_text() + "".join(f"{pin}\n" for pin in colab_lacks())


def build(python: str, venv: Path) -> Path:
    """Create ``venv`` with stack() (Colab's packages and what the setup cells add there), d2l (--no-deps) and
    d2l_ext, unless it holds this list already."""
    recipe = stack().encode() + (REPO / "requirements-d2l.txt").read_bytes() + python.encode()
    stamp, digest = venv / ".colab-installed", hashlib.sha256(recipe).hexdigest()
    bin_python = venv / "bin" / "python"
    if stamp.exists() and stamp.read_text() == digest and bin_python.exists():
        return bin_python
    shutil.rmtree(venv, ignore_errors=True)
    seed = [[str(bin_python), "-m", "tools.envs.venvs", step, str(REPO / ".venv")]
            for step in ("seed", "dedupe")] if (REPO / ".venv" / ".installed").exists() else [[], []]
    # the course's one install recipe, with Colab's stack in place of requirements.txt
    with tempfile.TemporaryDirectory() as folder:
        requirements = Path(folder) / "colab-requirements.txt"
        requirements.write_text(stack())
        steps = [[python, "-m", "venv", str(venv)], seed[0],
                 ["bash", str(INSTALL), str(bin_python), "--requirements", str(requirements)], seed[1]]
        for step in filter(None, steps):
            print("+ " + " ".join(step), flush=True)
            subprocess.run(step, check=True, cwd=REPO, env={**os.environ, "PIP_QUIET": "1"})
    stamp.write_text(digest)
    return bin_python


def freeze_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.envs.colab freeze", description=FREEZE_HELP)
    parser.add_argument("freeze", type=Path, help="Colab's pip-freeze.gpu.txt")
    parser.add_argument("--source", required=True, help="where and when it was published (repository@commit, date)")
    parser.add_argument("--python", required=True, help="Colab's Python version, from os-info-gpu.txt")
    parser.add_argument("--output", type=Path, default=TARGET)
    args = parser.parse_args(argv)
    text = colab_requirements(args.freeze.read_text(), (REPO / "requirements-dev.txt").read_text(), args.source,
                              args.python)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(f"wrote {args.output}: Python {args.python}, " + ", ".join(text.splitlines()[3:7]) + ", ...")
    return 0



def main(argv: list[str]) -> int:
    if argv[:1] == ["freeze"]:
        return freeze_main(argv[1:])
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--python", required=True, help="Colab's Python version, e.g. python3.13 or a path")
    parser.add_argument("--venv", type=Path, default=REPO / ".venv-colab")
    parser.add_argument("--remove-venv", action="store_true", help="delete the venv after the run (another torch)")
    args, pytest_args = parser.parse_known_args(argv)
    wanted = colab_python(TARGET.read_text())
    python_path = interpreter(args.python, wanted)
    free = free_gib(REPO)
    if not (args.venv / ".colab-installed").exists() and free < COLAB_VENV_GIB:
        sys.exit(f"make test-colab NOT RUN: {free:.1f} GiB free, and {args.venv.name} (another torch) needs "
                 f"about {COLAB_VENV_GIB:.0f} GiB: free some disk and run it again")
    python = build(python_path, args.venv)
    command = [str(python), "-m", "pytest", *NBVAL_OPTIONS, "-n", "2", "--dist", "loadfile", "-q",
               *(pytest_args or ["notebooks", "tests/test_widgets.py"])]  # the sliders on ipywidgets 7
    print("+ " + " ".join(command), flush=True)
    code = subprocess.run(command, cwd=REPO, env={**os.environ, **TEST_ENVIRONMENT}).returncode
    if args.remove_venv:
        shutil.rmtree(args.venv, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
