"""A simulated device queue: watch asynchronous execution happen on a machine without a GPU.

A GPU call puts a kernel in the device's queue and returns; the device works through the queue while Python
moves on, and reading a result on the host (``.item()``) or ``synchronize()`` waits for the queue. A CPU runs
each operation inside the call, so none of this can be seen on a laptop. ``SimulatedDevice`` does it with
threads: ``launch`` puts a "kernel" of known duration in an engine's queue and returns at once; a worker
thread per engine runs the queue in order, each kernel a ``time.sleep`` (which releases the GIL, so the host
thread keeps running meanwhile). Two engines, ``"compute"`` and ``"copy"``, run side by side as a GPU's compute
units and its copy engine do; ``after=`` makes a kernel wait for work on another engine, as ``wait_event`` does
across streams. Every launch, host work, wait and kernel is recorded with its start and end, so that
``plot_timeline`` draws what happened. The durations are set by you: a simulation of the queue model, not a
measurement of a GPU.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

ENGINES = ("compute", "copy")
# lane order (top to bottom) and colour of each kind of span in plot_timeline
LANES = ("host", "compute", "copy")
COLOURS = {"launch": "tab:blue", "host work": "tab:gray", "waiting": "white", "kernel": "tab:orange",
           "copy": "tab:green"}


@dataclass(frozen=True)
class Span:
    """One recorded activity: its lane (host, compute, copy), kind, name, and start and end in seconds."""

    lane: str
    kind: str
    name: str
    start: float
    end: float

    @property
    def duration(self) -> float:
        """Return how long the span lasted, in seconds."""
        return self.end - self.start


class SimulatedTensor:
    """What ``launch`` returns: a result that exists once its kernel has run on the simulated device."""

    def __init__(self, device: SimulatedDevice, name: str) -> None:
        self.device, self.name = device, name
        self._done = threading.Event()
        self._value: float = 0.0

    def query(self) -> bool:
        """Return whether the kernel has finished, without waiting (as ``torch.cuda.Event.query``)."""
        return self._done.is_set()

    def wait(self) -> None:
        """Block the host until the kernel has finished, recording the wait on the host lane."""
        with self.device._record("host", "waiting", f"waiting for {self.name}"):
            self._done.wait()

    def item(self) -> float:
        """Return the kernel's value as a Python number, after waiting for it (as ``tensor.item()``)."""
        self.wait()
        return self._value

    def __add__(self, other: SimulatedTensor) -> SimulatedTensor:
        """Queue an addition on the device (a kernel that lasts ``device.add_seconds``) and return its result."""
        return self.device.launch(self.device.add_seconds, "add", value=lambda: self._value + other._value,
                                  after=(self, other))


class SimulatedEvent(SimulatedTensor):
    """A mark in an engine's queue: it records the simulated device's clock when the engine reaches it."""

    def elapsed_time(self, end: SimulatedEvent) -> float:
        """Return the device time from this event to ``end`` in milliseconds (as ``torch.cuda.Event``)."""
        if not (self.query() and end.query()):
            raise RuntimeError("an event has not been reached yet: synchronize() first")
        return (end._value - self._value) * 1e3

    def synchronize(self) -> None:
        """Wait until the engine has reached this event."""
        self.wait()


@dataclass
class _Kernel:
    result: SimulatedTensor
    seconds: float
    kind: str
    value: float | Callable[[], float] | None
    after: tuple[SimulatedTensor, ...]


class SimulatedDevice:
    """A pretend accelerator: one queue and worker thread per engine, kernels of known duration (see the module)."""

    def __init__(self, launch_seconds: float = 0.0, add_seconds: float = 0.0) -> None:
        self.launch_seconds = launch_seconds  # host time a launch takes (a GPU's is some microseconds)
        self.add_seconds = add_seconds  # device time of the "add" kernel that ``a + b`` queues
        self._origin = time.perf_counter()
        self._spans: list[Span] = []
        self._lock = threading.Lock()
        self._queues: dict[str, queue.Queue[_Kernel | None]] = {engine: queue.Queue() for engine in ENGINES}
        self._workers = [threading.Thread(target=self._work, args=(engine,), daemon=True, name=f"simulated {engine}")
                         for engine in ENGINES]
        for worker in self._workers:
            worker.start()

    def now(self) -> float:
        """Return the simulated device's clock: seconds since it was created (or since ``clear``)."""
        return time.perf_counter() - self._origin

    @contextmanager
    def _record(self, lane: str, kind: str, name: str) -> Iterator[None]:
        start = self.now()
        try:
            yield
        finally:
            with self._lock:
                self._spans.append(Span(lane, kind, name, start, self.now()))

    def _work(self, engine: str) -> None:
        work = self._queues[engine]
        while (kernel := work.get()) is not None:
            for earlier in kernel.after:  # work on another engine that this kernel must wait for
                earlier._done.wait()
            with self._record(engine, kernel.kind, kernel.result.name):
                if isinstance(kernel.result, SimulatedEvent):
                    kernel.result._value = self.now()
                time.sleep(kernel.seconds)  # releases the GIL: the host thread runs meanwhile
                value = kernel.value() if callable(kernel.value) else kernel.value
                if value is not None:
                    kernel.result._value = value
            kernel.result._done.set()
            work.task_done()
        work.task_done()

    def launch(self, seconds: float, name: str = "kernel", *, engine: str = "compute",
               value: float | Callable[[], float] | None = None,
               after: Iterable[SimulatedTensor] = (), kind: str | None = None) -> SimulatedTensor:
        """Queue a kernel that runs for ``seconds`` on ``engine`` and return its result at once, unfinished.

        ``value`` is what ``.item()`` returns (or a function the device calls); ``kind`` ("kernel" or "copy",
        by default the engine's) only colours the timeline.
        """
        if engine not in self._queues:
            raise ValueError(f"engine must be one of {ENGINES}, not {engine!r}")
        result = SimulatedTensor(self, name)
        kind = kind or ("copy" if engine == "copy" else "kernel")
        with self._record("host", "launch", f"launch {name}"):
            if self.launch_seconds:
                time.sleep(self.launch_seconds)
        self._queues[engine].put(_Kernel(result, seconds, kind, value, tuple(after)))
        return result

    def record_event(self, engine: str = "compute") -> SimulatedEvent:
        """Queue an event on ``engine`` and return it; it takes the device's clock when the engine reaches it."""
        event = SimulatedEvent(self, "event")
        self._queues[engine].put(_Kernel(event, 0.0, "event", None, ()))
        return event

    def synchronize(self) -> None:
        """Block the host until every engine's queue is empty (as ``torch.cuda.synchronize``)."""
        with self._record("host", "waiting", "synchronize"):
            for work in self._queues.values():
                work.join()

    @contextmanager
    def host_work(self, name: str = "Python work") -> Iterator[None]:
        """Record the block's time on the host lane as host work (data preparation, logging, ...)."""
        with self._record("host", "host work", name):
            yield

    def spans(self) -> list[Span]:
        """Return what was recorded so far (events left out), sorted by start."""
        with self._lock:
            return sorted((s for s in self._spans if s.kind != "event"), key=lambda s: s.start)

    def clear(self) -> None:
        """Wait for the queues, then forget the recorded spans and restart the clock at zero."""
        self.synchronize()
        with self._lock:
            self._spans.clear()
            self._origin = time.perf_counter()

    def close(self) -> None:
        """Finish the queued work and stop the worker threads."""
        for work in self._queues.values():
            work.put(None)
        for worker in self._workers:
            worker.join()

    def __enter__(self) -> SimulatedDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def plot_timeline(spans: list[Span], ax: Any = None, title: str | None = None, legend: bool = True) -> Any:
    """Draw the spans as bars, host lane on top and each engine below; return the matplotlib Axes."""
    import matplotlib.pyplot as plt  # here, so that the simulation itself does not need matplotlib
    from matplotlib.patches import Patch

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 1.8))
    used = [lane for lane in LANES if any(s.lane == lane for s in spans)]
    rows = {lane: len(used) - 1 - i for i, lane in enumerate(used)}
    origin = min((s.start for s in spans), default=0.0)
    for span in spans:
        ax.broken_barh([((span.start - origin) * 1e3, span.duration * 1e3)], (rows[span.lane] - 0.35, 0.7),
                       facecolors=COLOURS[span.kind], edgecolor="black", linewidth=0.5)
    ax.set_yticks(list(rows.values()), [f"simulated {lane}" if lane != "host" else lane for lane in rows])
    ax.set_ylim(-0.6, len(used) - 0.4)
    ax.set_xlabel("ms")
    if title:
        ax.set_title(title, fontsize=10)
    if legend:  # beside the lanes, never over a bar
        kinds = [kind for kind in COLOURS if any(s.kind == kind for s in spans)]
        ax.legend(handles=[Patch(facecolor=COLOURS[k], edgecolor="black") for k in kinds], labels=kinds,
                  loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    return ax
