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


def notebook(*cells) -> nbformat.NotebookNode:
    nb = new_notebook(cells=list(cells))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def cell(source: str, stdout: str | None = None, run: bool = True, tags=()) -> nbformat.NotebookNode:
    c = new_code_cell(source, execution_count=1 if run else None)
    if stdout is not None:
        c.outputs = [new_output("stream", name="stdout", text=stdout)]
    if tags:
        c.metadata["tags"] = list(tags)
    return c


def run_nbval(folder: Path, *extra: str) -> tuple[int, str]:
    """Run strict nbval with the project's harness on ``folder``; return the exit code and the output."""
    command = [sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env",
               "--nbval-sanitize-with", str(SANITIZE), "-p", "tests.nbval_harness",
               "-p", "no:cacheprovider", "-rA", "--rootdir", str(folder), str(folder), *extra]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    return done.returncode, done.stdout + done.stderr


def outcomes(output: str) -> dict[str, str]:
    """Map each notebook name to FAILED/ERROR if any of its cells did, else PASSED (from -rA lines)."""
    result: dict[str, str] = {}
    for status, name in re.findall(r"^(PASSED|FAILED|ERROR) .*?([\w-]+\.ipynb)", output, flags=re.M):
        if result.get(name) in ("FAILED", "ERROR"):
            continue
        result[name] = status
    return result


@pytest.fixture(scope="module")
def harness_run(tmp_path_factory) -> tuple[int, str]:
    folder = tmp_path_factory.mktemp("notebooks")
    examples = {
        "good": notebook(cell("x = 6 * 7"), cell("print(x)", "42\n")),
        "mismatch": notebook(cell("print(6 * 7)", "43\n")),
        "raises": notebook(cell("1 / 0", None)),
        "unrun": notebook(cell("print(6 * 7)", None, run=False)),
        # stored on a GPU machine, run on a CPU one: the device suffix is sanitized away
        "sanitized": notebook(cell("print(\"tensor([1., 2.])\")", "tensor([1., 2.], device='cuda:0')\n")),
        # compared on a machine without an accelerator (this one), so a wrong stored output still fails
        "device_dependent": notebook(cell("print(0)", "1\n", tags=["device-dependent"])),
    }
    for name, nb in examples.items():
        nbformat.write(nb, folder / f"{name}.ipynb")
    return run_nbval(folder)


@pytest.mark.parametrize(
    ("name", "expected", "message"),
    [
        ("good", "PASSED", None),
        ("sanitized", "PASSED", None),
        ("mismatch", "FAILED", "Cell outputs differ"),
        ("raises", "FAILED", "Cell execution caused an exception"),
        ("unrun", "ERROR", "has no stored run"),
        ("device_dependent", "FAILED", "Cell outputs differ"),
    ],
)
def test_harness_outcome(harness_run, name, expected, message):
    code, output = harness_run
    assert code == 1, output[-3000:]
    assert outcomes(output).get(f"{name}.ipynb") == expected, output[-3000:]
    if message:
        assert message in output


def test_a_notebook_left_out_fails_the_run(tmp_path):
    nbformat.write(notebook(cell("print(1)", "1\n")), tmp_path / "kept.ipynb")
    nbformat.write(notebook(cell("print(2)", "2\n")), tmp_path / "left_out.ipynb")
    code, output = run_nbval(tmp_path, f"--ignore={tmp_path / 'left_out.ipynb'}")
    assert code == 1, output[-3000:]
    assert "left_out.ipynb is under a folder given to pytest but was not collected" in output
    code, output = run_nbval(tmp_path)  # and with nothing left out, the same folder passes
    assert code == 0, output[-3000:]
