"""make outputs keeps a stored output only where the fresh run prints the same, within the harness's tolerance."""

from __future__ import annotations

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from tools.outputs.refresh import _keep_stored_within_tolerance


def printing(text: str) -> nbformat.NotebookNode:
    output = new_output("stream", name="stdout", text=text)
    return new_notebook(cells=[new_code_cell("print(result)", outputs=[output])])


@pytest.mark.parametrize(("stored", "fresh", "kept"), [
    ("loss 0.50000\n", "loss 0.50001\n", True),    # round-off on another code path: keep, so the diff stays quiet
    ("loss 0.5000\n", "loss 0.6000\n", False),     # a real change
    ("waited 24.2 ms\n", "waited 20.1 ms\n", False),  # the harness sanitizes durations; refreshing must not
    ("waited 100 ms\n", "waited 200 ms\n", False),    # a label the code now prints otherwise
])
def test_a_stored_output_is_kept_only_when_the_fresh_one_prints_the_same(stored, fresh, kept):
    old, new = printing(stored), printing(fresh)
    assert _keep_stored_within_tolerance(new, [old.cells[0].outputs]) == int(kept)
    assert new.cells[0].outputs[0].text == (stored if kept else fresh)
