"""tools/checks/timing.py: the adversarial clock (tools/checks/pretend/sitecustomize.py, slow-clock), and planted
timing-derived facts, each caught by the run whose load flips it, with a fact that no load changes not listed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from tools.checks import timing

pytestmark = pytest.mark.launches  # most tests here start processes (Pythons, kernels, torchrun)

REPO = Path(__file__).resolve().parent.parent

# each interval's stretch (its stretched length over its real one), from readings in a script (a process is one
# cell): a shared reading (t0, t1, t2), an outer timer started just before (no turn there), a background thread
# reading all along (it does not move the turn), and the three clocks, which share one timeline
CLOCK_PROBE = """
import json, threading, time
def stretch(start, real_start):
    return (time.perf_counter() - start) / (time.real_perf_counter() - real_start)
stop = threading.Event()
def background():
    while not stop.is_set():
        time.monotonic(); time.sleep(0.001)
thread = threading.Thread(target=background); thread.start()
outer = time.perf_counter()
t0, r0 = time.perf_counter(), time.real_perf_counter()
time.sleep(0.03)
first, t1, r1 = stretch(t0, r0), time.perf_counter(), time.real_perf_counter()
time.sleep(0.03)
second = stretch(t1, r1)
t2, r2 = time.perf_counter(), time.real_perf_counter()
for _ in range(3): time.sleep(0.01); later = stretch(t2, r2)
stop.set(); thread.join()
readings = [f() for _ in range(50) for f in (time.perf_counter, time.monotonic, time.time)]
print(json.dumps({"first": first, "second": second, "later": later, "readings": readings}))
"""


def probe_clock(load: str, extra: dict[str, str] | None = None, code: str = CLOCK_PROBE, runs: int = 3) -> dict:
    """Run ``code`` ``runs`` times under the slow clock; return the first run, each stretch its median over the runs.

    A stretch compares two readings taken one after the other; a process descheduled between them on a busy
    machine (CI builds environments beside make test) reads a stretch off by the pause: 3.44 for 3 once. The
    median of three fresh processes keeps the check exact to its tolerance without timing anything longer.
    """
    environment = {**os.environ, **timing.clock_environment((1.0, 3.0), load), **(extra or {}),
                   "PYTHONPATH": str(REPO / "tools" / "checks" / "pretend")}
    found = [json.loads(subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True,
                                       check=True, timeout=60).stdout) for _ in range(runs)]
    return {key: sorted(run[key] for run in found)[runs // 2] if isinstance(value, float) else value
            for key, value in found[0].items()}


def test_the_clock_runs_3x_fast_before_the_turn_and_1x_after_it_with_the_load_early_and_the_reverse_late():
    early, late = probe_clock("early"), probe_clock("late")
    # the turn is t1: the first reading on another line at least 1 ms after the first (t0 came microseconds after
    # the outer timer's start, so did not turn); the piece before it runs 3x fast, everything after 1x
    assert 2.9 < early["first"] < 3.1 and 0.97 < early["second"] < 1.03 and 0.97 < early["later"] < 1.03, early
    assert 0.97 < late["first"] < 1.03 and 2.9 < late["second"] < 3.1 and 2.9 < late["later"] < 3.1, late
    for clock in range(3):  # perf_counter, monotonic and time each still only move forward
        readings = early["readings"][clock::3]
        assert all(a <= b for a, b in zip(readings, readings[1:], strict=False))


# two cells in a process whose IPython execution count goes from 1 to 2, with the kernel's second Run All said to
# start after cell 1: the second cell takes the late load, and so does a process it starts
SWITCH_PROBE = """
import json, os, subprocess, sys, time, types
shell = types.SimpleNamespace(execution_count=1)
sys.modules["IPython"] = types.SimpleNamespace(get_ipython=lambda: shell)
def first_stretch():
    t0, r0 = time.perf_counter(), time.real_perf_counter()
    time.sleep(0.03)
    return (time.perf_counter() - t0) / (time.real_perf_counter() - r0)
cell_1 = first_stretch()
shell.execution_count = 2
cell_2 = first_stretch()
child = subprocess.run([sys.executable, "-c", "import time\\nt0, r0 = time.perf_counter(), time.real_perf_counter()\\n"
                        "time.sleep(0.03)\\nprint((time.perf_counter() - t0) / (time.real_perf_counter() - r0))"],
                       capture_output=True, text=True, check=True)
print(json.dumps({"cell_1": cell_1, "cell_2": cell_2, "child": float(child.stdout),
                  "load": os.environ["D2L_EXT_SLOW_CLOCK_LOAD"]}))
"""


def test_the_second_run_all_takes_the_late_load_and_the_processes_it_starts_too():
    found = probe_clock("early", {"D2L_EXT_SLOW_CLOCK_SWITCH_AFTER": "1"}, SWITCH_PROBE)
    assert 2.9 < found["cell_1"] < 3.1, found  # a cell's first interval: 3x with the load early
    assert 0.97 < found["cell_2"] < 1.03 and found["load"] == "late", found
    assert 0.97 < found["child"] < 1.03, found  # the child's first interval: 1x, as its parent's cell


def stored(text: str | None) -> dict:
    """A code cell's stored part: as an honest run prints it (each fact holds by design on any machine)."""
    return {"execution_count": 1, "outputs": [new_output("stream", name="stdout", text=text)] if text else []}


def plant(path: Path, cells: list[tuple[str, str | None]]) -> None:
    notebook = new_notebook(cells=[new_code_cell(source, **stored(text)) for source, text in cells])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, path)


def compared(first: float, second: float) -> str:
    return "a < b" if first < second else "a > b"


def shared(first: float, second: float, fact: str) -> tuple[str, str]:
    """Two sleeps timed with a shared reading; the fact compares them."""
    return (f"t0 = time.perf_counter()\ntime.sleep({first})\nt1 = time.perf_counter()\ntime.sleep({second})\n"
            f"t2 = time.perf_counter()\na, b = t1 - t0, t2 - t1\nprint('{fact}', {compared(first, second)})",
            f"{fact} True\n")


def helper(first: float, second: float, fact: str) -> tuple[str, str]:
    """Two sleeps timed by a function of the notebook's, on two lines."""
    return (f"a = timed({first})\nb = timed({second})\nprint('{fact}', {compared(first, second)})",
            f"{fact} True\n")


def nested(first: float, second: float, fact: str) -> tuple[str, str]:
    """Two sleeps timed apart, inside an outer timer started just before them."""
    return ("start = time.perf_counter()\n"
            f"a0 = time.perf_counter()\ntime.sleep({first})\na = time.perf_counter() - a0\n"
            f"b0 = time.perf_counter()\ntime.sleep({second})\nb = time.perf_counter() - b0\n"
            "whole = time.perf_counter() - start\n"
            f"print('{fact}', {compared(first, second)}, 'parts within the whole:', a + b <= whole)",
            f"{fact} True parts within the whole: True\n")


TIMED = ("import time\n\ndef timed(seconds):\n    start = time.perf_counter()\n    time.sleep(seconds)\n"
         "    return time.perf_counter() - start", None)
# holds on any clock that only moves forward and never runs slow: never listed
NO_LOAD_CHANGES = ("start = time.perf_counter()\ntime.sleep(0.02)\npart = time.perf_counter() - start\n"
                   "whole = time.perf_counter() - start\n"
                   "print('a sleep takes at least what it asked:', part >= 0.02,\n"
                   "      '; a part is not longer than the whole:', part <= whole,\n"
                   "      '; the same on every machine:', sum(range(10)))",
                   "a sleep takes at least what it asked: True ; a part is not longer than the whole: True ; "
                   "the same on every machine: 45\n")
# prints 1 in a fresh kernel and 2 when the notebook runs again in the same one
RERUN_FACT = ("runs = globals().get('runs', 0) + 1\nprint('runs of this cell in this kernel:', runs)",
              "runs of this cell in this kernel: 1\n")


def test_twice_catches_each_planted_comparison_in_the_run_whose_load_flips_it(tmp_path, capsys):
    # true ratios of 1.2x, 2x and 2.9x (within the stretch, 3x), each way round, timed in three ways
    plant(tmp_path / "planted.ipynb", [
        TIMED,
        shared(0.15, 0.18, "the first sleep is shorter (1.2x):"),
        shared(0.18, 0.15, "the first sleep is longer (1.2x):"),
        helper(0.1, 0.2, "a < b (2x):"), helper(0.2, 0.1, "a > b (2x):"),
        nested(0.15, 0.435, "a < b (2.9x):"), nested(0.435, 0.15, "a > b (2.9x):"),
        NO_LOAD_CHANGES, RERUN_FACT])
    status = timing.main(["--twice", "--workers", "1", str(tmp_path)])
    printed = capsys.readouterr().out
    assert status == 1, printed
    assert "each of 1 notebooks run twice in one kernel: 7 compared cell(s) changed" in printed, printed
    early, late = "(load early in the cell)", "(second run in the same kernel, load late in the cell)"
    # a < b flips when the earlier piece is stretched 3x (the first run), a > b when the later one is (the second)
    for index, run, fresh in [(1, early, "the first sleep is shorter (1.2x): False"),
                              (2, late, "the first sleep is longer (1.2x): False"),
                              (3, early, "a < b (2x): False"), (4, late, "a > b (2x): False"),
                              (5, early, "a < b (2.9x): False parts within the whole: True"),
                              (6, late, "a > b (2.9x): False parts within the whole: True"),
                              (8, late, "runs of this cell in this kernel: 2")]:
        assert f"planted.ipynb code cell {index} {run}" in printed, (index, printed)
        assert f"fresh:  {fresh}" in printed, (index, printed)
    assert "code cell 0 " not in printed and "code cell 7 " not in printed  # no load changes these


# True when time is honest: five sleeps of 20 ms take about 100 ms, far below 150 ms even on a busy machine
TIMING_FACT = ("import time\nstart = time.perf_counter()\nfor _ in range(5):\n    time.sleep(0.02)\n"
               "print('five short sleeps took less than 1.5x the time asked:', time.perf_counter() - start < 0.15)",
               "five short sleeps took less than 1.5x the time asked: True\n")


def test_without_twice_a_pass_for_each_load_lists_each_fact_with_its_changed_line(tmp_path, capsys):
    plant(tmp_path / "planted.ipynb", [TIMING_FACT, NO_LOAD_CHANGES,
                                       shared(0.1, 0.2, "the first sleep is shorter (2x):"),
                                       shared(0.2, 0.1, "the first sleep is longer (2x):")])
    status = timing.main(["--workers", "1", str(tmp_path)])
    printed = capsys.readouterr().out
    assert status == 1, printed
    assert "3 compared cell(s) changed" in printed, printed
    assert "planted.ipynb code cell 0 (load early in the cell): import time" in printed, printed
    assert "stored: five short sleeps took less than 1.5x the time asked: True" in printed
    assert "fresh:  five short sleeps took less than 1.5x the time asked: False" in printed
    assert "planted.ipynb code cell 2 (load early in the cell): t0 = " in printed
    assert "planted.ipynb code cell 3 (load late in the cell): t0 = " in printed
    assert "fresh:  the first sleep is longer (2x): False" in printed
    assert "code cell 1 " not in printed


# Issue 51: chapter 11 hung under the slow clock. The clock itself had two ways to hang a process (below); the hang CI
# saw was gloo's (d2l_ext.launch.keep_process_groups); and torchrun's agent read the stretched clock, which stretched
# its own timers. Each test runs what hung before, with a time limit.
def run_under_slow_clock(code: str, load: str = "early", stretch: tuple[float, float] = (1.0, 3.0),
                         timeout: float = 60) -> subprocess.CompletedProcess:
    environment = {**os.environ, **timing.clock_environment(stretch, load),
                   "PYTHONPATH": str(REPO / "tools" / "checks" / "pretend")}
    return subprocess.run([sys.executable, "-W", "ignore", "-c", code], env=environment, capture_output=True,
                          text=True, timeout=timeout)


# a signal handler runs between two bytecodes of whatever the main thread runs, as a finalizer does when Python 3.12
# or newer collects garbage there: inside a clock reading, a handler that reads a clock takes the clock's lock again
REENTRANT_READING = """
import signal, time
signal.signal(signal.SIGALRM, lambda signum, frame: time.monotonic())
signal.setitimer(signal.ITIMER_REAL, 1e-4, 1e-4)
for _ in range(100_000):
    time.perf_counter()
signal.setitimer(signal.ITIMER_REAL, 0)
print("done")
"""


def test_a_clock_read_inside_a_clock_reading_does_not_deadlock():
    # with a plain Lock this deadlocked (or died of the recursion); measured: Python 3.13 deadlocks the same way
    # through a finalizer (a collected cycle whose __del__ reads a clock)
    done = run_under_slow_clock(REENTRANT_READING)
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr[-500:]


# a thread reads the clock all along while the main thread forks: a child that copied the lock held waits for ever
FORK_WHILE_READING = """
import os, threading, time
stop = False
def reader():
    while not stop:
        time.monotonic()
threading.Thread(target=reader, daemon=True).start()
hung = 0
for _ in range(30):
    pid = os.fork()
    if pid == 0:
        time.perf_counter()
        os._exit(0)
    deadline = time.real_perf_counter() + 2
    while not os.waitpid(pid, os.WNOHANG)[0]:
        if time.real_perf_counter() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            hung += 1
            break
        time.sleep(0.001)
stop = True
print(hung)
"""


def test_a_child_forked_while_another_thread_reads_the_clock_can_read_it():
    # before: 15 children of 50 hung (measured); a DataLoader's workers and torchrun's are forked so
    done = run_under_slow_clock(FORK_WHILE_READING, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "0", (done.stdout, done.stderr[-500:])


@pytest.mark.parametrize(("argv", "expected"), [
    (["python", "-m", "torch.distributed.run", "--nnodes=2", "train.py"], True),
    (["python", "-u", "-m", "d2l_ext.agent", "--run-path", "train.py"], True),
    (["/venv/bin/python", "/venv/bin/torchrun", "--nproc-per-node=2", "train.py"], True),
    (["python", "train.py", "-m", "torch.distributed.run"], False),  # a script's own arguments
    (["python", "-m", "ipykernel_launcher", "-f", "kernel.json"], False),
    (["python", "-c", "print(1)"], False),
])
def test_torchruns_agent_is_recognised_by_its_command_line(argv, expected):
    assert pretend_module().is_launcher(argv) is expected


@pytest.mark.parametrize(("argv", "expected"), [
    (["python", "-m", "pytest", "--nbval", "notebooks"], True),  # make test-matrix's runs
    (["/venv/bin/python", "/venv/bin/pytest", "-q"], True),
    (["python", "-m", "ipykernel_launcher", "-f", "kernel.json"], False),  # the kernels it starts
    (["python", "-c", "import pytest"], False),
    (["python", "run.py", "-m", "pytest"], False),  # a script's own arguments
])
def test_pytest_the_harness_is_recognised_by_its_command_line(argv, expected):
    assert pretend_module().is_harness(argv) is expected


# CI's deadline 3 s ahead; then 1.5 s of real time, 15 s on a clock stretched 10 times
DEADLINE_PROBE = """
import os, time
from tools.deadline import past_deadline
os.environ["D2L_EXT_CI_DEADLINE"] = str(time.real_time() + 3)
t0 = time.perf_counter()
time.sleep(1.5)
print(time.perf_counter() - t0 > 10, past_deadline())
"""


def test_ci_deadline_reads_the_real_clock_where_the_clocks_are_stretched():
    # before: the memory run's pytest read 974 s as 2,863 s and skipped 15 notebooks as past CI's deadline
    done = run_under_slow_clock(f"import sys; sys.path.insert(0, {str(REPO)!r})\n" + DEADLINE_PROBE,
                                stretch=(10.0, 10.0))
    assert done.stdout.split() == ["True", "False"], done.stderr[-500:]


def test_pytest_keeps_the_real_clocks_and_the_processes_it_starts_stretch_theirs(tmp_path):
    (tmp_path / "test_clock.py").write_text(
        "import subprocess, sys, time\n"
        "def test_clocks():\n"
        "    print('harness', type(time.perf_counter).__name__)\n"
        "    child = subprocess.run([sys.executable, '-c', 'import time; print(type(time.perf_counter).__name__)'],\n"
        "                          capture_output=True, text=True)\n"
        "    print('child', child.stdout.strip())\n")
    environment = {**os.environ, **timing.clock_environment((1.0, 3.0), "early"),
                   "PYTHONPATH": str(REPO / "tools" / "checks" / "pretend")}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-p", "no:xdist",
                           str(tmp_path / "test_clock.py")], env=environment, capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert "harness builtin_function_or_method" in done.stdout, done.stdout[-800:]
    assert "child function" in done.stdout, done.stdout[-800:]


def pretend_module():
    """tools/checks/pretend/sitecustomize.py as a module (without D2L_EXT_PRETEND it changes nothing)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("pretend_sitecustomize",
                                                  REPO / "tools" / "checks" / "pretend" / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# a rank's stopwatch fact: two sleeps of 0.2 s, timed from the script's own lines
STOPWATCH = """
import time
t0 = time.perf_counter()
time.sleep(0.2)
t1 = time.perf_counter()
time.sleep(0.2)
t2 = time.perf_counter()
print(f"first sleep longer: {(t1 - t0) > 1.5 * (t2 - t1)}")
"""


def test_torchruns_timers_read_the_real_clock_and_a_ranks_stopwatch_the_stretched_one(tmp_path, monkeypatch):
    from d2l_ext import launch

    script = tmp_path / "stopwatch.py"
    script.write_text(STOPWATCH)
    monkeypatch.setenv("PYTHONPATH", str(REPO / "tools" / "checks" / "pretend"))
    # 100,000 times fast: the agents' rendezvous deadline (join: 600 s) would pass in 6 ms; before the fix node 1's
    # agent gave up at once (RendezvousTimeoutError) and node 0's waited until the launch's timeout
    for name, value in timing.clock_environment((1.0, 1e5), "early").items():
        monkeypatch.setenv(name, value)
    printed = launch.torchrun_nodes(script, nodes=2, nproc_per_node=1, timeout=60, echo=False)
    assert printed == ["first sleep longer: True\n"] * 2  # each rank's first sleep ran 100,000 times fast
    monkeypatch.setenv("D2L_EXT_SLOW_CLOCK_LOAD", "late")
    printed = launch.torchrun_nodes(script, nodes=1, nproc_per_node=1, timeout=60, echo=False)  # one node: faster
    assert printed == ["first sleep longer: False\n"]  # the fact flips with the load: check-timing finds it


def pretending(mode: str, code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a Python whose start-up pretends ``mode`` (D2L_EXT_PRETEND)."""
    environment = {**os.environ, "PYTHONPATH": str(REPO / "tools" / "checks" / "pretend"), "D2L_EXT_PRETEND": mode}
    return subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=120)


def test_a_cpu_build_and_stretched_clocks_combine_in_one_run():
    code = ("import time, torch; print(torch.version.cuda, torch.__version__.endswith('+cpu'), "
            "type(time.perf_counter).__name__, type(time.sleep).__name__)")
    assert pretending("cpu-build,slow-clock", code).stdout.split() == ["None", "True", "function",
                                                                      "builtin_function_or_method"]
    assert pretending("slow-clock", code).stdout.split()[2] == "function"  # the clocks alone: torch as built
    assert pretending("cpu-build", code).stdout.split()[2] == "builtin_function_or_method"  # the build alone


@pytest.mark.parametrize("mode", ["cpu-build,gpu", "slow-clok"])
def test_pretending_two_builds_or_an_unknown_mode_stops_at_once(mode):
    done = pretending(mode, "print('ran')")
    assert done.returncode != 0 and "ran" not in done.stdout
    assert f"D2L_EXT_PRETEND={mode!r}: expected" in done.stderr
