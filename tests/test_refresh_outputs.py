"""make outputs keeps a stored output only where the fresh run matches it and the cell's code is unchanged."""

from __future__ import annotations

import nbformat
from nbformat.v4 import new_code_cell, new_notebook, new_output

from tools.refresh_outputs import _keep_stored_within_tolerance, source_hashes


def notebook_printing(text: str, source: str = 'print(f"waited {100} ms")') -> nbformat.NotebookNode:
    cell = new_code_cell(source, outputs=[new_output("stream", name="stdout", text=text)])
    return new_notebook(cells=[cell])


def test_a_matching_output_of_unchanged_code_is_kept():
    stored = notebook_printing("waited 100 ms\n")
    fresh = notebook_printing("waited 103 ms\n")  # a duration moved: the harness sanitizes it, so it matches
    fresh.cells[0].id = stored.cells[0].id
    kept = _keep_stored_within_tolerance(fresh, [stored.cells[0].outputs], source_hashes(stored))
    assert kept == 1
    assert fresh.cells[0].outputs[0].text == "waited 100 ms\n"


def test_changed_code_takes_the_fresh_output_even_when_it_matches():
    stored = notebook_printing("waited 100 ms\n")
    fresh = notebook_printing("waited 200 ms\n", source='print(f"waited {200} ms")')
    fresh.cells[0].id = stored.cells[0].id
    kept = _keep_stored_within_tolerance(fresh, [stored.cells[0].outputs], source_hashes(stored))
    assert kept == 0
    assert fresh.cells[0].outputs[0].text == "waited 200 ms\n"


def test_without_a_record_a_match_is_kept_as_before():
    stored = notebook_printing("waited 100 ms\n")
    fresh = notebook_printing("waited 200 ms\n", source='print(f"waited {200} ms")')
    assert _keep_stored_within_tolerance(fresh, [stored.cells[0].outputs], None) == 1


def test_a_different_number_is_never_kept():
    stored = notebook_printing("loss 0.5000\n")
    fresh = notebook_printing("loss 0.6000\n")
    fresh.cells[0].id = stored.cells[0].id
    assert _keep_stored_within_tolerance(fresh, [stored.cells[0].outputs], source_hashes(stored)) == 0
