"""A simulated device queue: watch asynchronous execution happen on a machine without a GPU.

A GPU call puts a kernel in the device's queue and returns; the device works through the queue while Python
moves on, and reading a result on the host (``.item()``) or ``synchronize()`` waits for the queue. A CPU runs
each operation inside the call, so none of this can be seen on a laptop.

``SimulatedDevice`` is a small discrete-event model of that queue, on a virtual clock:

- the host has a clock; it moves only by what the host is given to do: ``host_work(seconds)``, and each
  ``launch`` (``launch_seconds`` of host time);
- each engine (``"compute"``, ``"copy"`` and ``"comm"``: a GPU's compute units, its copy engine, the stream its
  collectives run on) starts a kernel when the kernel has been issued, the engine is free, and the work it
  waits for (``after=``) is done;
- ``.item()``, ``synchronize()`` and ``Event.synchronize()`` move the host's clock forward to the moment the
  device has finished what they wait for; ``Event.query()`` and ``Event.elapsed_time()`` read the clock.

Nothing sleeps and no thread runs: every duration, timeline and fact it gives is exact, the same on every
machine and every run, however busy the machine is. It is a model with durations you choose, not a
measurement of a GPU. Every launch, host work, wait and kernel is recorded, so that ``plot_timeline`` draws
what happened.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

ENGINES = ("compute", "copy", "comm")  # comm: the stream a collective runs on (NCCL's own, in DDP and FSDP)
# lane order (top to bottom) and colour of each kind of span in plot_timeline
LANES = ("host", "compute", "copy", "comm")
COLOURS = {"launch": "tab:blue", "host work": "tab:gray", "waiting": "white", "kernel": "tab:orange",
           "copy": "tab:green", "collective": "tab:purple"}
KINDS = {"compute": "kernel", "copy": "copy", "comm": "collective"}  # the kind each engine's spans have


def _ns(seconds: float) -> int:
    """Return ``seconds`` as whole nanoseconds: the clock counts integers, so sums and comparisons are exact."""
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative: {seconds}")
    return round(seconds * 1e9)


@dataclass(frozen=True)
class Span:
    """One recorded activity: its lane (host, compute, copy), kind, name, and start and end in nanoseconds."""

    lane: str
    kind: str
    name: str
    start_ns: int
    end_ns: int

    @property
    def start(self) -> float:
        """Return when the span started, in seconds on the simulated clock."""
        return self.start_ns / 1e9

    @property
    def end(self) -> float:
        """Return when the span ended, in seconds on the simulated clock."""
        return self.end_ns / 1e9

    @property
    def duration(self) -> float:
        """Return how long the span lasted, in seconds."""
        return (self.end_ns - self.start_ns) / 1e9


class SimulatedTensor:
    """What ``launch`` returns: a result that exists once its kernel has run on the simulated device."""

    def __init__(self, device: SimulatedDevice, name: str, ready_ns: int, value: float) -> None:
        self.device, self.name = device, name
        self._ready_ns = ready_ns  # when its kernel ends on the device
        self._value = value

    def query(self) -> bool:
        """Return whether the kernel has finished by the host's clock, without waiting (as ``Event.query``)."""
        return self.device._host_ns >= self._ready_ns

    def wait(self) -> None:
        """Move the host's clock to the end of the kernel, recording the wait on the host lane."""
        self.device._wait_until(self._ready_ns, f"waiting for {self.name}")

    def item(self) -> float:
        """Return the kernel's value as a Python number, after waiting for it (as ``tensor.item()``)."""
        self.wait()
        return self._value

    def __add__(self, other: SimulatedTensor) -> SimulatedTensor:
        """Queue an addition on the device (a kernel that lasts ``device.add_seconds``) and return its result."""
        return self.device.launch(self.device.add_seconds, "add", value=self._value + other._value,
                                  after=(self, other))


class SimulatedEvent(SimulatedTensor):
    """A mark in an engine's queue: it records the simulated clock when the engine reaches it."""

    def elapsed_time(self, end: SimulatedEvent) -> float:
        """Return the device time from this event to ``end`` in milliseconds (as ``torch.cuda.Event``)."""
        if not (self.query() and end.query()):
            raise RuntimeError("an event has not been reached yet: synchronize() first")
        return (end._ready_ns - self._ready_ns) / 1e6

    def synchronize(self) -> None:
        """Wait until the engine has reached this event."""
        self.wait()


class SimulatedDevice:
    """A pretend accelerator on a virtual clock: a queue per engine, kernels of known duration (see the module)."""

    def __init__(self, launch_seconds: float = 0.0, add_seconds: float = 0.0) -> None:
        self.launch_seconds = launch_seconds  # host time a launch takes (a GPU's is some microseconds)
        self.add_seconds = add_seconds  # device time of the "add" kernel that ``a + b`` queues
        self._host_ns = 0
        self._free_ns = dict.fromkeys(ENGINES, 0)  # when each engine has finished what it was given
        self._spans: list[Span] = []

    def now(self) -> float:
        """Return the host's simulated clock: seconds since the device was created (or since ``clear``)."""
        return self._host_ns / 1e9

    def _record(self, lane: str, kind: str, name: str, start_ns: int, end_ns: int) -> None:
        self._spans.append(Span(lane, kind, name, start_ns, end_ns))

    def _wait_until(self, ready_ns: int, name: str) -> None:
        if ready_ns > self._host_ns:
            self._record("host", "waiting", name, self._host_ns, ready_ns)
            self._host_ns = ready_ns

    def launch(self, seconds: float, name: str = "kernel", *, engine: str = "compute",
               value: float | Callable[[], float] | None = None,
               after: Iterable[SimulatedTensor] = (), kind: str | None = None) -> SimulatedTensor:
        """Queue a kernel that runs for ``seconds`` on ``engine`` and return its result at once, unfinished.

        The host's clock moves by ``launch_seconds``; the kernel starts when it has been issued, ``engine`` is
        free and every result in ``after`` is ready. ``value`` is what ``.item()`` returns (or a function that
        gives it); ``kind`` ("kernel", "copy" or "collective", by default the engine's) only colours the timeline.
        """
        if engine not in self._free_ns:
            raise ValueError(f"engine must be one of {ENGINES}, not {engine!r}")
        kind = kind or KINDS[engine]
        issued = self._host_ns + _ns(self.launch_seconds)
        self._record("host", "launch", f"launch {name}", self._host_ns, issued)
        self._host_ns = issued
        start = max([issued, self._free_ns[engine], *(earlier._ready_ns for earlier in after)])
        end = start + _ns(seconds)
        self._free_ns[engine] = end
        self._record(engine, kind, name, start, end)
        result_value = value() if callable(value) else value
        return SimulatedTensor(self, name, end, 0.0 if result_value is None else result_value)

    def record_event(self, engine: str = "compute") -> SimulatedEvent:
        """Queue an event on ``engine`` and return it: it takes the clock when the engine reaches it."""
        if engine not in self._free_ns:
            raise ValueError(f"engine must be one of {ENGINES}, not {engine!r}")
        reached = max(self._host_ns, self._free_ns[engine])
        return SimulatedEvent(self, "event", reached, reached / 1e9)

    def synchronize(self) -> None:
        """Move the host's clock to when every engine has finished its queue (as ``torch.cuda.synchronize``)."""
        self._wait_until(max(self._free_ns.values()), "synchronize")

    def host_work(self, seconds: float, name: str = "Python work") -> None:
        """Spend ``seconds`` of host time on something else (preparing data, logging): the device runs on."""
        end = self._host_ns + _ns(seconds)
        self._record("host", "host work", name, self._host_ns, end)
        self._host_ns = end

    def spans(self) -> list[Span]:
        """Return what was recorded so far, sorted by start (the host's lane first at equal starts)."""
        return sorted(self._spans, key=lambda s: (s.start_ns, LANES.index(s.lane)))

    def clear(self) -> None:
        """Wait for the queues, then forget the recorded spans and restart the clock at zero."""
        self.synchronize()
        self._spans.clear()
        self._host_ns = 0
        self._free_ns = dict.fromkeys(ENGINES, 0)

    def close(self) -> None:
        """Finish the queued work (as leaving a program does); nothing else to release."""
        self.synchronize()

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
        if span.duration:
            ax.broken_barh([((span.start - origin) * 1e3, span.duration * 1e3)], (rows[span.lane] - 0.35, 0.7),
                           facecolors=COLOURS[span.kind], edgecolor="black", linewidth=0.5)
        else:  # an instant (a launch that costs no modelled time): a tick, so that it can still be seen
            ax.vlines((span.start - origin) * 1e3, rows[span.lane] - 0.35, rows[span.lane] + 0.35,
                      colors=COLOURS[span.kind], linewidth=1.5)
    ax.set_yticks(list(rows.values()), [f"simulated {lane}" if lane != "host" else lane for lane in rows])
    ax.set_ylim(-0.6, len(used) - 0.4)
    ax.set_xlabel("simulated ms")
    if title:
        ax.set_title(title, fontsize=10)
    if legend:  # beside the lanes, never over a bar
        kinds = [kind for kind in COLOURS if any(s.kind == kind for s in spans)]
        ax.legend(handles=[Patch(facecolor=COLOURS[k], edgecolor="black") for k in kinds], labels=kinds,
                  loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    return ax
