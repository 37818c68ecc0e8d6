"""Find compared outputs that depend on how busy the machine is: `make check-timing`.

A learner's laptop and a CI runner are never idle, and load stretches every interval a clock measures, each by
its own amount. A compared cell that prints a fact derived from wall-clock readings (``t_a > t_b``, "within
1.5x", a count of iterations that fit in a time) then prints something else, and the suite goes red on a
correct checkout. This runs the notebook suite with the clocks made unreliable (tools/pretend/sitecustomize.py,
mode ``slow-clock``: every interval between two readings of ``time.perf_counter``, ``time.monotonic`` or
``time.time`` is reported stretched by a seeded random factor between 1x and 3x, in the kernels and in every
process they start) and lists every compared cell whose output changed, or that raised, with the changed lines
(after tests/sanitize.cfg: a duration printed as such is allowed to vary). Cells tagged ``nbval-ignore-output``
are not compared and cannot be listed; everything else is, ``device-dependent`` and ``build-dependent`` cells
included (they are compared on machines like this one).

With ``--twice`` (what CI runs) each notebook runs top to bottom twice in one kernel, both runs with stretched
clocks, and both are compared with the stored outputs: the first as above, the second as `make run-twice` does (a
learner re-running the notebook in the kernel they have). One pass of the suite's cost does the work of both
tools; a cell is listed with the run that changed it.

Exit status 1 if a cell is listed. Usage:
    python tools/check_timing.py [--twice] [--seed N] [--stretch LOW HIGH] [--workers N] [notebooks ...]
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
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tools.check_tags import (  # noqa: E402  (the repository root is on the path now)
    TEST_ENVIRONMENT,
    code_cells,
    failed_cells,
    shown,
)
from tools.refresh_outputs import notebooks  # noqa: E402
from tools.run_twice import run_differences  # noqa: E402


def changed_lines(entries: list[dict]) -> list[str]:
    """Return the differing lines of each logged (stored, fresh) pair, as 'stored: ...' and 'fresh: ...'."""
    lines = []
    for entry in entries:
        stored, fresh = entry["stored"].splitlines(), entry["fresh"].splitlines()
        for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=stored, b=fresh).get_opcodes():
            if tag != "equal":
                lines += [f"stored: {line}" for line in stored[i1:i2]] + [f"fresh:  {line}" for line in fresh[j1:j2]]
    return lines


def timing_changes(targets: list[str], seed: int = 0, stretch: tuple[float, float] = (1.0, 3.0),
                   workers: int = 2) -> list[str]:
    """Run the notebooks with stretched clocks; return a block of text per compared cell that changed or raised."""
    drift_log = Path(tempfile.mkstemp(prefix="check-timing-", suffix=".jsonl")[1])
    environment = {**TEST_ENVIRONMENT, "D2L_EXT_PRETEND": "slow-clock", "D2L_EXT_SLOW_CLOCK_SEED": str(seed),
                   "D2L_EXT_SLOW_CLOCK_RANGE": f"{stretch[0]},{stretch[1]}", "D2L_EXT_DRIFT_LOG": str(drift_log)}
    failures = failed_cells(environment, targets, workers=workers)
    drifts: dict[tuple[str, int], list[dict]] = {}
    for line in drift_log.read_text(encoding="utf-8").splitlines():
        entry = json.loads(line)
        drifts.setdefault((shown(str(REPO / entry["notebook"])), entry["cell"]), []).append(entry)
    drift_log.unlink()
    listed = []
    for notebook, cells in sorted(failures.items()):
        for index, failure in sorted(cells.items()):
            cell = code_cells(Path(notebook))[index]
            first_line = cell.source.strip().splitlines()[0][:70] if cell.source.strip() else ""
            if failure["how"] == "exception":
                details = [f"raised: {failure.get('error', '')}"]
            else:
                details = changed_lines(drifts.get((shown(notebook), index), [])) or ["(the outputs differ in kind)"]
            listed.append("\n".join([f"{shown(notebook)} code cell {index}: {first_line}",
                                     *(f"    {line}" for line in details)]))
    return listed


def twice_changes(targets: list[str], seed: int = 0, stretch: tuple[float, float] = (1.0, 3.0),
                  workers: int = 2, pinned: bool = True) -> list[str]:
    """Run each notebook twice in one kernel with stretched clocks; return a block of text per compared cell that
    changed in the first run (a timing-derived fact) or only in the second (a re-run prints otherwise).
    ``pinned``: with make test's numeric pins; else with the numeric settings of this process's environment (the
    matrix's run that carries this check sets its own)."""
    threads = os.environ.get("OMP_NUM_THREADS", "1")
    pins = TEST_ENVIRONMENT if pinned else {"PYTHONHASHSEED": "0", "OMP_NUM_THREADS": threads}
    environment = {**pins, "D2L_EXT_PRETEND": "slow-clock", "D2L_EXT_SLOW_CLOCK_SEED": str(seed),
                   "D2L_EXT_SLOW_CLOCK_RANGE": f"{stretch[0]},{stretch[1]}",
                   "PYTHONPATH": os.pathsep.join([str(REPO / "tools" / "pretend"), str(REPO)])}
    paths = notebooks(targets)
    listed = []
    if workers == 1:  # in this process (a forked pool inside pytest can hang on the threads it copies)
        results = [run_differences(path, environment, compare_first=True) for path in paths]
    else:
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            results = list(pool.map(run_differences, paths, [environment] * len(paths), [True] * len(paths)))
    for path, found in zip(paths, results, strict=True):
        first = {index for run, index, *_ in found if run == 1}
        for run, index, first_line, stored, fresh in found:
            if run == 2 and index in first:
                continue  # listed with its first run
            what = "clocks stretched" if run == 1 else "second run in the same kernel"
            lines = changed_lines([{"stored": stored, "fresh": fresh}]) or ["(the outputs differ in kind)"]
            listed.append("\n".join([f"{shown(str(path))} code cell {index} ({what}): {first_line}",
                                     *(f"    {line}" for line in lines)]))
    return listed


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="seed of the random stretch factors (default 0)")
    parser.add_argument("--stretch", type=float, nargs=2, default=(1.0, 3.0), metavar=("LOW", "HIGH"),
                        help="range of the factor each interval is stretched by (default 1 3)")
    parser.add_argument("--workers", type=int, default=2, help="notebooks run at once (default 2)")
    parser.add_argument("--twice", action="store_true",
                        help="run each notebook twice in one kernel, and compare both runs (make run-twice's check)")
    parser.add_argument("--unpinned", action="store_true",
                        help="with --twice: keep this environment's MKL, oneDNN and ATen settings instead of make "
                             "test's pins (make test-matrix's second run)")
    parser.add_argument("targets", nargs="*", default=["notebooks"])
    args = parser.parse_args(argv)
    if args.unpinned and not args.twice:
        parser.error("--unpinned goes with --twice")
    started = time.perf_counter()
    if args.twice:
        listed = twice_changes(args.targets, args.seed, tuple(args.stretch), args.workers, pinned=not args.unpinned)
    else:
        listed = timing_changes(args.targets, args.seed, tuple(args.stretch), args.workers)
    print(f"clocks stretched {args.stretch[0]:g}x to {args.stretch[1]:g}x (seed {args.seed})"
          + (f", each of {len(notebooks(args.targets))} notebooks run twice in one kernel" if args.twice else "")
          + f": {len(listed)} compared "
          f"cell(s) changed, in {time.perf_counter() - started:.0f} s"
          + ("; print their timing-derived facts in a cell tagged nbval-ignore-output, or make them bounds that "
             "load cannot break (README: Outputs that hold on a busy machine)"
             + ("; a cell listed for its second run prints otherwise when re-run in the same kernel: seed what it "
                "draws, and do not let it depend on what later cells leave behind" if args.twice else "")
             + ":" if listed else ""))
    for block in listed:
        print(block)
    return 1 if listed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
