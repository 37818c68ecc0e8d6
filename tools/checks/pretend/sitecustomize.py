"""Make torch report another build or a GPU, or make time unreliable, for tools/checks/tags.py and
tools/checks/timing.py (never imported by the course itself).

Python imports this module at start-up when its folder is on PYTHONPATH. With D2L_EXT_PRETEND set it changes
what torch *reports*, not what it computes, or what the clocks report (modes joined by commas combine, as
``cpu-build,slow-clock`` in make test-matrix's first run; ``cpu-build`` and ``gpu`` exclude each other):

- ``cpu-build``: a CPU-only wheel (macOS, or ``+cpu``): no CUDA version, and CUDA calls raise AssertionError.
- ``gpu``: one CUDA GPU is reported; anything that really touches it still fails, as there is none.
- ``slow-clock``: as on a machine that is busy for part of each cell, the clocks ``time.perf_counter``,
  ``time.monotonic`` and ``time.time`` (and their ``_ns`` forms) share one timeline that runs HIGH times fast on
  one side of each cell's *turn* and LOW times fast on the other (``D2L_EXT_SLOW_CLOCK_RANGE``, default ``1,3``).
  ``D2L_EXT_SLOW_CLOCK_LOAD=early`` (the default) stretches the time before the turn, ``late`` the time after
  it; with ``D2L_EXT_SLOW_CLOCK_SWITCH_AFTER=N`` a kernel's cells numbered above N (its second Run All) take the
  other one, and the processes they start inherit it. A cell's turn is its first clock reading that comes at
  least 1 ms after the cell's first reading and from another place in the notebook's own code than the reading
  before it (see `install_slow_clock`). ``time.sleep`` sleeps as asked. It alone imports no torch. torchrun's agent
  keeps the real clocks, as its timers are not what the check is for; the workers it starts or forks stretch
  theirs (`install_in_workers`). pytest, which runs the notebooks, keeps the real clocks too (`is_harness`).

Why this module: no library makes torch report another build or a GPU, or stretches the clocks as load does.
"""

from __future__ import annotations

import os
import sys

MODE = os.environ.get("D2L_EXT_PRETEND", "")
MODES = {mode.strip() for mode in MODE.split(",") if mode.strip()}
KNOWN = {"cpu-build", "gpu", "slow-clock"}
if MODES - KNOWN or {"cpu-build", "gpu"} <= MODES:
    raise SystemExit(f"D2L_EXT_PRETEND={MODE!r}: expected 'cpu-build', 'gpu' or 'slow-clock', or 'slow-clock' with "
                     "one of the others, joined by a comma")


TURN_AFTER = 0.001  # seconds from a cell's first clock reading before its turn can come


def install_slow_clock(low: float, high: float, load: str = "early", switch_after: int | None = None,
                       launcher: dict | None = None) -> None:
    """Replace the clocks of ``time`` with ones that run ``high`` times fast on the loaded side of each cell's
    turn and ``low`` times fast on the other side: before the turn with ``load="early"``, after it with "late".

    A *cell* is one cell run by IPython (from its ``pre_run_cell`` event, or a new execution count, to the next);
    a process without IPython (a script a cell starts) is one cell. The notebook's *own code* is the frames whose
    globals are ``__main__``'s: a kernel's cells and the functions they define, or a script's. A reading *in the
    cell* is one made on the main thread with such a frame on its stack; its *place* is their (code, line) pairs.
    The *turn* is the first reading in the cell whose place differs from the reading before it and that comes at
    least TURN_AFTER after the cell's first reading: the end of the cell's first timed piece of work (from
    ``t0 = perf_counter()`` to the next reading on another line; or all the readings ``measure(f)`` makes, up to
    the first reading of a ``measure(g)`` on the next line; a reading microseconds after the first, such as
    after an outer timer's start, does not turn). Readings on other threads, or outside cells, do not move the
    turn; every reading of every thread reads the same timeline, which only moves forward. With ``switch_after``,
    cells whose execution count is above it take the other load (a kernel's second Run All). ``launcher``: the
    globals of torchrun's agent's ``__main__``, in a worker it forked, which are not the worker's own code.
    """
    import sys
    import threading
    import time

    if hasattr(time, "real_perf_counter"):
        return  # installed already
    real, real_time = time.perf_counter, time.time
    # Reentrant: from Python 3.12 the garbage collector runs where the interpreter checks for pending work, such
    # as the call to real() below, so a finalizer that reads a clock (a log record's time) runs inside the lock on
    # the same thread; a plain Lock deadlocked that thread, and every thread that read a clock after it (measured on
    # Python 3.13 with a collected cycle whose __del__ reads a clock; tests/test_check_timing.py re-enters through a
    # signal handler, which does the same on any Python)
    lock = threading.RLock()
    main_thread = threading.get_ident()
    bases = {"perf_counter": real(), "monotonic": time.monotonic(), "time": time.time()}
    # the last real reading, the stretched time since start, its current rate; the cell, its load, its first
    # reading, the place of its last reading, whether it has turned; IPython's shell, the cells it has started
    state = {"real": real(), "stretched": 0.0, "rate": high if load == "early" else low, "cell": None,
             "load": load, "first": 0.0, "place": None, "turned": False, "shell": None, "starts": 0}

    def started(info=None) -> None:
        state["starts"] += 1

    def cell() -> tuple[int, int]:
        """(IPython's execution count, cells started since the clock first saw IPython's shell), or (0, 0)."""
        shell = state["shell"]
        if shell is None:
            try:
                shell = sys.modules["IPython"].get_ipython()
            except Exception:  # not imported, or not yet whole
                return 0, 0
            if shell is None:
                return 0, 0
            state["shell"] = shell
            try:  # nbval runs cells without counting them (store_history=False): a cell starts with this event
                shell.events.register("pre_run_cell", started)
            except Exception:
                pass  # not IPython's shell: the execution count alone tells cells apart
        return shell.execution_count, state["starts"]

    def place() -> tuple:
        main = sys.modules.get("__main__")
        own = getattr(main, "__dict__", None)
        if own is launcher:
            return ()  # a worker forked by torchrun's agent, before its script runs: the agent's code, not its own
        frame, found = sys._getframe(2), []  # the clock, then what called it
        while frame is not None:
            if frame.f_globals is own:
                found.append((frame.f_code, frame.f_lineno))
                if frame.f_code.co_name == "<module>":
                    break  # the cell itself (or the script): what calls it is the kernel's machinery
            frame = frame.f_back
        return tuple(found)

    def schedule(now: float, where: tuple, number: int, starts: int) -> None:
        """At a reading in a cell (the timeline brought up to ``now``): set the rate from here on."""
        if (number, starts) != state["cell"]:  # the cell's first reading
            other = "late" if load == "early" else "early"
            cell_load = load if switch_after is None or number <= switch_after else other
            if cell_load != state["load"]:
                os.environ["D2L_EXT_SLOW_CLOCK_LOAD"] = cell_load  # for the processes this cell starts
            state.update(cell=(number, starts), load=cell_load, first=now, turned=False,
                         rate=high if cell_load == "early" else low)
        elif not state["turned"] and where != state["place"] and now - state["first"] >= TURN_AFTER:
            state.update(turned=True, rate=low if state["load"] == "early" else high)
        state["place"] = where

    def elapsed() -> float:
        # where the reading is made, found before the lock is taken (what this calls may read a clock too)
        where = place() if threading.get_ident() == main_thread else ()
        lock = locks[0]
        number, starts = cell() if where else (0, 0)
        with lock:
            now = real()
            state["stretched"] += (now - state["real"]) * state["rate"]
            state["real"] = now
            if where:  # not on another thread, nor outside the notebook's own code (the kernel between cells)
                schedule(now, where, number, starts)
            return state["stretched"]

    def clock(name: str):
        base = bases[name]
        return lambda: base + elapsed()

    def clock_ns(name: str):
        base = bases[name]
        return lambda: round((base + elapsed()) * 1e9)

    # A fork (a DataLoader's workers, torchrun's forked workers) copies the lock as it is: held, if another thread
    # was reading a clock, and then held for ever in the child. The forking thread takes it first, so the timeline is
    # whole at the fork, and the child, whose only thread is the forking one, starts with a lock of its own.
    locks = [lock]

    def after_fork_in_child() -> None:
        nonlocal main_thread
        locks[0], main_thread = threading.RLock(), threading.get_ident()

    os.register_at_fork(before=lambda: locks[0].acquire(), after_in_parent=lambda: locks[0].release(),
                        after_in_child=after_fork_in_child)
    for name in bases:
        setattr(time, name, clock(name))
        setattr(time, f"{name}_ns", clock_ns(name))
    time.real_perf_counter = real  # pyright: ignore[reportAttributeAccessIssue]  # a new attribute, for tests
    time.real_time = real_time  # pyright: ignore[reportAttributeAccessIssue]  # for CI's deadline (tools/deadline.py)


# torchrun's agent, run as ``python -m`` one of these or as the ``torchrun`` command
LAUNCHERS = ("torch.distributed.run", "torch.distributed.launch", "d2l_ext.agent")


def is_launcher(argv: list[str]) -> bool:
    """Return whether the command line ``argv`` (``sys.orig_argv``) starts torchrun's agent."""
    arguments = iter(argv[1:])
    for argument in arguments:  # the interpreter's options, up to what it runs
        if argument == "-m":
            return next(arguments, "") in LAUNCHERS
        if argument == "-c":
            return False
        if argument in ("-W", "-X"):
            next(arguments, None)  # the option's value
        elif not argument.startswith("-"):
            return os.path.basename(argument) == "torchrun"  # a script: the torchrun command, or another
    return False


def is_harness(argv: list[str]) -> bool:
    """Return whether the command line ``argv`` starts pytest: the harness that runs the notebooks keeps the real
    clocks. Its timers are nbval's cell timeout and CI's deadline (tools/deadline.py): stretched up to HIGH times,
    a notebook's cells timed out HIGH times early and CI's budget was spent HIGH times fast (CI of stop 55: 974 s
    of the memory run read as 2,863 s, and 15 notebooks were skipped). The kernels it starts stretch theirs."""
    arguments = iter(argv[1:])
    for argument in arguments:
        if argument == "-m":
            return next(arguments, "") == "pytest"
        if argument == "-c":
            return False
        if argument in ("-W", "-X"):
            next(arguments, None)
        elif not argument.startswith("-"):
            return os.path.basename(argument) in ("pytest", "py.test")
    return False


def install_in_workers(install) -> None:
    """In torchrun's agent: leave its clocks as they are, and stretch them in each worker it forks (``install``).

    The agent's timers are what make a launch fail or a node count as gone: its rendezvous' deadlines (join 600 s,
    close 30 s), heartbeats and keep-alive, its exit barrier and its watch on the workers. Load stretches none of
    them on a learner's machine: it slows the work they wait for. So they read the real clock, and a stretched
    clock there would only find torchrun's timeouts, not a fact a notebook prints. The workers run the notebook's
    scripts, whose timings are what the check is for: a worker that the agent starts as a new Python stretches its
    clocks at start-up like any process a cell starts, and one it forks (``--start-method=fork``) does so here."""
    os.register_at_fork(after_in_child=install)


if "slow-clock" in MODES:
    low, high = (float(x) for x in os.environ.get("D2L_EXT_SLOW_CLOCK_RANGE", "1,3").split(","))
    if not 1 <= low <= high:
        raise SystemExit(f"D2L_EXT_SLOW_CLOCK_RANGE: expected 'low,high' with 1 <= low <= high, not {low},{high}")
    load = os.environ.get("D2L_EXT_SLOW_CLOCK_LOAD", "early")
    if load not in ("early", "late"):
        raise SystemExit(f"D2L_EXT_SLOW_CLOCK_LOAD={load!r}: expected 'early' or 'late'")
    switch_after = os.environ.get("D2L_EXT_SLOW_CLOCK_SWITCH_AFTER")
    if is_harness(getattr(sys, "orig_argv", sys.argv)):
        pass  # pytest keeps the real clocks; the kernels and scripts it starts stretch theirs
    elif is_launcher(getattr(sys, "orig_argv", sys.argv)):
        install_in_workers(lambda: install_slow_clock(low, high, os.environ.get("D2L_EXT_SLOW_CLOCK_LOAD", load),
                                                      launcher=vars(sys.modules["__main__"])))
    else:
        install_slow_clock(low, high, load, int(switch_after) if switch_after else None)
if MODES & {"cpu-build", "gpu"}:
    import torch
    from torch.torch_version import TorchVersion

    if "cpu-build" in MODES:

        def _not_compiled(*args, **kwargs):
            raise AssertionError("Torch not compiled with CUDA enabled")

        torch.__version__ = TorchVersion(torch.__version__.split("+")[0] + "+cpu")
        torch.version.cuda = None
        torch.backends.cuda.is_built = lambda: False
        torch.cuda._lazy_init = _not_compiled
        torch.accelerator.current_accelerator = lambda check_available=False: None
    else:  # gpu
        torch.cuda.is_available = lambda: True
        torch.cuda.device_count = lambda: 1
        torch.accelerator.is_available = lambda: True
        torch.accelerator.device_count = lambda: 1
        torch.accelerator.current_accelerator = lambda check_available=False: torch.device("cuda")
        torch.accelerator.current_device_index = lambda: 0
