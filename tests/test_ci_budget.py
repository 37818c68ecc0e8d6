"""CI's budget (.ci/run, tools/deadline.py): make test always runs whole; past CI_BUDGET_MINUTES the optional passes
start nothing more, and the table and the last line name what did not run. Driven with a fake `make` on PATH and a
budget of seconds."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tools.deadline import DEADLINE_VARIABLE, deadline, not_run, past_deadline

REPO = Path(__file__).resolve().parents[1]
OPTIONAL = ["make test-matrix", "make check-tags --mode gpu", "make book", "make check-book"]

FAKE_MAKE = """#!/usr/bin/env bash
# a stand-in for make: logs its arguments; `make test` takes FAKE_TEST_SECONDS; FAKE_FAIL names a target that fails
echo "$*" >> "$FAKE_MAKE_LOG"
case "$1" in
  test) sleep "${FAKE_TEST_SECONDS:-0}" ;;
  test-matrix) [ -n "${FAKE_MATRIX_SAYS:-}" ] && echo "$FAKE_MATRIX_SAYS"
    sleep "${FAKE_BESIDE_SECONDS:-0}"; echo "test-matrix ended" >> "$FAKE_MAKE_LOG" ;;
esac
[ "$1" != "${FAKE_FAIL:-}" ]
"""


def ci_run(tmp_path: Path, budget: str, **fake: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run a copy of .ci/run in an empty tree, with the fake make; return the run and the make commands it ran."""
    (tmp_path / ".ci").mkdir()
    shutil.copy(REPO / ".ci" / "run", tmp_path / ".ci" / "run")
    bin_folder = tmp_path / "bin"
    bin_folder.mkdir()
    (bin_folder / "make").write_text(FAKE_MAKE)
    (bin_folder / "make").chmod(0o755)
    log = tmp_path / "make.log"
    env = {**os.environ, "PATH": f"{bin_folder}{os.pathsep}{os.environ['PATH']}", "CI_BUDGET_MINUTES": budget,
           "FAKE_MAKE_LOG": str(log), **fake}
    env.pop(DEADLINE_VARIABLE, None)
    done = subprocess.run(["bash", str(tmp_path / ".ci" / "run")], capture_output=True, text=True, env=env,
                          timeout=60)
    return done, log.read_text().splitlines() if log.exists() else []


def test_past_the_budget_make_test_runs_whole_and_the_optional_passes_do_not(tmp_path):
    done, made = ci_run(tmp_path, "0.01", FAKE_TEST_SECONDS="1.5")  # 0.6 s of budget, make test takes 1.5 s
    assert done.returncode == 0, done.stdout + done.stderr
    assert "dev" in made and "test" in made
    assert not any(m.split()[0] in {"check-tags", "book", "check-book", "test-matrix"} for m in made)
    lines = done.stdout.strip().splitlines()
    assert lines[-1] == "NOT RUN: " + "; ".join(OPTIONAL)
    for name in OPTIONAL:
        assert f"| {name} | " in done.stdout and f"| {name} |" in done.stdout
        assert any(line.startswith(f"| {name} |") and line.endswith("| NOT RUN |") for line in lines), name
    assert any(line.startswith("| make test |") and line.endswith("| passed |") for line in lines)


def test_within_the_budget_every_step_runs(tmp_path):
    done, made = ci_run(tmp_path, "60")
    assert done.returncode == 0, done.stdout + done.stderr
    assert [m.split()[0] for m in made if not m.startswith((".venv", "browser", "--"))][:2] == ["dev", "test"]
    for target in ("check-tags", "book", "check-book", "test-matrix"):
        assert any(m.split()[0] == target for m in made), target
    assert done.stdout.strip().splitlines()[-1] == "every step ran"


def test_a_pass_that_left_something_out_is_named_on_the_last_line(tmp_path):
    done, _ = ci_run(tmp_path, "60", FAKE_MATRIX_SAYS="NOT RUN: this run (CI's budget was spent)")
    assert done.returncode == 0
    assert done.stdout.strip().splitlines()[-1] == "NOT RUN: make test-matrix: this run (CI's budget was spent)"


def test_a_failed_step_fails_the_run_and_is_named(tmp_path):
    done, made = ci_run(tmp_path, "60", FAKE_FAIL="book", FAKE_BESIDE_SECONDS="20")
    assert done.returncode != 0
    assert not any(m.split()[0] == "check-book" for m in made)  # nothing starts after a failure
    assert "test-matrix ended" not in made  # the step beside it is stopped, not waited for
    lines = done.stdout.strip().splitlines()
    assert any(line.startswith("| make book |") and line.endswith("| FAILED |") for line in lines)
    assert any(line.startswith("| make test-matrix |") and line.endswith("| STOPPED |") for line in lines)
    assert lines[-1] == "FAILED: make book"


def test_the_matrix_runs_beside_the_tags_check_and_the_book_and_is_waited_for(tmp_path):
    done, made = ci_run(tmp_path, "60", FAKE_BESIDE_SECONDS="3")
    assert done.returncode == 0, done.stdout + done.stderr
    steps = [m.split()[0] for m in made if not m.startswith((".venv", "browser", "--"))]
    # after make test; the steps after it start while it runs (3 s), not after it ended. Which of two steps
    # started at the same moment logs first is up to the machine's load (CI's make test once saw check-tags first)
    assert steps.index("test") < steps.index("test-matrix"), made
    assert steps.index("test") < steps.index("check-tags") < steps.index("check-book"), made
    assert made[-1] == "test-matrix ended", made  # ended after them all: they did not wait for it
    lines = done.stdout.strip().splitlines()
    assert any(line.startswith("| make test-matrix |") and line.endswith("| passed |") for line in lines)
    assert lines[-1] == "every step ran"


def test_a_failure_beside_the_other_steps_fails_the_run_and_is_named(tmp_path):
    done, made = ci_run(tmp_path, "60", FAKE_FAIL="test-matrix", FAKE_BESIDE_SECONDS="1")
    assert done.returncode != 0
    assert any(m.split()[0] == "check-book" for m in made)  # the steps beside it went on
    lines = done.stdout.strip().splitlines()
    assert any(line.startswith("| make test-matrix |") and line.endswith("| FAILED |") for line in lines)
    assert lines[-1] == "FAILED: make test-matrix"


@pytest.mark.parametrize("budget", ["ten", "-5", "0", "", "1e3"])
def test_a_budget_that_is_not_minutes_stops_at_once_with_one_line(tmp_path, budget):
    done, made = ci_run(tmp_path, budget)
    if budget == "":  # unset in effect: the default of 60 minutes
        assert done.returncode == 0
        return
    assert done.returncode == 2
    assert made == []
    assert done.stderr.strip() == f"CI_BUDGET_MINUTES must be a positive number of minutes, not '{budget}'"


def test_the_deadline_as_the_passes_read_it():
    assert deadline({}) is None and not past_deadline({})
    assert past_deadline({DEADLINE_VARIABLE: "100"}, now=100.0)
    assert not past_deadline({DEADLINE_VARIABLE: "100"}, now=99.0)
    with pytest.raises(ValueError, match="seconds since the epoch"):
        deadline({DEADLINE_VARIABLE: "soon"})
    assert not_run("the second run").startswith("NOT RUN: the second run")
