"""Keep every notebook's Colab badge and setup cell, and the README's badges, in line with one address.

The repository's address lives here, in REPOSITORY and BRANCH. A fork changes these two lines, runs
`make colab` (this script) and then `make outputs`; tests/test_colab_cells.py fails until it has.

Each notebook starts with two cells that this script writes:
- a Markdown cell with an "Open in Colab" badge pointing at the notebook in the repository;
- a setup cell that, on Colab only, clones the repository, installs d2l (without its pins) and d2l_ext,
  and what the notebook needs that Colab lacks (COLAB_LACKS, at requirements.txt's pins), moves into the
  notebook's folder, and prints one line if Colab's torch is older than the course is tested
  with or lacks an API a chapter calls (d2l_ext.compat); anywhere else it does nothing. nbval does not
  compare its output.
Notebook metadata asks Colab for a GPU runtime (a T4), since every chapter has cells that use one.

Why this module: nothing writes Colab's badge and setup cell from one repository address; nbformat edits them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

from tools import REPO as ROOT

REPOSITORY = "d2l-ext/gpus-in-pytorch"  # owner/name on GitHub: change this in a fork
BRANCH = "main"

NOTEBOOKS = ROOT / "notebooks"
BADGE_ID, SETUP_ID = "colab-badge", "colab-setup"
# what a notebook (by name: its solutions and editions too) needs that Colab's runtime lacks; its setup cell
# installs it at requirements.txt's pin, and make test-colab's environment holds it (tools/envs/colab.py)
COLAB_LACKS = {"13_serving": ["torchao"]}
README_START, README_END = "<!-- badges: written by tools/outputs/colab_cells.py -->", "<!-- /badges -->"


def d2l_requirement() -> str:
    """Return the pinned d2l requirement (from requirements-d2l.txt, its one place)."""
    lines = [ln.strip() for ln in (ROOT / "requirements-d2l.txt").read_text().splitlines()]
    return next(ln for ln in lines if ln and not ln.startswith("#"))


def pinned(name: str) -> str:
    """Return requirements.txt's line for the package ``name`` (e.g. torchao==0.18.0)."""
    lines = [ln.strip() for ln in (ROOT / "requirements.txt").read_text().splitlines()]
    return next(ln for ln in lines if ln.lower().startswith(name.lower() + "=="))


def colab_lacks(path: Path | None = None) -> list[str]:
    """Return the pinned packages that the notebook at ``path`` (without one: any notebook) installs on Colab."""
    names = COLAB_LACKS.get(path.stem, []) if path else sorted({n for ns in COLAB_LACKS.values() for n in ns})
    return [pinned(name) for name in names]


def colab_url(path: Path) -> str:
    return f"https://colab.research.google.com/github/{REPOSITORY}/blob/{BRANCH}/{path.relative_to(ROOT).as_posix()}"


def binder_url() -> str:
    return f"https://mybinder.org/v2/gh/{REPOSITORY}/{BRANCH}?urlpath=lab/tree/notebooks"


def badge_cell(path: Path) -> nbformat.NotebookNode:
    badge = f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab_url(path)})"
    cell = nbformat.v4.new_markdown_cell(badge)
    cell["id"] = BADGE_ID
    return cell


def setup_cell(path: Path) -> nbformat.NotebookNode:
    folder = path.parent.relative_to(ROOT).as_posix()
    source = "\n".join([
        # 88 columns at most (notebooks/ruff.toml); IPython joins a `!` line ending in a backslash to the next
        "# On Colab: fetch this course and install what Colab lacks.",
        "# Anywhere else this cell does nothing.",
        "import sys",
        "from pathlib import Path",
        "",
        'if "google.colab" in sys.modules:',
        f"    !git clone --quiet --depth 1 --branch {BRANCH} \\",
        f"        https://github.com/{REPOSITORY} /content/course",
        f"    %pip install --quiet --no-deps {d2l_requirement()} /content/course",
        *(f"    %pip install --quiet {pin}" for pin in colab_lacks(path)),  # no comment: %pip would read it
        f"    %cd /content/course/{folder}",
        "    # one line if Colab's torch is too old for a chapter",
        "    from d2l_ext.compat import torch_check",
        '    notebooks = Path("/content/course/notebooks")  # the clone\'s, not the package\'s',
        "    if (problem := torch_check(notebooks=notebooks)) is not None:",
        "        print(problem)",
    ])
    cell = nbformat.v4.new_code_cell(source)
    cell["id"] = SETUP_ID
    cell.metadata["tags"] = [SETUP_ID, "nbval-ignore-output"]
    return cell


def notebooks() -> list[Path]:
    return sorted(p for p in NOTEBOOKS.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


def updated(path: Path) -> nbformat.NotebookNode:
    """Return the notebook with fresh badge and setup cells at the top and Colab's GPU metadata."""
    notebook = nbformat.read(path, as_version=4)
    rest = [c for c in notebook.cells if c.get("id") not in (BADGE_ID, SETUP_ID)]
    old_setup = next((c for c in notebook.cells if c.get("id") == SETUP_ID), None)
    setup = setup_cell(path)
    if old_setup is not None and old_setup.source == setup.source:  # keep its stored run
        setup = old_setup
    elif old_setup is not None and not old_setup.get("outputs"):  # it printed nothing here (not on Colab):
        setup.execution_count = old_setup.execution_count  # its stored run stands for the new source too
    notebook.cells = [badge_cell(path), setup, *rest]
    notebook.metadata["accelerator"] = "GPU"
    notebook.metadata["colab"] = {"gpuType": "T4", "provenance": []}
    return notebook


def readme_badges() -> str:
    first = NOTEBOOKS / "01_devices.ipynb"
    return "\n".join([
        README_START,
        f"[![Binder](https://mybinder.org/badge_logo.svg)]({binder_url()})",
        f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab_url(first)})",
        README_END,
    ])


def updated_readme(text: str) -> str:
    start, end = text.index(README_START), text.index(README_END) + len(README_END)
    return text[:start] + readme_badges() + text[end:]


def main() -> int:
    changed = []
    for path in notebooks():
        notebook = updated(path)
        if notebook != nbformat.read(path, as_version=4):
            nbformat.write(notebook, path)
            changed.append(path)
    readme = ROOT / "README.md"
    if updated_readme(readme.read_text()) != readme.read_text():
        readme.write_text(updated_readme(readme.read_text()))
        changed.append(readme)
    for path in changed:
        print(f"updated {path.relative_to(ROOT)}")
    if any(p.suffix == ".ipynb" for p in changed):
        print("now run `make outputs` so that the stored runs include the setup cell")
    return 0


if __name__ == "__main__":
    sys.exit(main())
