"""Run the notebook suite under the variations this machine can produce: `make test-matrix`.

Each variant changes one thing a learner's or contributor's machine may change: how MKL and oneDNN pick their
CPU code paths, which vector kernels ATen uses, the number of threads, the Python version (a fresh environment
made by the Makefile, as on a new machine). Every variant must pass: stored outputs hold within the harness's
tolerance, or the notebook prints at a precision that another CPU keeps. What moved, and by how much, is logged
(`D2L_EXT_DRIFT_LOG`), so the table shows the largest drift each variant caused in a compared number.

It cannot cover macOS (Accelerate and MPS), other CPU vendors' vector units, or a GPU: see docs/testing.md.

By default it runs two combined variants (what CI runs): between them they set every value that one of the
single variants sets (each MKL and oneDNN code path, ATen without vector kernels, 1 and 4 threads) and the
oldest and newest Python supported, so that a cell that one change would break fails in one of the two runs,
at less than a quarter of the cost of running each change alone. The second runs on Colab's packages
(tests/envs/colab.txt, the environment `make test-colab` builds), so CI needs no separate Colab pass.
`--each` runs each change alone, nine runs, to tell which one moved a cell (the table then shows the largest
drift each caused); `--only` picks runs by name.

Usage: python -m tools.envs.matrix [--each] [--only NAME[,NAME...]] [--list] [--report build/test-matrix.md]

Why not nox or tox: they could make the venvs, but not the combined variants, the pretend runs,
the drift table or the disk fallback; tox handles variants made of environment variables badly.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from tools import REPO
from tools.checks import PRETEND
from tools.deadline import not_run, past_deadline
from tools.envs import colab
from tools.envs.colab import TARGET, colab_python
from tools.envs.venvs import COLAB_VENV_GIB, SEEDED_VENV_GIB, find_python, free_gib
from tools.outputs.run import NBVAL_OPTIONS

LIKE_NCCL = "D2L_EXT_LIKE_NCCL"  # d2l_ext.ranks.LIKE_NCCL, named here so that this tool does not import torch

COLAB_PYTHON = colab_python(TARGET.read_text())  # the Python of Colab's runtime, which tests/envs/colab.txt names


@dataclass(frozen=True)
class Variant:
    """One way to run the notebook suite: environment variables, or another Python in a fresh environment."""

    name: str
    environment: dict[str, str] = field(default_factory=dict)
    python: str | None = None  # another interpreter: a fresh venv is made with it by `make dev`
    pins: bool = False  # keep make test's pins (Makefile's NUMERIC_ENV and TEST_THREADS)
    # D2L_EXT_PRETEND (tools/checks/pretend/sitecustomize.py): torch made to report another build, as check_tags
    # does, or the clocks stretched, as check_timing does; modes joined by commas
    pretend: str = ""
    colab: bool = False  # Colab's packages (tests/envs/colab.txt) in .venv-colab, built by tools/envs/colab.py
    # Binder's memory measured in this run (tools/checks/memory_nbval.py): one notebook at a time, beside the others
    memory: bool = False


# The pins of `make test` (Makefile's NUMERIC_ENV, and one thread per kernel: TEST_THREADS) are dropped in every
# environment variant, so that each shows what a machine without them does (the first runs with no pin at all,
# every thread included); the Python variants keep them, as `make test` there would.
EACH = [
    Variant("MKL_CBWR default (no pins)"),
    Variant("MKL_CBWR=COMPATIBLE", {"MKL_CBWR": "COMPATIBLE"}),
    Variant("ONEDNN_MAX_CPU_ISA=AVX2", {"ONEDNN_MAX_CPU_ISA": "AVX2"}),
    Variant("ATEN_CPU_CAPABILITY=default", {"ATEN_CPU_CAPABILITY": "default"}),
    Variant("OMP_NUM_THREADS=1", {"OMP_NUM_THREADS": "1"}),
    Variant("OMP_NUM_THREADS=4", {"OMP_NUM_THREADS": "4"}),
    Variant("Python 3.10 (fresh venv)", python="python3.10", pins=True),
    Variant("Python 3.12 (fresh venv)", python="python3.12", pins=True),
    Variant("Python 3.13 (fresh venv)", python="python3.13", pins=True),
]

# The same changes in two runs. A variant's cost follows what it can change: a code path or a thread count can
# only move floating-point results, and it moves them as much beside another change as alone, while another
# Python can change any text; so each run carries one Python and one value of every numeric setting, and every
# value that EACH sets appears in one of them (OMP_NUM_THREADS unset, i.e. 2 here, lies between 1 and 4; the
# unpinned oneDNN path is the default of the first). The Pythons are the oldest and the newest supported (3.13
# is Colab's); make test runs 3.11, and 3.12 runs with --each. A cell that fails here is attributed with --each.
#
# The second runs on Colab's packages (another torch, an old ipykernel, ipywidgets 7: `make test-colab`'s
# environment, whose pass CI no longer makes on its own) with the sliders' tests; packages can change any text, but
# a failure there is attributed by `make test-colab` (Colab's packages with make test's pins). Our own pins on that
# Python are resolved by pip without installing them (binary wheels for every pin); the notebooks run on our pins
# under 3.10 here, 3.11 in make test and 3.12 and 3.13 with --each.
#
# Both run with every clock stretched adversarially (tools/checks/pretend/sitecustomize.py, slow-clock: 3x on one
# side of each cell's turn), the load early in each cell in the first run and late in the second: what
# `make check-timing` checks in two passes of its own. A compared fact derived from a stopwatch flips in one of
# them. Stretched clocks change only what a clock reports, a numeric setting only numbers.
# The first also runs with torch reporting a CPU-only build (macOS, `+cpu` wheels), which `make check-tags
# --mode cpu-build` does on its own: there, cells tagged build-dependent are not compared, and any other cell that
# changes or raises fails, as it would for a learner with that build. A build can change only what torch reports,
# so none of the three hides another; a failure is attributed by running `make check-tags --mode cpu-build`,
# `make check-timing` and `--each`. CI then needs no separate cpu-build or timing pass of the whole suite.
# The second also makes a failed gloo collective wait for its timeout and abort, as NCCL's watchdog does
# (d2l_ext.ranks.fail_as_nccl_would): chapter 11's runs must print what its text says as they would on 2 GPUs (the
# lost node's run waits 30 s more). It changes only how a failed collective ends, and only chapter 11 fails one; make
# test ran chapter 11 a second time for it (114 s) until issue 45 moved it here.
# Running each notebook twice in one kernel (a learner's second Run All) is `make check-timing --twice`'s, for
# contributors (CONTRIBUTING.md says when): it costs a whole pass, and issue 45 took it out of CI.
COMBINED = [
    Variant("Python 3.10 + MKL default + ATen default + 4 threads + torch reporting a CPU-only build + clocks "
            "stretched, load early",
            {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "4", "D2L_EXT_SLOW_CLOCK_LOAD": "early"},
            python="python3.10", pretend="cpu-build,slow-clock", memory=True),
    Variant(f"Colab's packages on Python {COLAB_PYTHON} + MKL_CBWR=COMPATIBLE + ONEDNN_MAX_CPU_ISA=AVX2 + 1 thread + "
            "clocks stretched, load late + gloo failing as NCCL does",
            {"MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "AVX2", "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0",
             "D2L_EXT_SLOW_CLOCK_LOAD": "late", LIKE_NCCL: "1"},
            python=f"python{COLAB_PYTHON}", pretend="slow-clock", colab=True),
]
VARIANTS = EACH + COMBINED


@dataclass
class Result:
    variant: Variant
    passed: int = 0
    failed: int = 0
    seconds: float = 0.0
    largest_drift: float | None = None
    note: str = ""


def counts(output: str) -> tuple[int, int]:
    """Return (passed, failed + errors) from pytest's closing line."""
    found = {word: int(number) for number, word in re.findall(r"(\d+) (passed|failed|errors?)\b", output)}
    return found.get("passed", 0), found.get("failed", 0) + found.get("error", 0) + found.get("errors", 0)


# the lines of a run that say how far it got (pytest -q's, each with its percentage), shown as they come: CI keeps
# only this log, and a run that outlasts CI's time limit is otherwise silent until it is killed
PROGRESS = re.compile(r"^\S+\s+\[\s*\d+%\]$")


def streamed(command: list[str], environment: dict[str, str]) -> subprocess.CompletedProcess:
    """Run ``command``; return it done, with its stdout (and stderr, after it); echo its progress lines at once."""
    with tempfile.TemporaryFile("w+") as errors:
        process = subprocess.Popen(command, cwd=REPO, env=environment, stdout=subprocess.PIPE, stderr=errors,
                                   text=True)
        assert process.stdout is not None
        lines = []
        for line in process.stdout:
            lines.append(line)
            if PROGRESS.match(line):
                print("  " + line.strip(), flush=True)
        process.wait()
        errors.seek(0)
        return subprocess.CompletedProcess(command, process.returncode, "".join(lines), errors.read())


# The memory run in two parts, each a pytest of its own: the chapters beside the other runs, the solutions once those
# are done, beside the chapters' rest. Alone at the end, the memory run kept one core of two idle for minutes (CI of
# stop 55: the Colab run ended 3.7 minutes before it, with 15 solutions still to come). Each part measures its own
# notebooks one at a time; the two kernels' limits are separate cgroups, and the figures are each kernel's own.
MEMORY_PARTS = ("chapters", "solutions")


def memory_part(part: str) -> list[str]:
    """pytest's arguments for one part of the memory run: the chapters named one by one (a folder with an
    --ignore would fail the suite's check that every notebook under a folder given to pytest is collected), or
    the solutions' folder."""
    if part == "solutions":
        return ["notebooks/solutions"]
    return sorted(str(path.relative_to(REPO)) for path in (REPO / "notebooks").glob("*.ipynb"))


def run_variant(variant: Variant, log_folder: Path, remove_venv: bool = False, part: str | None = None) -> Result:
    """Run the notebooks as ``variant`` says; ``part``: only that part of the memory run (MEMORY_PARTS)."""
    result = Result(variant)
    stem = re.sub(r"\W+", "-", variant.name).strip("-") + (f"-{part}" if part else "")
    drift_log = log_folder / (stem + ".jsonl")
    # Idle OpenMP threads sleep instead of spinning: two notebooks at once, each with several threads, oversubscribe
    # the cores, and spinning threads take them from the working ones (the 4-thread run here: 209 s, 145 s with
    # this). How a thread waits changes no result, only where the time goes.
    environment = {"OMP_WAIT_POLICY": "PASSIVE", **os.environ, "D2L_EXT_DRIFT_LOG": str(drift_log),
                   **variant.environment}
    if variant.pretend:
        environment.update({"D2L_EXT_PRETEND": variant.pretend,
                            "PYTHONPATH": os.pathsep.join([str(PRETEND), str(REPO)])})
    arguments, fresh = [], False
    venv, installed, needed = fresh_venv(variant)
    python = None
    if variant.python:
        python = find_python(variant.python)
        if python is None:
            result.note = f"{variant.python} not found (on PATH, or under pyenv's versions): install it"
            result.failed = 1
            return result
        free = free_gib(REPO)
        if not installed.exists() and free < needed:
            # Too little disk for another torch: keep the variant's other settings, on make test's Python
            result.note = (f"{venv.name if variant.colab else variant.python} NOT RUN: {free:.1f} GiB free, a new "
                           f"venv needs {needed:.0f}; ran on .venv's Python")
            variant, python = replace(variant, python=None, colab=False), None
        else:
            arguments, fresh = [f"PYTHON={python}", f"VENV={venv.name}", "SEED_FROM=.venv"], True
    if not variant.pins:
        arguments += ["NUMERIC_ENV=PYTHONHASHSEED=0", "TEST_THREADS="]  # drop the pins and the one-thread rule
    start = time.perf_counter()
    if variant.pretend and not variant.colab:  # the environment is built first, by a pip that must not import the
        # pretending torch (Colab's is built by colab.build, below, without the pretence)
        subprocess.run(["make", "--no-print-directory", "dev", *arguments], cwd=REPO, check=True,
                       env={**os.environ, **variant.environment})
    if variant.colab:  # not through make: its `env` target would install our pins into Colab's environment
        assert python is not None
        bin_python = str(colab.build(python, venv))
        # make test-colab's command (tools/envs/colab.py): the notebooks and the sliders' tests on ipywidgets 7
        commands = [[bin_python, "-m", "pytest", *NBVAL_OPTIONS, "-n", "2", "--dist", "loadfile", "-q", "-p",
                     "no:cacheprovider", "notebooks", "tests/test_widgets.py"]]
    elif variant.memory:  # make check-memory's figures while nbval compares (the plugin refuses xdist)
        bin_python = str((venv if python else REPO / ".venv") / "bin" / "python")
        if not variant.pins:
            environment = {**environment, "PYTHONHASHSEED": "0"}  # make notebooks' NUMERIC_ENV, pins dropped
        targets = ["notebooks"] if part is None else [
            *memory_part(part), "--memory-report", str(REPO / "build" / f"check-memory-{part}.md")]
        commands = [[bin_python, "-m", "pytest", *NBVAL_OPTIONS, "-p", "tools.checks.memory_nbval", "-p", "no:xdist",
                     "-q", "-p", "no:cacheprovider", *targets]]
    else:
        commands = [["make", "--no-print-directory", "notebooks", *arguments]]
    runs = [streamed(command, environment) for command in commands]
    result.seconds = time.perf_counter() - start
    output = "".join(done.stdout + done.stderr for done in runs)
    result.passed, result.failed = counts(output)
    if result.variant.colab:  # our pins on Colab's Python, which no run here installs
        resolved, said = pins_resolve(COLAB_PYTHON)
        result.note = "; ".join(filter(None, [result.note, said]))
        result.failed += not resolved
    if any(done.returncode != 0 for done in runs):
        result.failed = max(result.failed, 1)
        failures = re.findall(r"^(?:FAILED|ERROR) .*$|^\S+\.ipynb code cell \d+ .*$", output, flags=re.M)
        failure = "; ".join(failures[:5]) or output.strip().splitlines()[-1][:200]
        result.note = f"{result.note}; {failure}" if result.note else failure
        (log_folder / (drift_log.stem + ".log")).write_text(output)
        print("  what failed, as pytest showed it (CI keeps no log folder):\n    "
              + "\n    ".join(failure_excerpt(output)), flush=True)
    if remove_venv and fresh and part is None:  # a part's venv is removed once both parts are done (main)
        shutil.rmtree(venv, ignore_errors=True)
    drifts = [json.loads(line)["drift"] for line in drift_log.read_text().splitlines()] if drift_log.exists() else []
    numeric = [d for d in drifts if d is not None]
    result.largest_drift = max(numeric, default=0.0)
    if any(d is None for d in drifts):
        result.note += " (some compared texts differed in words: see the log)"
    return result


def joined(first: Result, second: Result, seconds: float) -> Result:
    """One row for a run made in two parts: their counts added, the larger drift, the notes of both, and the
    seconds from the first part's start to the end of the later one."""
    drifts = [d for d in (first.largest_drift, second.largest_drift) if d is not None]
    notes = "; ".join(dict.fromkeys(n for n in (first.note, second.note) if n))
    return Result(first.variant, first.passed + second.passed, first.failed + second.failed, seconds,
                  max(drifts) if drifts else None, notes)


def failure_excerpt(output: str, most: int = 120) -> list[str]:
    """Return pytest's report of what failed in ``output`` (its FAILURES section, where nbval shows each changed
    cell's stored and fresh lines, then its short summary), at most ``most`` lines; else its last 20 lines."""
    lines = output.strip().splitlines()
    start = next((i for i, line in enumerate(lines) if re.match(r"^=+ (FAILURES|ERRORS) =+$", line)), None)
    if start is None:
        return lines[-20:]
    shown = lines[start:]
    return shown if len(shown) <= most else [*shown[:most - 10], f"... ({len(shown) - most} lines left out)",
                                              *shown[-9:]]


def pins_resolve(version: str) -> tuple[bool, str]:
    """Whether requirements.txt resolves to binary wheels for Python ``version``, and a line that says so (pip's
    dry run: nothing is installed). The matrix runs the notebooks on that Python with Colab's packages, not ours."""
    with tempfile.TemporaryDirectory() as target:
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
                               "--only-binary=:all:", "--python-version", version, "--target", target,
                               "-r", str(REPO / "requirements.txt")], cwd=REPO, capture_output=True, text=True)
    if done.returncode == 0:
        return True, f"requirements.txt resolves to wheels for Python {version}"
    errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR")] or done.stderr.splitlines()[-1:]
    return False, f"pip could NOT resolve requirements.txt for Python {version}: {'; '.join(errors)[:300]}"


def fresh_venv(variant: Variant) -> tuple[Path, Path, float]:
    """Return the fresh venv of a variant with another Python, the file that says it is built, and the GiB it needs."""
    if variant.colab:
        venv = REPO / ".venv-colab"
        return venv, venv / ".colab-installed", COLAB_VENV_GIB
    venv = REPO / f".venv-{variant.python}"
    return venv, venv / ".installed-dev", SEEDED_VENV_GIB  # make dev's stamp: the test tools too


def build_only(variants: list[Variant], margin_gib: float = 12.0) -> int:
    """Build the fresh venv of each variant that has another Python, if the disk keeps ``margin_gib`` free after it
    (the runs themselves need room for their logs and the other venv); say what was built."""
    for variant in variants:
        python = find_python(variant.python) if variant.python else None
        venv, installed, needed = fresh_venv(variant)
        if python is None or installed.exists():
            continue
        if free_gib(REPO) < needed + margin_gib:
            print(f"{venv.name} not built ahead: {free_gib(REPO):.1f} GiB free; its run will build it", flush=True)
            continue
        if variant.colab:
            try:
                colab.build(python, venv)
                built = True
            except subprocess.CalledProcessError:
                built = False
        else:
            built = subprocess.run(["make", "--no-print-directory", "dev", f"PYTHON={python}", f"VENV={venv.name}",
                                    "SEED_FROM=.venv"], cwd=REPO, env={**os.environ, **variant.environment}
                                   ).returncode == 0
        print(f"{venv.name}: {'built' if built else 'NOT built; its run will try again'}", flush=True)
    return 0


def table(results: list[Result]) -> str:
    lines = ["| variant | passed | failed | seconds | largest drift of a compared number | note |",
             "|---|---|---|---|---|---|"]
    for r in results:
        drift = "none" if not r.largest_drift else f"{r.largest_drift:.2%}"
        lines.append(f"| {r.variant.name} | {r.passed} | {r.failed} | {r.seconds:.0f} | {drift} | {r.note} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--each", action="store_true", help="run each change alone (nine runs), not combined")
    parser.add_argument("--only", help="comma-separated variant names (or unique prefixes), single or combined")
    parser.add_argument("--list", action="store_true", help="list the variants and exit")
    parser.add_argument("--remove-venvs", action="store_true",
                        help="delete each fresh venv after its run (CI: a CUDA build of torch per Python fills disks)")
    parser.add_argument("--build-only", action="store_true",
                        help="only build the fresh environments of the chosen variants, where the disk has room for "
                             "all of them and a margin (CI builds them while make test runs), and run nothing")
    parser.add_argument("--report", default=str(REPO / "build" / "test-matrix.md"))
    args = parser.parse_args(argv)
    if args.list:
        print("combined (the default):\n  " + "\n  ".join(v.name for v in COMBINED))
        print("each change alone (--each):\n  " + "\n  ".join(v.name for v in EACH))
        return 0
    chosen = EACH if args.each else COMBINED
    if args.only:
        wanted = [w.strip() for w in args.only.split(",")]
        chosen = [v for v in VARIANTS if any(v.name.startswith(w) for w in wanted)]
        if not chosen:
            parser.error(f"no variant matches {args.only!r}; see --list")
    if args.build_only:
        return build_only(chosen)
    log_folder = REPO / "build" / "test-matrix-logs"  # this run's only: the last run's are removed
    shutil.rmtree(log_folder, ignore_errors=True)
    log_folder.mkdir(parents=True)
    def one(variant: Variant, part: str | None = None) -> Result:
        name = f"{variant.name}, {part}" if part else variant.name
        if past_deadline():  # CI's budget is spent: this run is reported, neither passed nor failed
            result = Result(variant, note=not_run(f"this run ({part})" if part else "this run"))
            print(result.note, flush=True)
            return result
        print(f"running the notebooks with {name} ...", flush=True)
        r = run_variant(variant, log_folder, args.remove_venvs, part)
        print(f"  {r.passed} passed, {r.failed} failed in {r.seconds:.0f} s ({name}) {r.note}", flush=True)
        return r

    # The run that measures memory takes one notebook at a time, about one core of two: the others run beside its
    # chapters, then its solutions run beside the chapters' rest (MEMORY_PARTS)
    beside = next((v for v in chosen if v.memory), None) if len(chosen) > 1 else None
    with ThreadPoolExecutor(max_workers=1) as pool:
        start = time.perf_counter()
        measured = pool.submit(one, beside, "chapters") if beside is not None else None
        done = {v.name: one(v) for v in chosen if v is not beside}
        if measured is not None and beside is not None:
            solutions = one(beside, "solutions")
            done[beside.name] = joined(measured.result(), solutions, time.perf_counter() - start)
            venv, _, _ = fresh_venv(beside)
            if args.remove_venvs and beside.python and venv.exists():
                shutil.rmtree(venv, ignore_errors=True)
    results = [done[v.name] for v in chosen]
    report = table(results)
    print("\n" + report)
    print(f"\nlogs of what moved: {log_folder}")
    Path(args.report).parent.mkdir(parents=True, exist_ok=True)
    Path(args.report).write_text(report + "\n")
    return 0 if all(r.failed == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
