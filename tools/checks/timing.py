"""Find compared outputs that depend on how busy the machine is: `make check-timing`.

A learner's laptop and a CI runner are never idle, and load stretches the intervals a clock measures, each by its
own amount. A compared cell that prints a fact derived from wall-clock readings (``t_a > t_b``, "within 1.5x", a
count of iterations that fit in a time) then prints something else, and the suite goes red on a correct checkout.
This runs the notebook suite with the clocks made adversarial and deterministic (tools/checks/pretend/sitecustomize.py,
mode ``slow-clock``; ``time.perf_counter``, ``time.monotonic`` and ``time.time`` share one timeline, read alike by
every thread). Each cell's time is cut in two at its *turn*, the end of the cell's first timed piece of work: its
first clock reading that comes at least 1 ms after the cell's first one and from another place in the notebook's
own code (another line of the cell, or of a function it defines) than the reading before it. So
``t0 = perf_counter(); a(); t1 = perf_counter(); b(); ...`` turns at ``t1``, ``measure(f)`` then ``measure(g)`` on
the next line at ``g``'s first reading, and an outer timer started just before either does not turn. Each
notebook runs twice: with the load early in each cell (the clocks run HIGH times fast before the turn and LOW
times fast after it; 3 and 1 unless ``--stretch`` says otherwise) and with the load late (LOW before, HIGH after).
A process a cell starts is a cell of its own (its script is the notebook's own code there), with the same load,
except torchrun's agent: its timers (rendezvous, heartbeats, exit barrier) read the real clock, and the workers it
starts or forks stretch theirs (tools/checks/pretend/sitecustomize.py, ``install_in_workers``).
So:

- a comparison of time before the turn with time after it flips in one of the runs whenever its true ratio is
  under HIGH/LOW (3x): "earlier < later" with the load early, "earlier > later" with it late. Two intervals are
  compared by what each has that the other lacks: ``t1 - t0`` against ``t3 - t2``, a part against the rest of
  a whole it is nested in, the non-overlapping ends of two interleaved intervals;
- an interval on one side of the turn is seen at LOW times and at HIGH times its length, one run each: a
  threshold within that range ("took less than 0.15 s", iterations that fit in a time) flips;
- what holds on any clock that only moves forward and never runs slow (a part is not longer than the whole, a
  sleep takes at least what it asked) holds in both runs, and is not listed.

Not tested, as such pieces are stretched alike: two intervals on the same side of the turn (the second and
third of a loop; two timings on one line, ``a, b = measure(f), measure(g)``; what is timed after readings that
took the turn, such as a warm-up a library timed), or intervals within 1 ms of the cell's first reading. A cell
listed prints a fact that load can change; a cell not listed may still print one.

Each compared cell whose output changed, or that raised, is listed with the run and the changed lines (after
tests/sanitize.cfg: a duration printed as such is allowed to vary). Cells tagged ``nbval-ignore-output`` are not
compared and cannot be listed; everything else is, ``device-dependent`` and ``build-dependent`` cells included
(they are compared on machines like this one). Without ``--twice`` each run is a pass of the suite under nbval in
fresh kernels (two passes).

With ``--twice`` (what CI runs) each notebook runs top to bottom twice in one kernel, the first run with the load
early, the second with it late, and both are compared with the stored outputs: the second also as a
learner meets it who re-runs the notebook in the kernel they have. One pass of the suite's cost does the
work of both tools; a cell is listed with the first run that changed it. A cell listed only for the second run
changed because of the late load or because it prints otherwise when re-run: `make check-timing` without
``--twice`` (one run, in a fresh kernel) tells which.

Exit status 1 if a cell is listed. Usage:
    python -m tools.checks.timing [--twice] [--stretch LOW HIGH] [--workers N] [notebooks ...]
"""

from __future__ import annotations

import argparse
import difflib
import json
import multiprocessing
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from tools import REPO
from tools.checks import PRETEND
from tools.checks.tags import (
    code_cells,
    failed_cells,
    shown,
)
from tools.outputs.run import TEST_ENVIRONMENT, notebooks, run_differences


def changed_lines(entries: list[dict]) -> list[str]:
    """Return the differing lines of each logged (stored, fresh) pair, as 'stored: ...' and 'fresh: ...'."""
    lines = []
    for entry in entries:
        stored, fresh = entry["stored"].splitlines(), entry["fresh"].splitlines()
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=stored, b=fresh).get_opcodes():
            if tag != "equal":
                lines += [f"stored: {line}" for line in stored[i1:i2]] + [f"fresh:  {line}" for line in fresh[j1:j2]]
    return lines


# the two runs: where in each cell the load is, and how a cell changed by it is labelled
LOADS = {"early": "load early in the cell", "late": "load late in the cell"}


def clock_environment(stretch: tuple[float, float], load: str) -> dict[str, str]:
    """Return the variables that make tools/checks/pretend/sitecustomize.py stretch the clocks with ``load``."""
    return {"D2L_EXT_PRETEND": "slow-clock", "D2L_EXT_SLOW_CLOCK_RANGE": f"{stretch[0]},{stretch[1]}",
            "D2L_EXT_SLOW_CLOCK_LOAD": load}


def timing_changes(targets: list[str], stretch: tuple[float, float] = (1.0, 3.0), workers: int = 2) -> list[str]:
    """Run the notebooks under nbval twice, the load early in each cell then late; return a block of text per
    compared cell that changed or raised (with the first run that changed it)."""
    listed: dict[tuple[str, int], str] = {}
    for load, what in LOADS.items():
        drift_log = Path(tempfile.mkstemp(prefix="check-timing-", suffix=".jsonl")[1])
        environment = {**TEST_ENVIRONMENT, **clock_environment(stretch, load), "D2L_EXT_DRIFT_LOG": str(drift_log)}
        failures = failed_cells(environment, targets, workers=workers)
        drifts: dict[tuple[str, int], list[dict]] = {}
        for line in drift_log.read_text(encoding="utf-8").splitlines():
            entry = json.loads(line)
            drifts.setdefault((shown(str(REPO / entry["notebook"])), entry["cell"]), []).append(entry)
        drift_log.unlink()
        for notebook, cells in failures.items():
            for index, failure in cells.items():
                if (shown(notebook), index) in listed:
                    continue  # listed with the first run
                cell = code_cells(Path(notebook))[index]
                first_line = cell.source.strip().splitlines()[0][:70] if cell.source.strip() else ""
                if failure["how"] == "exception":
                    details = [f"raised: {failure.get('error', '')}"]
                else:
                    details = (changed_lines(drifts.get((shown(notebook), index), []))
                               or ["(the outputs differ in kind)"])
                heading = f"{shown(notebook)} code cell {index} ({what}): {first_line}"
                listed[shown(notebook), index] = "\n".join([heading, *(f"    {line}" for line in details)])
    return [listed[key] for key in sorted(listed)]


def executed_cells(path: Path) -> int:
    """Return how many code cells a run of ``path`` executes (nbclient skips empty ones and skip-execution)."""
    return sum(1 for cell in code_cells(path) if cell.source.strip() and "skip-execution" not in
               cell.metadata.get("tags", []))


def twice_changes(targets: list[str], stretch: tuple[float, float] = (1.0, 3.0), workers: int = 2,
                  pinned: bool = True) -> list[str]:
    """Run each notebook twice in one kernel, the load early in each cell in the first run and late in the second;
    return a block of text per compared cell that changed in a run (listed with the first run that changed it).
    ``pinned``: with make test's numeric pins; else with the numeric settings of this process's environment (the
    matrix's run that carries this check sets its own)."""
    threads = os.environ.get("OMP_NUM_THREADS", "1")
    pins = TEST_ENVIRONMENT if pinned else {"PYTHONHASHSEED": "0", "OMP_NUM_THREADS": threads}
    environment = {**pins, **clock_environment(stretch, "early"),
                   "PYTHONPATH": os.pathsep.join([str(PRETEND), str(REPO)])}
    paths = notebooks(targets)
    # the kernel's cells numbered above this (its second Run All) take the late load
    environments = [{**environment, "D2L_EXT_SLOW_CLOCK_SWITCH_AFTER": str(executed_cells(path))} for path in paths]
    listed = []
    started = time.monotonic()

    def progress(path: Path, found: list) -> None:  # a line per notebook, so that a slow one shows in CI's log
        print(f"  {time.strftime('%H:%M:%S')} {shown(str(path))}: run twice, {len(found)} cell(s) listed "
              f"({time.monotonic() - started:.0f} s in)", flush=True)

    results: list[list] = []
    if workers == 1:  # in this process (a forked pool inside pytest can hang on the threads it copies)
        for path, env in zip(paths, environments, strict=True):
            results.append(run_differences(path, env, True))
            progress(path, results[-1])
    else:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(run_differences, path, env, True): path
                       for path, env in zip(paths, environments, strict=True)}
            for future in as_completed(futures):
                progress(futures[future], future.result())
            results = [future.result() for future in futures]  # in the order of paths
    for path, found in zip(paths, results, strict=True):
        first = {index for run, index, *_ in found if run == 1}
        for run, index, first_line, stored, fresh in found:
            if run == 2 and index in first:
                continue  # listed with its first run
            what = LOADS["early"] if run == 1 else f"second run in the same kernel, {LOADS['late']}"
            lines = changed_lines([{"stored": stored, "fresh": fresh}]) or ["(the outputs differ in kind)"]
            listed.append("\n".join([f"{shown(str(path))} code cell {index} ({what}): {first_line}",
                                     *(f"    {line}" for line in lines)]))
    return listed


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--stretch", type=float, nargs=2, default=(1.0, 3.0), metavar=("LOW", "HIGH"),
                        help="how many times fast the clocks run on the unloaded and the loaded side of each cell's "
                             "turn (default 1 3)")
    parser.add_argument("--workers", type=int, default=2, help="notebooks run at once (default 2)")
    parser.add_argument("--twice", action="store_true",
                        help="run each notebook twice in one kernel (the load early, then late), and compare both "
                             "runs (a learner re-running it)")
    parser.add_argument("--unpinned", action="store_true",
                        help="with --twice: keep this environment's MKL, oneDNN and ATen settings instead of make "
                             "test's pins (make test-matrix's second run)")
    parser.add_argument("targets", nargs="*", default=["notebooks"])
    args = parser.parse_args(argv)
    if args.unpinned and not args.twice:
        parser.error("--unpinned goes with --twice")
    low, high = args.stretch
    if not 1 <= low <= high:
        parser.error("--stretch: expected 1 <= LOW <= HIGH")
    started = time.perf_counter()
    if args.twice:
        listed = twice_changes(args.targets, (low, high), args.workers, pinned=not args.unpinned)
    else:
        listed = timing_changes(args.targets, (low, high), args.workers)
    print(f"clocks {high:g}x fast before each cell's turn and {low:g}x after (load early), then the reverse (late)"
          + (f", each of {len(notebooks(args.targets))} notebooks run twice in one kernel" if args.twice else "")
          + f": {len(listed)} compared "
          f"cell(s) changed, in {time.perf_counter() - started:.0f} s"
          + ("; print their timing-derived facts in a cell tagged nbval-ignore-output, or make them bounds that "
             "load cannot break (CONTRIBUTING.md: Outputs that hold on a busy machine)"
             + ("; a cell listed only for its second run may also print otherwise when re-run in the same kernel "
                "(as a learner re-running it): seed what it draws, do not depend on what later cells leave behind"
                if args.twice else "")
             + ":" if listed else ""))
    for block in listed:
        print(block)
    return 1 if listed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
