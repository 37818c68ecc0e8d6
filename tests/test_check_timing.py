"""tools/check_timing.py: the stretched clock, and a planted timing-derived fact caught with its changed line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

from tools import check_timing
from tools.refresh_outputs import refresh

REPO = Path(__file__).resolve().parent.parent

CLOCK_PROBE = """
import json, time
stretches, readings = [], []
for _ in range(20):
    real, stretched = time.real_perf_counter(), time.perf_counter()
    time.sleep(0.002)
    stretches.append((time.perf_counter() - stretched) / (time.real_perf_counter() - real))
    readings += [time.perf_counter(), time.monotonic(), time.time()]
print(json.dumps({"stretches": stretches, "readings": readings}))
"""


def probe_clock(seed: int) -> dict:
    environment = {**os.environ, "D2L_EXT_PRETEND": "slow-clock", "D2L_EXT_SLOW_CLOCK_SEED": str(seed),
                   "PYTHONPATH": str(REPO / "tools" / "pretend")}
    done = subprocess.run([sys.executable, "-c", CLOCK_PROBE], env=environment, capture_output=True, text=True,
                          check=True, timeout=60)
    return json.loads(done.stdout)


def test_the_slow_clock_stretches_each_interval_between_1x_and_3x():
    probe = probe_clock(seed=0)
    # each interval holds a few readings, each stretched by its own factor: the whole lies between 1x and 3x
    assert all(0.99 <= s <= 3.01 for s in probe["stretches"]), probe["stretches"]  # the real readings bracket them
    assert max(probe["stretches"]) - min(probe["stretches"]) > 0.1  # not one factor for all: ratios move too
    for clock in range(3):  # perf_counter, monotonic and time each still only move forward
        readings = probe["readings"][clock::3]
        assert all(a <= b for a, b in zip(readings, readings[1:], strict=False))


def plant(path: Path, cells: list[tuple[str, list[str]]]) -> None:
    notebook = new_notebook(cells=[new_code_cell(source, metadata={"tags": tags}) for source, tags in cells])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, path)
    refresh(path)  # the stored outputs come from an honest run


# True when time is honest: five sleeps of 20 ms take about 100 ms, far below 150 ms even on a busy machine
TIMING_FACT = """import time
start = time.perf_counter()
for _ in range(5):
    time.sleep(0.02)
print("five short sleeps took less than 1.5x the time asked:", time.perf_counter() - start < 0.15)"""


def test_a_planted_timing_fact_is_listed_with_its_changed_line(tmp_path, capsys):
    planted = tmp_path / "planted.ipynb"
    plant(planted, [("print('the same on every machine:', sum(range(10)))", []),
                    ("# timings vary (output not compared by the tests)\n" + TIMING_FACT, ["nbval-ignore-output"]),
                    (TIMING_FACT, [])])
    assert "1.5x the time asked: True" in nbformat.read(planted, as_version=4).cells[2].outputs[0]["text"]
    # stretched at least 2x here, so that the planted fact flips whatever interval the random factors land on
    status = check_timing.main(["--stretch", "2", "3", "--workers", "1", str(tmp_path)])
    printed = capsys.readouterr().out
    assert status == 1, printed
    assert "1 compared cell(s) changed" in printed, printed
    assert "planted.ipynb code cell 2: import time" in printed
    assert "stored: five short sleeps took less than 1.5x the time asked: True" in printed
    assert "fresh:  five short sleeps took less than 1.5x the time asked: False" in printed


# prints 1 in a fresh kernel and 2 when the notebook runs again in the same one
RERUN_FACT = "runs = globals().get('runs', 0) + 1\nprint('runs of this cell in this kernel:', runs)"


def test_twice_lists_a_timing_fact_with_its_first_run_and_a_rerun_fact_with_its_second(tmp_path, capsys):
    planted = tmp_path / "planted.ipynb"
    plant(planted, [("print('the same on every machine:', sum(range(10)))", []), (TIMING_FACT, []),
                    (RERUN_FACT, [])])
    status = check_timing.main(["--twice", "--stretch", "2", "3", "--workers", "1", str(tmp_path)])
    printed = capsys.readouterr().out
    assert status == 1, printed
    assert "each of 1 notebooks run twice in one kernel: 2 compared cell(s) changed" in printed, printed
    assert "planted.ipynb code cell 1 (clocks stretched): import time" in printed  # listed once, with its first run
    assert "fresh:  five short sleeps took less than 1.5x the time asked: False" in printed
    assert "planted.ipynb code cell 2 (second run in the same kernel): runs = " in printed
    assert "stored: runs of this cell in this kernel: 1" in printed
    assert "fresh:  runs of this cell in this kernel: 2" in printed
    assert "code cell 0" not in printed
