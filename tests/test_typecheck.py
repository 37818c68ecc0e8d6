"""tools/checks/typecheck.py: a misspelt torch.cuda name in a GPU-only cell, which CI never runs, fails the check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tools.checks import typecheck

REPO = Path(__file__).resolve().parent.parent
# a chapter with a cell that runs only on a CUDA GPU and calls torch.cuda.synchronize()
CHAPTER = REPO / "notebooks" / "03_copying.ipynb"
CALL, TYPO = "torch.cuda.synchronize()", "torch.cuda.synchronise()"


def guarded_cell(notebook) -> int:
    """Return the index of the first cell that calls CALL behind d2l_ext.needs_gpus."""
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type == "code" and "d2l_ext.needs_gpus(" in cell.source and CALL in cell.source:
            return index
    raise AssertionError(f"{CHAPTER.name} has no guarded cell calling {CALL}")


@pytest.mark.launches
def test_a_misspelt_name_in_a_guarded_cell_fails_and_is_located(tmp_path):
    # the chapter as it is, and a copy with the misspelt call, checked in one basedpyright run (one start-up)
    notebook = nbformat.read(CHAPTER, as_version=4)
    index = guarded_cell(notebook)
    line = next(n for n, text in enumerate(notebook.cells[index].source.splitlines(), start=1) if CALL in text)
    unchanged, misspelt = tmp_path / "unchanged" / CHAPTER.name, tmp_path / "misspelt" / CHAPTER.name
    for copy, planted in ((unchanged, False), (misspelt, True)):
        copy.parent.mkdir()
        if planted:
            notebook.cells[index].source = notebook.cells[index].source.replace(CALL, TYPO, 1)
        nbformat.write(notebook, copy)
    result = subprocess.run([sys.executable, "-m", "tools.checks.typecheck", str(unchanged), str(misspelt),
                             "--out", str(tmp_path / "out")], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "2 notebooks and 0 Python files, 1 errors," in result.stdout, result.stdout
    assert f"{misspelt} cell {index} line {line}: error: " in result.stdout, result.stdout
    assert '"synchronise" is not a known attribute of module "torch.cuda"' in result.stdout
    assert str(unchanged) not in result.stdout  # the chapter as it is: no finding


def test_ipython_syntax_becomes_python_line_for_line():
    source = "import os\n!ls -l {os.sep}\nfiles = !ls\n%pip install --quiet x\nif True:\n    %cd /tmp\n"
    lines = typecheck.cell_to_python(source)
    assert lines == [
        "import os",
        "get_ipython().system('ls -l {os.sep}')",
        "files = get_ipython().getoutput('ls')",
        "get_ipython().run_line_magic('pip', 'install --quiet x')",
        "if True:",
        "    get_ipython().run_line_magic('cd', '/tmp')",
    ]
    timed = typecheck.cell_to_python("%%time\nx = 1\n")
    assert timed == ["pass  # %%time", "x = 1"]  # the body is Python and stays checked
    shell = typecheck.cell_to_python("%%bash\necho hi\n")
    assert shell[0].startswith("get_ipython().run_cell_magic('bash', '', ") and shell[1] == "# echo hi"
    # a shell line continued with a backslash, as the Colab setup cell writes it: IPython joins the lines
    continued = typecheck.cell_to_python("if True:\n    !git clone a \\\n        b c\n    x = 1\n")
    assert continued == ["if True:", "    get_ipython().system('git clone a  b c')", "", "    x = 1"]


def test_each_line_maps_back_to_its_cell(tmp_path):
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# title"),
        nbformat.v4.new_code_cell("x = 1\ny = 2"),
        nbformat.v4.new_markdown_cell("text"),
        nbformat.v4.new_code_cell("!echo\nz = x + y"),
    ])
    path = tmp_path / "n.ipynb"
    nbformat.write(notebook, path)
    converted = typecheck.convert(path)
    lines = converted.text.splitlines()
    assert {lines[i]: where for i, where in converted.lines.items()} == {
        "x = 1": (1, 1), "y = 2": (1, 2), "get_ipython().system('echo')": (3, 1), "z = x + y": (3, 2)}
