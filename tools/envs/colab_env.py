"""Write tests/envs/colab.txt, the environment `make test-colab` builds, from Colab's published package list.

Google publishes what Colab's GPU runtime holds in the public repository googlecolab/backend-info
(`pip-freeze.gpu.txt`, and the Python version in `os-info-gpu.txt`). When Colab moves, download the new
`pip-freeze.gpu.txt`, run this tool on it, run `make test-colab PYTHON=<that Python>`, and commit the list:

    python -m tools.envs.colab_env pip-freeze.gpu.txt --source "googlecolab/backend-info@a724079, 2026-08-19" \\
        --python 3.13.15

It keeps Colab's versions of the packages the notebooks import (and of the kernel that runs them), drops the
`+cu128`-style local version (PyPI's wheel of that version is what pip can install; without a GPU the CUDA
variant does not matter), and adds the test tools at the versions `requirements.txt` pins.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from tools import REPO

TARGET = REPO / "tests" / "envs" / "colab.txt"

# what the notebooks and d2l import at run time, and the kernel that runs them on Colab
COLAB_PACKAGES = ["torch", "torchvision", "numpy", "pandas", "scipy", "matplotlib", "matplotlib-inline",
                  "ipython", "ipykernel", "ipywidgets", "jupyter-client", "requests", "pillow", "psutil"]
# what runs the notebooks as tests: not on Colab, taken at requirements.txt's pins
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
        "# Colab's GPU runtime, as `make test-colab` rebuilds it (written by tools/envs/colab_env.py: do not edit)",
        f"# source: {source} (googlecolab/backend-info, pip-freeze.gpu.txt and os-info-gpu.txt)",
        f"# python: {python}",
        *(f"{name}=={colab[normalized(name)]}" for name in COLAB_PACKAGES),
        "# the test tools, at requirements.txt's pins (not on Colab)",
        *(f"{name}=={ours[normalized(name)]}" for name in TEST_TOOLS),
    ]
    return "\n".join(lines) + "\n"


def colab_python(text: str) -> str:
    """Return the Python version (e.g. 3.13.15) that tests/envs/colab.txt names."""
    match = re.search(r"^# python: (\d+\.\d+)(?:\.\d+)?", text, flags=re.M)
    if not match:
        raise ValueError("tests/envs/colab.txt names no Python ('# python: 3.13.15')")
    return match[1]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("freeze", type=Path, help="Colab's pip-freeze.gpu.txt")
    parser.add_argument("--source", required=True, help="where and when it was published (repository@commit, date)")
    parser.add_argument("--python", required=True, help="Colab's Python version, from os-info-gpu.txt")
    parser.add_argument("--output", type=Path, default=TARGET)
    args = parser.parse_args(argv)
    text = colab_requirements(args.freeze.read_text(), (REPO / "requirements.txt").read_text(), args.source,
                              args.python)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text)
    print(f"wrote {args.output}: Python {args.python}, " + ", ".join(text.splitlines()[3:7]) + ", ...")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
