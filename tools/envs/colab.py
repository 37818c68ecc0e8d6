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
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tools import REPO
from tools.envs.colab_env import TARGET, colab_python
from tools.envs.matrix import find_python
from tools.envs.venvs import COLAB_VENV_GIB, free_gib

NUMERIC_ENV = {"PYTHONHASHSEED": "0", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2", "OMP_NUM_THREADS": "1"}


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


def build(python: str, venv: Path) -> Path:
    """Create ``venv`` with Colab's packages, d2l (--no-deps) and d2l_ext, unless it holds this list already."""
    recipe = b"".join(p.read_bytes() for p in (TARGET, REPO / "requirements-d2l.txt")) + python.encode()
    stamp, digest = venv / ".colab-installed", hashlib.sha256(recipe).hexdigest()
    bin_python = venv / "bin" / "python"
    if stamp.exists() and stamp.read_text() == digest and bin_python.exists():
        return bin_python
    shutil.rmtree(venv, ignore_errors=True)
    seed = [[str(bin_python), "-m", "tools.envs.venvs", step, str(REPO / ".venv")]
            for step in ("seed", "dedupe")] if (REPO / ".venv" / ".installed").exists() else [[], []]
    steps = [[python, "-m", "venv", str(venv)], seed[0],
             [str(bin_python), "-m", "pip", "install", "-q", "-r", str(TARGET)],
             [str(bin_python), "-m", "pip", "install", "-q", "--no-deps", "-r", str(REPO / "requirements-d2l.txt")],
             [str(bin_python), "-m", "pip", "install", "-q", "--no-deps", "-e", str(REPO)], seed[1]]
    for step in filter(None, steps):
        print("+ " + " ".join(step), flush=True)
        subprocess.run(step, check=True, cwd=REPO)
    stamp.write_text(digest)
    return bin_python


def main(argv: list[str]) -> int:
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
    command = [str(python), "-m", "pytest", "--nbval", "--nbval-current-env", "--nbval-sanitize-with",
               "tests/sanitize.cfg", "--nbval-cell-timeout", "300", "-n", "2", "--dist", "loadfile", "-q",
               *(pytest_args or ["notebooks", "tests/test_widgets.py"])]  # the sliders on ipywidgets 7
    print("+ " + " ".join(command), flush=True)
    code = subprocess.run(command, cwd=REPO, env={**os.environ, **NUMERIC_ENV}).returncode
    if args.remove_venv:
        shutil.rmtree(args.venv, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
