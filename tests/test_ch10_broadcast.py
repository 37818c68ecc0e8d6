"""Chapter 10's exercise 4: broadcast added to scripts/collectives.py. The solution notebook makes the change in a
copy of the script (its cell ``sol-4-change``) and runs it in the launch it shares with exercise 2; this test makes
the same change with that cell's own code, runs it once, and checks what the notebook only prints."""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import nbformat
import pytest

from d2l_ext import commcost, launch

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "notebooks" / "scripts" / "collectives.py"
SOLUTION = ROOT / "notebooks" / "solutions" / "10_how_fast.ipynb"


def with_broadcast():
    """The solution's ``with_broadcast``, from its cell (so that the test runs the change the reader sees)."""
    cell = next(c for c in nbformat.read(SOLUTION, as_version=4).cells if c.get("id") == "sol-4-change")
    namespace = {"Path": Path}
    exec(compile(cell.source, "sol-4-change", "exec"), namespace)
    return namespace["with_broadcast"]


def test_the_change_adds_the_three_lines_and_nothing_else(tmp_path):
    changed = with_broadcast()(SCRIPT, tmp_path).read_text().splitlines()
    original = SCRIPT.read_text().splitlines()
    added = [line[2:] for line in difflib.ndiff(original, changed) if line.startswith("+ ")]
    assert added == ['    if collective == "broadcast":', "        tensor = torch.ones(numel, device=device)",
                     "        return lambda: dist.broadcast(tensor, src=0)"]
    assert len(changed) == len(original) + 3


@pytest.mark.launches
def test_the_changed_script_times_broadcast_and_its_fit_is_a_cost(tmp_path):
    script = with_broadcast()(SCRIPT, tmp_path)
    output = launch.torchrun(script, nproc=2, timeout=120, echo=False,
                             args=["--largest-mib", "1", "--cpu", "--collectives", "broadcast"])
    assert output.startswith("2 processes over gloo, each on cpu\n")
    points = [(int(s), float(t)) for s, t in re.findall(r"time broadcast (\d+) ([\d.]+)", output)]
    assert [s for s, _ in points] == [1024, 4096, 16384, 65536, 262144, 1048576]
    assert "time all_reduce" not in output  # --collectives: only the one asked for
    alpha, beta = commcost.fit_alpha_beta("broadcast", 2, *zip(*points, strict=True))
    assert alpha >= 0 and beta > 0
    assert "equal to dist.all_reduce on every rank: True" in output  # the rest of the script still runs
