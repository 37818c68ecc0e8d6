"""Measure this CPU's ridge point under each setting the notebooks are tested with: `make measure-ridges`.

Chapter 10 labels each operation of the course memory-bound or compute-bound, and that label is a compared
output: it must hold under every setting CI tries (tools/envs/matrix.py) and under load. A ridge measured in the
cell cannot give it: MKL's compatible code path makes matrix products three times slower here, and check-timing
stretches one of the two timings threefold. So the chapter compares each operation's intensity with the ridges
this script measured (``roofline.CPU_RIDGES``), and prints the ridge of its own run beside, uncompared.

Each setting runs ``roofline.measure_machine()`` three times in a fresh process; the median ridge is reported,
with the peak and bandwidth of that run. "busy" adds a process spinning on one core beside make test's pins.
``--record`` writes them to d2l_ext/cpu_ridges.json, which ``roofline.CPU_RIDGES`` reads.

Usage: python -m tools.envs.ridges [--record]

Why this module: it measures this CPU under the settings CI uses (tools/envs/matrix.py), which no benchmark
library knows.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from tools import REPO as ROOT
from tools.envs.matrix import COLAB_PYTHON, COMBINED, EACH  # the settings CI runs the notebooks with
from tools.outputs.run import TEST_ENVIRONMENT

PINS = {k: v for k, v in TEST_ENVIRONMENT.items() if k != "PYTHONHASHSEED"}  # make test's (settings.mk)
CHILD = ("import json\nfrom d2l_ext import roofline\n"
         "print(json.dumps([roofline.measure_machine() for _ in range(3)]))")


def settings() -> dict[str, dict[str, str]]:
    """Return each setting's name and environment: make test's pins, each numeric variant, the combined ones."""
    chosen = {"make test's pins": PINS}
    for variant in EACH + COMBINED:
        if variant.environment and not variant.pins:
            # the numeric settings only: this script runs them on this environment's Python and packages
            name = variant.name.split(" + torch")[0].split(" + clocks")[0]
            chosen[name.split("Python 3.10 + ")[-1].split(f"Python {COLAB_PYTHON} + ")[-1]] = variant.environment
    return chosen


def measure(environment: dict[str, str]) -> tuple[float, float, float]:
    """Return the median ridge of three measurements in a fresh process, with that run's peak and bandwidth."""
    keep = {k: v for k, v in os.environ.items() if k not in PINS}
    result = subprocess.run([sys.executable, "-c", CHILD], env={**keep, **environment, "PYTHONPATH": str(ROOT)},
                            capture_output=True, text=True, check=True)
    runs = sorted(json.loads(result.stdout), key=lambda run: run[0] / run[1])
    peak, bandwidth = runs[len(runs) // 2]
    return peak / bandwidth, peak, bandwidth


RECORD = ROOT / "d2l_ext" / "cpu_ridges.json"


def record(ridges: dict[str, float], path: Path = RECORD, today: str | None = None) -> None:
    """Write ``ridges`` to ``path`` (d2l_ext/cpu_ridges.json), keeping its "about" line, with today's date."""
    about = json.loads(path.read_text(encoding="utf-8")).get("about", "") if path.exists() else ""
    data = {"about": about, "measured": today or datetime.date.today().isoformat(), "ridges": ridges}
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--record", action="store_true", help="write the ridges to d2l_ext/cpu_ridges.json")
    args = parser.parse_args(argv)
    ridges = {}
    chosen = settings()
    spinner = None
    for name, environment in [*chosen.items(), ("make test's pins, one core busy", PINS)]:
        if name.endswith("busy"):
            spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            ridge, peak, bandwidth = measure(environment)
        finally:
            if spinner is not None:
                spinner.kill()
        ridges[name] = round(ridge, 1)
        print(f"{name:70} peak {peak / 1e9:6.1f} GFLOP/s  bandwidth {bandwidth / 1e9:5.1f} GB/s  "
              f"ridge {ridge:5.1f} FLOP/B", flush=True)
    print(f"\nridges from {min(ridges.values())} to {max(ridges.values())} FLOP/B "
          f"(median {statistics.median(ridges.values())})")
    if args.record:
        record(ridges)
        print(f"recorded in {RECORD.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
