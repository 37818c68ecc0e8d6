"""tools/envs/gpu.py (make check-gpu): what it does without a GPU, and how it classifies cells."""

from __future__ import annotations

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from tools.envs import gpu


def test_without_a_gpu_it_says_so_and_exits_0(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(gpu.d2l_ext, "num_gpus", lambda: 0)
    assert gpu.main(["--report", str(tmp_path / "report.md")]) == 0
    assert "no GPU on this machine" in capsys.readouterr().out
    assert not (tmp_path / "report.md").exists()


@pytest.mark.launches
def test_cells_are_classified_ran_skipped_failed_and_untagged_differences_found(tmp_path):
    stored = new_output("stream", name="stdout", text="2\n")
    cells = [
        new_code_cell("import d2l_ext", execution_count=1),
        new_code_cell("if d2l_ext.needs_gpus(1000):\n    print('ran')", execution_count=2),  # skips anywhere
        new_code_cell("if d2l_ext.needs_gpus(0):\n    print('ran')", execution_count=3),  # runs anywhere
        new_code_cell("print(1 + 2)", execution_count=4, outputs=[stored]),  # differs, untagged
        new_code_cell("1 / 0", execution_count=5),  # fails
    ]
    notebook = new_notebook(cells=cells)
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, tmp_path / "example.ipynb")
    result = gpu.run_notebook(tmp_path / "example.ipynb")
    by_index = {cell.index: cell for cell in result.cells}
    assert by_index[1].status == "skipped" and by_index[1].text.startswith(gpu.SKIP_PREFIX)
    assert by_index[2].status == "ran" and by_index[2].text == "ran"
    assert by_index[3].differs_untagged and by_index[3].status == "ran"
    assert by_index[4].status == "failed" and "ZeroDivisionError" in by_index[4].text
    assert 0 not in by_index  # an unguarded cell that ran as stored is not listed
    text = gpu.report([result], ["machine"], ["figure"])
    assert "| 1 | 1 | 1 | 1 |" in text  # guarded ran, skipped; failed cells; untagged differences
