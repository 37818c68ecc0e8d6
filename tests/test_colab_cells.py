"""Every notebook's Colab badge and setup cell, and the README's badges, follow tools/outputs/colab_cells.py."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager

from tools.outputs import colab_cells

FORK_HINT = ("out of date with tools/outputs/colab_cells.py: a fork sets REPOSITORY (and BRANCH) there, "
             "then runs `make colab` and `make outputs`")
NOTEBOOKS = colab_cells.notebooks()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[str(p.relative_to(colab_cells.NOTEBOOKS)) for p in NOTEBOOKS])
def test_notebook_has_current_badge_and_setup(path):
    notebook = nbformat.read(path, as_version=4)
    badge, setup = notebook.cells[0], notebook.cells[1]
    assert badge.get("id") == colab_cells.BADGE_ID and badge.source == colab_cells.badge_cell(path).source, FORK_HINT
    assert setup.get("id") == colab_cells.SETUP_ID and setup.source == colab_cells.setup_cell(path).source, FORK_HINT
    assert "nbval-ignore-output" in setup.metadata.get("tags", [])
    assert notebook.metadata.get("accelerator") == "GPU"
    assert notebook.metadata.get("colab", {}).get("gpuType") == "T4"
    # the badge points at this very file
    assert colab_cells.colab_url(path).endswith(path.relative_to(colab_cells.ROOT).as_posix())


def test_readme_badges_are_current():
    text = (colab_cells.ROOT / "README.md").read_text()
    assert colab_cells.updated_readme(text) == text, FORK_HINT
    assert colab_cells.REPOSITORY in text and colab_cells.binder_url() in text


def run_setup(path, on_colab: bool) -> list[str]:
    """Run a setup cell's code with its shell commands and magics recorded instead of run; return them."""
    calls: list[str] = []
    shell = types.SimpleNamespace(system=calls.append,
                                  run_line_magic=lambda name, line: calls.append(f"%{name} {line}"))
    modules = {name: module for name, module in sys.modules.items() if name != "google.colab"}
    if on_colab:
        modules["google.colab"] = types.ModuleType("google.colab")
    code = TransformerManager().transform_cell(colab_cells.setup_cell(path).source)
    assert "import sys\n" in code
    # the cell's own `import sys` is replaced by a module table in which google.colab is (or is not) loaded
    exec(code.replace("import sys\n", ""), {"get_ipython": lambda: shell,  # noqa: S102
                                            "sys": types.SimpleNamespace(modules=modules)})
    return calls


def test_setup_does_nothing_outside_colab():
    assert run_setup(colab_cells.NOTEBOOKS / "01_devices.ipynb", on_colab=False) == []


def test_setup_on_colab_clones_installs_and_moves_in():
    chapter = run_setup(colab_cells.NOTEBOOKS / "06_multi_gpu.ipynb", on_colab=True)
    assert chapter[0].startswith("git clone") and f"https://github.com/{colab_cells.REPOSITORY}" in chapter[0]
    assert chapter[1] == f"%pip install --quiet --no-deps {colab_cells.d2l_requirement()} /content/course"
    assert chapter[2] == "%cd /content/course/notebooks"
    solution = run_setup(colab_cells.NOTEBOOKS / "solutions" / "06_multi_gpu.ipynb", on_colab=True)
    assert solution[2] == "%cd /content/course/notebooks/solutions"
    assert colab_cells.d2l_requirement() == "d2l==1.0.3"


def test_setup_on_colab_says_when_colabs_torch_is_too_old(monkeypatch, capsys):
    from d2l_ext import compat

    asked = []
    monkeypatch.setattr(compat, "torch_check", lambda notebooks: asked.append(notebooks) or "torch 2.5.1 is older")
    run_setup(colab_cells.NOTEBOOKS / "04_async_and_gil.ipynb", on_colab=True)
    assert capsys.readouterr().out == "torch 2.5.1 is older\n"
    assert asked == [Path("/content/course/notebooks")]  # the clone's notebooks, not the installed package's
    monkeypatch.setattr(compat, "torch_check", lambda notebooks: None)
    run_setup(colab_cells.NOTEBOOKS / "04_async_and_gil.ipynb", on_colab=True)
    assert capsys.readouterr().out == ""  # nothing printed when the torch is new enough
