"""The notebook harness itself: each way a notebook can go wrong makes `pytest --nbval` fail.

Small notebooks are written to a temporary folder and run with the same options as `make test`
(strict --nbval, tests/sanitize.cfg, the tests.nbval_harness plugin), in a subprocess.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output
from nbval.plugin import get_sanitize_patterns

from tools.outputs.compare import (
    DEFAULT_TOLERANCE,
    NumberChecker,
    Tolerance,
    align_with_stored,
    outputs_match,
    tolerance_for,
    torch_build,
)

REPO = Path(__file__).resolve().parent.parent
SANITIZE = REPO / "tests" / "sanitize.cfg"

# Each rule of sanitize.cfg, by what it must make equal: (text on one machine, text on another).
SANITIZE_CASES = {
    "device suffix": ("tensor([1., 2.], device='cuda:0')", "tensor([1., 2.])"),
    "duration": ("took 12.5 ms, then 3 µs, then 4.1 μs and 2 s", "took 0.8 ms, then 95 µs, then 7 μs and 11 s"),
    "bandwidth": ("H2D 11.8 GB/s", "H2D 950 MiB/s"),
    "address": ("[<matplotlib.lines.Line2D at 0x7f3a2c1b9d90>]", "[<matplotlib.lines.Line2D at 0x7f11aa00cc10>]"),
    "svg date": ("<dc:date>2026-11-21T21:00:00</dc:date>", "<dc:date>2027-01-02T03:04:05</dc:date>"),
    "svg ids": ('<clipPath id="p1a2b3c4d5e"><use xlink:href="#m0a1b2c3d4e"/>',
                '<clipPath id="pffeeddccbb"><use xlink:href="#m99887766aa"/>'),
}
# ... and what they must leave alone: a checkable fact is not a duration or a device to hide.
UNTOUCHED = ["tensor([1., 2.], device='cpu')", "6.0", "(True, 6.0)", "2 GPUs", "cuda:1", "shape (2, 3)"]


def sanitize(text: str, rules: list[tuple[str, str]]) -> str:
    for regex, replace in rules:  # as nbval applies them: in file order, with re.sub
        text = re.sub(regex, replace, text)
    return text


def check_sanitize_rules(path: Path) -> None:
    """Raise AssertionError unless the file holds exactly one working rule per case above."""
    rules = get_sanitize_patterns(path.read_text(encoding="utf-8"))
    assert len(rules) == len(SANITIZE_CASES), f"{path} holds {len(rules)} rules, expected {len(SANITIZE_CASES)}"
    for name, (one, other) in SANITIZE_CASES.items():
        assert sanitize(one, rules) == sanitize(other, rules), f"the {name} rule no longer works"
    for text in UNTOUCHED:
        assert sanitize(text, rules) == text, f"a rule changes {text!r}"


def test_sanitize_file_has_every_rule():
    check_sanitize_rules(SANITIZE)


def test_losing_a_rule_is_caught(tmp_path):
    # The classic accident: an editor trims the trailing space of "replace: ", and nbval drops the rule.
    trimmed = tmp_path / "sanitize.cfg"
    trimmed.write_text(re.sub(r"^replace: $", "replace:", SANITIZE.read_text(), flags=re.M))
    with pytest.raises(AssertionError, match="rules"):
        check_sanitize_rules(trimmed)


# ---------------------------------------------------------------------------------------------------
# Running nbval on small notebooks


def notebook(*cells, build: str | None = None) -> nbformat.NotebookNode:
    nb = new_notebook(cells=list(cells))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    if build:
        nb.metadata["d2l_ext"] = {"torch_build": build}
    return nb


def cell(source: str, stdout: str | None = None, run: bool = True, tags=(), tolerance=None) -> nbformat.NotebookNode:
    c = new_code_cell(source, execution_count=1 if run else None)
    if stdout is not None:
        c.outputs = [new_output("stream", name="stdout", text=stdout)]
    if tags:
        c.metadata["tags"] = list(tags)
    if tolerance is not None:
        c.metadata["tolerance"] = tolerance
    return c


# ---------------------------------------------------------------------------------------------------
# Numbers within a tolerance, everything else exactly

CPU_DRIFT = "bfloat16 autocast rounds differently on CPUs with AMX"


@pytest.mark.parametrize(
    ("stored", "fresh", "same"),
    [
        ("final training loss 0.4892", "final training loss 0.4892", True),
        ("final training loss 0.4892", "final training loss 0.4903", True),  # measured between two CPUs: 0.22%
        ("tensor([0.1234, 2.0000])", "tensor([0.1235, 2.0000])", True),
        ("max difference 3e-08", "max difference 0.0", True),  # round-off near zero: atol
        ("final training loss 0.4892", "final training loss 0.5153", False),  # another batch size: 5%
        ("held-out accuracy 0.88", "held-out accuracy 0.89", False),  # 1.1%: a cell must ask for that
        ("final training loss 0.4892", "final testing loss 0.4892", False),  # a word
        ("same result: True", "same result: False", False),
        ("on cuda:0", "on cuda:1", False),  # digits that belong to a name are not numbers
        ("dtype torch.float32", "dtype torch.float16", False),
        ("layer fc1", "layer fc2", False),
        ("at 0x7f00", "at 0x7f01", False),
        ("64 steps of 64 samples", "64 steps of 65 samples", False),  # integers: exact
        ("torch.Size([64, 10])", "torch.Size([64, 11])", False),
        ("a\nb", "a\n  \nb", False),  # whitespace, blank lines included, is text
    ],
)
def test_numbers_match_within_the_tolerance_and_text_exactly(stored, fresh, same):
    assert NumberChecker(DEFAULT_TOLERANCE).match(stored, fresh) is same


def test_a_cell_widens_the_tolerance_only_with_a_reason():
    assert tolerance_for({}) == DEFAULT_TOLERANCE
    assert tolerance_for({"tolerance": {"rtol": 0.03, "reason": CPU_DRIFT}}) == Tolerance(0.03, DEFAULT_TOLERANCE.atol)
    for bad in [{"rtol": 0.03}, {"rtol": 0.03, "reason": " "}, {"rtol": 0.03, "reason": "two\nlines"},
                {"rtol": 0.03, "reason": CPU_DRIFT, "rtl": 1}, {"rtol": 0, "reason": "tighter than the default"}]:
        with pytest.raises(ValueError):
            tolerance_for({"tolerance": bad})


def test_alignment_keeps_the_stored_text_only_where_it_matches():
    stored = [new_output("stream", name="stdout", text="loss 0.4892\n"),
              new_output("execute_result", data={"text/plain": "tensor(0.5000)"}, execution_count=1)]
    fresh = [new_output("stream", name="stdout", text="loss 0.4897\n"),
             new_output("execute_result", data={"text/plain": "tensor(0.6000)"}, execution_count=1)]
    aligned = align_with_stored(fresh, stored, lambda text: text, DEFAULT_TOLERANCE)
    assert aligned[0]["text"] == "loss 0.4892\n"  # within the tolerance: nbval then sees equal texts
    assert aligned[1]["data"]["text/plain"] == "tensor(0.6000)"  # beyond it: left for nbval to report
    assert fresh[0]["text"] == "loss 0.4897\n"  # the fresh outputs themselves are not changed


def run_nbval(folder: Path, *extra: str) -> tuple[int, str]:
    """Run strict nbval with the project's harness on ``folder``; return the exit code and the output."""
    command = [sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env",
               "--nbval-sanitize-with", str(SANITIZE), "-p", "tests.nbval_harness",
               "-p", "no:cacheprovider", "-rA", "--rootdir", str(folder), str(folder), *extra]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    return done.returncode, done.stdout + done.stderr


def outcomes(output: str) -> dict[str, str]:
    """Map each 'notebook.ipynb::Cell N' to PASSED, FAILED or ERROR (from -rA lines)."""
    return {f"{name}::Cell {index}": status for status, name, index in
            re.findall(r"^(PASSED|FAILED|ERROR) .*?([\w-]+\.ipynb)::Cell (\d+)", output, flags=re.M)}


# One case a cell, in one notebook (one kernel: the run stays fast): (name, cell, expected outcome, message)
CELL_CASES = [
    ("good", cell("x = 6 * 7\nprint(x)", "42\n"), "PASSED", None),
    ("mismatch", cell("print(6 * 7)", "43\n"), "FAILED", "Cell outputs differ"),
    ("raises", cell("1 / 0", None), "FAILED", "Cell execution caused an exception"),
    ("unrun", cell("print(6 * 7)", None, run=False), "ERROR", "has no stored run"),
    # stored on a GPU machine, run on a CPU one: the device suffix is sanitized away
    ("sanitized", cell("print(\"tensor([1., 2.])\")", "tensor([1., 2.], device='cuda:0')\n"), "PASSED", None),
    # compared on a machine without an accelerator (this one), so a wrong stored output still fails
    ("device_dependent", cell("print(0)", "1\n", tags=["device-dependent"]), "FAILED", "Cell outputs differ"),
    # numbers: a drift within the tolerance passes, beyond it fails; a word or an integer never drifts
    ("drift_within", cell("print('loss', 0.4897)", "loss 0.4892\n"), "PASSED", None),
    ("drift_beyond", cell("print('loss', 0.5153)", "loss 0.4892\n"), "FAILED", "Cell outputs differ"),
    ("changed_word", cell("print('lost', 0.4892)", "loss 0.4892\n"), "FAILED", "Cell outputs differ"),
    ("changed_name", cell("print('cuda:1 float16 fc2 65')", "cuda:0 float32 fc1 64\n"), "FAILED",
     "Cell outputs differ"),
    ("changed_seed", cell("import random; random.seed(1); print(round(random.random(), 4))", "0.8444\n"),
     "FAILED", "Cell outputs differ"),  # what seed 0 prints
    # a cell that asks for more, with a reason; and one that asks without saying why
    ("widened", cell("print('accuracy', 0.89)", "accuracy 0.88\n", tolerance={"rtol": 0.03, "reason": CPU_DRIFT}),
     "PASSED", None),
    ("widened_without_reason", cell("print('accuracy', 0.89)", "accuracy 0.88\n", tolerance={"rtol": 0.03}),
     "ERROR", "needs a one-line 'reason'"),
    # tagged exact (a simulation on a virtual clock): the drift that passes above fails here; equal text passes
    ("exact_drift", cell("print('loss', 0.4897)", "loss 0.4892\n", tags=["exact"]), "FAILED", "Cell outputs differ"),
    ("exact_same", cell("print('took', 19.0, 'simulated ms')", "took 19.0 simulated ms\n", tags=["exact"]),
     "PASSED", None),
]
# Cases that need a notebook of their own: build-dependent cells are compared under the torch build that stored
# them (the notebook's metadata), not under another one; and a notebook left out of the run must fail it.
NOTEBOOK_CASES = [
    ("build_same", notebook(cell("print('CUDA 13.0')", "CUDA None\n", tags=["build-dependent"]), build=torch_build()),
     "FAILED", "Cell outputs differ"),
    ("build_other", notebook(cell("print('CUDA 13.0')", "CUDA None\n", tags=["build-dependent"]), build="2.14.1"),
     "PASSED", None),
]


@pytest.fixture(scope="module")
def harness_run(tmp_path_factory) -> tuple[int, str]:
    folder = tmp_path_factory.mktemp("notebooks")
    nbformat.write(notebook(*(c for _, c, _, _ in CELL_CASES)), folder / "cells.ipynb")
    for name, nb, _, _ in NOTEBOOK_CASES:
        nbformat.write(nb, folder / f"{name}.ipynb")
    nbformat.write(notebook(cell("print(2)", "2\n")), folder / "left_out.ipynb")
    return run_nbval(folder, f"--ignore={folder / 'left_out.ipynb'}")


CASES = [(name, f"cells.ipynb::Cell {index}", expected, message)
         for index, (name, _, expected, message) in enumerate(CELL_CASES)]
CASES += [(name, f"{name}.ipynb::Cell 0", expected, message) for name, _, expected, message in NOTEBOOK_CASES]


@pytest.mark.launches
@pytest.mark.parametrize(("name", "item", "expected", "message"), CASES, ids=[case[0] for case in CASES])
def test_harness_outcome(harness_run, name, item, expected, message):
    code, output = harness_run
    assert code == 1, output[-3000:]
    assert outcomes(output).get(item) == expected, output[-3000:]
    if message:
        assert message in output


@pytest.mark.launches
def test_a_notebook_left_out_fails_the_run(harness_run):
    code, output = harness_run
    assert code == 1
    not_collected = re.findall(r"(\S+\.ipynb) is under a folder given to pytest but was not collected", output)
    assert {Path(path).name for path in not_collected} == {"left_out.ipynb"}, output[-3000:]  # and no other


def test_outputs_match_as_nbval_compares():
    stored = [new_output("stream", name="stdout", text="on the device:\n"),
              new_output("stream", name="stdout", text="loss 0.4892\n")]
    in_one_piece = [new_output("stream", name="stdout", text="on the device:\nloss 0.4897\n")]
    assert outputs_match(in_one_piece, stored, lambda text: text, DEFAULT_TOLERANCE)  # pieces and drift
    other = [new_output("stream", name="stdout", text="on the host:\nloss 0.4892\n")]
    assert not outputs_match(other, stored, lambda text: text, DEFAULT_TOLERANCE)
    assert not outputs_match([], stored, lambda text: text, DEFAULT_TOLERANCE)


def test_outputs_match_leaves_raster_images_out_as_nbval_does():
    figure = {"text/plain": "<Figure size 900x500 with 2 Axes>", "image/png": "iVBORw0KGgoAAAA"}
    other_pixels = {**figure, "image/png": "iVBORw0KGgoBBBB"}
    stored = [new_output("display_data", data=figure)]
    assert outputs_match([new_output("display_data", data=other_pixels)], stored, str, DEFAULT_TOLERANCE)
    other_size = {**figure, "text/plain": "<Figure size 640x480 with 1 Axes>"}
    assert not outputs_match([new_output("display_data", data=other_size)], stored, str, DEFAULT_TOLERANCE)
