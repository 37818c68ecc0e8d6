"""Binder's memory, checked while nbval compares the stored outputs: a pytest plugin.

    pytest --nbval ... -p tools.checks.memory_nbval -p no:xdist NOTEBOOKS

``make check-memory`` (tools/checks/memory.py) runs each notebook with a notebook client and compares no output.
This plugin measures the same figures in an nbval run, so that CI needs no pass of the notebook suite for memory
alone (issue 45): the matrix's first run is this one (tools/envs/matrix.py).

The figures and the verdicts are check-memory's, made by its own functions: the same limit (a cgroup, a systemd
scope, or a watch of the process tree), the kernel's peak reset before each cell and read after it, the tree
sampled every 20 ms, the page cache dropped before each notebook, empty compile caches in each kernel. What
differs: the notebook client is nbval's (in the pytest process, outside the limit, as check-memory's client is
outside it), and the cell timeout is nbval's. Notebooks run one at a time (xdist refused).

A notebook over the kernel's budget, over the limit, or killed for memory fails the run (exit status 1, and a
``FAILED memory: ...`` line) even where every output matched; the table of peaks is printed at the end and
written to build/check-memory.md. Past CI's deadline (tools/deadline.py) the notebooks left are skipped and named.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path

import nbval.kernel
import pytest
from jupyter_client.manager import KernelManager

from tools import REPO
from tools.checks.limits import Limit, choose_limit, kill
from tools.checks.memory import (
    KERNEL_BUDGET,
    LIMIT,
    SAMPLE_S,
    Result,
    cell_name,
    cold_caches,
    drop_page_cache,
    judge_peaks,
    may_drop_page_cache,
    mib,
    reset_vmhwm,
    table,
    vmhwm,
)
from tools.deadline import not_run, past_deadline
from tools.outputs.compare import MEMORY_LIMIT_VARIABLE

REPORT = REPO / "build" / "check-memory.md"
# the real clock where the matrix stretches the clocks (tools/checks/pretend/sitecustomize.py): a notebook's seconds
CLOCK = getattr(time, "real_perf_counter", time.perf_counter)
PREFIX: list[str] = []  # the command that puts the next kernel inside its notebook's limit


class LimitedKernelManager(KernelManager):
    """nbval's kernel manager, its kernel started inside the limit of the notebook now running."""

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        return PREFIX + super().format_kernel_cmd(extra_arguments)


START_ATTEMPTS = 3


def start_new_kernel(*args, **kwargs):
    """nbval's start_new_kernel, tried again when a kernel dies before it answers (at most 3 times in all): the runs
    beside this one start kernels too, and a TCP port another kernel took between its choice and its use kills a
    kernel at its start ("Kernel died before replying to kernel_info", once in CI's run of 2026-11-29)."""
    for attempt in range(START_ATTEMPTS):
        try:
            return _nbval_start_new_kernel(*args, **kwargs)
        except RuntimeError:
            if attempt == START_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


_nbval_start_new_kernel = nbval.kernel.start_new_kernel


class Watch:
    """One notebook at a time: its limit, its kernel's peaks per cell, the tree's sampled peaks; then its result."""

    def __init__(self, make_limit, how: str, limit: int = LIMIT, budget: int = KERNEL_BUDGET):
        self.make_limit, self.how, self.limit, self.budget = make_limit, how, limit, budget
        self.results: list[Result] = []
        self.skipped: list[str] = []
        self.file: object = None  # the nbval notebook (IPyNbFile) now running, or skipped
        self.skipping = False
        self.held: Limit | None = None
        self.result: Result | None = None
        self.report_path = REPORT

    def start(self, file, path: Path) -> None:
        """Before nbval starts the notebook's kernel: its limit, an empty page cache, empty compile caches."""
        self.file, self.skipping = file, False
        self.result = Result(notebook=str(path.relative_to(REPO) if path.is_relative_to(REPO) else path))
        self.notebook = file.nb
        self.current: int | None = None
        self.stop, self.over, self.kills_before = threading.Event(), [], 0
        self.sampler = threading.Thread(target=self.sample, daemon=True)
        self.caches = tempfile.TemporaryDirectory(prefix="d2l-check-memory-caches-")
        self.saved = {name: os.environ.get(name) for name in cold_caches("")}
        os.environ.update(cold_caches(self.caches.name))
        self.began = CLOCK()
        try:
            held: Limit = self.make_limit(self.limit)
        except OSError as error:
            self.held = None
            self.result.problems.append(f"could not set the memory limit: {error}")
            PREFIX[:] = []
            return
        self.held = held
        self.result.limit = held.name
        drop_page_cache()
        PREFIX[:] = held.prefix()

    def sample(self) -> None:
        assert self.held is not None and self.result is not None
        while not self.stop.wait(SAMPLE_S):
            now = self.held.usage()
            if now is None:
                continue
            entry = self.result.cells.setdefault(self.current, [0, 0])
            entry[1] = max(entry[1], now)
            if not self.held.enforced and now > self.limit and not self.over:  # no system limit: stop it here
                self.over.append(self.current)
                kill(self.held.pids())

    def before_cell(self, kernel_pid: int | None, index: int) -> None:
        if self.held is None:
            return
        if self.held.kernel_pid is None and kernel_pid:
            self.held.started(kernel_pid)
            self.kills_before = self.held.oom_kills()
            self.sampler.start()
        self.current = index
        if self.held.kernel_pid:
            reset_vmhwm(self.held.kernel_pid)

    def after_cell(self) -> None:
        if self.held is None or not self.held.kernel_pid or self.result is None:
            return
        entry = self.result.cells.setdefault(self.current, [0, 0])
        entry[0] = max(entry[0], vmhwm(self.held.kernel_pid) or 0)
        self.result.kept[self.current] = vmhwm(self.held.kernel_pid, "VmRSS") or 0
        entry[1] = max(entry[1], entry[0])  # the tree holds the kernel (see tools/checks/memory.py)

    def finish(self) -> None:
        """After nbval stopped the notebook's kernel: its limit goes, its result is judged."""
        result, self.file = self.result, None
        if result is None or self.skipping:
            return
        self.stop.set()
        if self.sampler.is_alive():
            self.sampler.join()
        kills = 0
        if self.held is not None:
            kills = self.held.oom_kills() - self.kills_before
            self.held.close()
        self.caches.cleanup()
        for name, value in self.saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        result.seconds = CLOCK() - self.began
        if self.over:
            result.problems.append(f"{cell_name(self.notebook, self.over[0])}: the kernel and its processes went "
                                   f"over the limit ({mib(self.limit)}) and were stopped")
        if kills > 0:
            result.problems.append(f"the system killed {kills} process(es) for memory (the limit, {mib(self.limit)})")
        judge_peaks(result, self.notebook, self.budget)
        self.results.append(result)
        self.result = None

    def report(self) -> list[str]:
        failed = [r for r in self.results if not r.ok]
        lines = [self.how, "", table(self.results), ""]
        lines += [f"FAILED memory: {r.notebook}: {'; '.join(r.problems)}" for r in failed]
        if self.skipped:
            lines.append(not_run(", ".join(self.skipped)))
        lines.append(f"{len(self.results) - len(failed)} of {len(self.results)} notebooks within Binder's memory "
                     f"(the kernel and what it starts: {mib(self.limit)}; the kernel alone: {mib(self.budget)})")
        return lines


WATCH: Watch | None = None


def _is_cell(item: pytest.Item) -> bool:
    return type(item).__name__ == "IPyNbCell"


def _index(item) -> int:
    """The cell's place among all the notebook's cells, as check-memory names cells."""
    return next((i for i, cell in enumerate(item.parent.nb.cells) if cell is item.cell), item.cell_num)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("memory", "Binder's memory (tools/checks/memory_nbval.py)")
    group.addoption("--memory-limit", type=int, default=LIMIT, help="bytes for the kernel and what it starts")
    group.addoption("--memory-budget", type=int, default=KERNEL_BUDGET, help="bytes for the kernel alone")
    group.addoption("--memory-no-limit", action="store_true", help="watch the process tree instead of a limit")
    group.addoption("--memory-report", default=str(REPORT), help="where the table of peaks is written")


def pytest_configure(config: pytest.Config) -> None:
    global WATCH
    if getattr(config, "workerinput", None) is not None or getattr(config.option, "numprocesses", None):
        raise pytest.UsageError("tools.checks.memory_nbval runs one notebook at a time: add -p no:xdist")
    make_limit, how = choose_limit(config.option.memory_no_limit)
    if not may_drop_page_cache():
        how += "; the page cache cannot be dropped (not root): a figure is at least its kernel's"
    nbval.kernel.KernelManager = LimitedKernelManager  # type: ignore[misc]  # nbval's start_new_kernel uses it
    nbval.kernel.start_new_kernel = start_new_kernel  # RunningKernel calls it by this name
    WATCH = Watch(make_limit, how, config.option.memory_limit, config.option.memory_budget)
    # cells tagged memory-dependent are not compared (tests/nbval_harness.py): in Binder's memory they may choose
    # otherwise than the stored run did (chapter 9 starts 2 processes, not 4)
    os.environ[MEMORY_LIMIT_VARIABLE] = str(config.option.memory_limit)
    WATCH.report_path = Path(config.option.memory_report)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before the builtin setup, which starts a notebook's kernel (nbval's IPyNbFile.setup) at its first cell."""
    if WATCH is None or not _is_cell(item):
        return
    file = item.parent
    if WATCH.file is not file:
        if WATCH.file is not None:
            WATCH.finish()
        path = Path(str(item.path))
        if past_deadline():  # CI's budget is spent: this notebook is neither run nor judged
            WATCH.file, WATCH.skipping = file, True
            WATCH.skipped.append(str(path.relative_to(REPO) if path.is_relative_to(REPO) else path))
        else:
            WATCH.start(file, path)
    if WATCH.skipping:
        pytest.skip(not_run("this notebook"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    if WATCH is None or not _is_cell(item) or WATCH.file is not item.parent:
        yield
        return
    kernel = getattr(item.parent, "kernel", None)
    process = getattr(getattr(getattr(kernel, "km", None), "provisioner", None), "process", None)
    WATCH.before_cell(process.pid if process is not None else None, _index(item))
    yield
    WATCH.after_cell()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    yield  # the last cell's teardown stops the notebook's kernel (nbval's IPyNbFile.teardown)
    if WATCH is not None and _is_cell(item) and WATCH.file is item.parent and (
            nextitem is None or nextitem.parent is not item.parent):
        WATCH.finish()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if WATCH is None:
        return
    if WATCH.file is not None:
        WATCH.finish()
    WATCH.report_path.parent.mkdir(parents=True, exist_ok=True)
    WATCH.report_path.write_text("# Binder's memory, in an nbval run\n\n" + "\n".join(WATCH.report()) + "\n",
                                 encoding="utf-8")
    if any(not r.ok for r in WATCH.results) and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter) -> None:
    if WATCH is not None:
        terminalreporter.write_sep("=", "Binder's memory (tools/checks/memory_nbval.py)")
        for line in WATCH.report():
            terminalreporter.write_line(line)
