"""Chapter 11's exercise 5, run as its solution shows it: rank 0 killed instead of rank 1. The solution notebook
states the attempts and the bit-for-bit comparison; this test runs the launch and checks them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from d2l_ext import diagrams, launch

REPO = Path(__file__).resolve().parents[1]
SOLUTION = REPO / "notebooks" / "solutions" / "11_survive.ipynb"


def stated_lines() -> list[str]:
    """The ```text block of the solution's exercise 5: what the run prints, as the solution says."""
    cell = next(c for c in json.loads(SOLUTION.read_text())["cells"] if c["id"] == "sol-5")
    block = "".join(cell["source"]).split("```text\n", 1)[1].split("```", 1)[0]
    return block.strip().splitlines()


@pytest.mark.launches
def test_rank_0_killed_resumes_as_the_solution_says(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO / "notebooks")
    killed0 = "".join(launch.torchrun_nodes(
        "scripts/survive.py", nodes=1, nproc_per_node=2, restarts=1, echo=False, timeout=120,
        args=["--checkpoints", str(tmp_path / "killed0"), "--out", str(tmp_path / "killed0.pt"),
              "--kill", "0:7"]))
    launch.torchrun_nodes("scripts/survive.py", nodes=2, nproc_per_node=1, echo=False, timeout=120,
                          args=["--checkpoints", str(tmp_path / "nodes"), "--out", str(tmp_path / "nodes.pt")])
    printed = [f"attempt {a.number}: world size {a.world_size}, resumed from {a.resumed_from}, steps {a.steps}, "
               f"killed {a.killed}" for a in diagrams.read_attempts(killed0)]
    resumed, uninterrupted = torch.load(tmp_path / "killed0.pt"), torch.load(tmp_path / "nodes.pt")
    same = all(torch.equal(uninterrupted[name], resumed[name]) for name in uninterrupted)
    printed.append(f"bit for bit equal to 11.2's run: {same}")
    assert printed == stated_lines()
