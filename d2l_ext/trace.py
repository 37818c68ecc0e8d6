"""Read the Chrome trace that torch.profiler exports and draw it as host and device lanes.

``prof.export_chrome_trace(path)`` writes a JSON file in the Chrome trace event format: every operator,
``record_function`` range and (with a GPU) kernel and copy is a "complete" event (phase ``X``) with a start
``ts`` and a duration ``dur`` in microseconds, on a process ``pid`` and a thread ``tid``. Host events carry the
process and thread ids; device events carry the GPU's index as ``pid`` and its stream as ``tid``. Perfetto
(ui.perfetto.dev) and chrome://tracing open the same file; this module draws a small static picture of it
with matplotlib, one bar per event, so that the gaps between operators show in a notebook.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
from dataclasses import dataclass
from typing import Any

# categories that kineto (the profiler's tracing library) gives to work that runs on a device
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "memcpy", "memset"})
# record_function ranges, on the host and (as the profiler mirrors them) on the device
LABEL_CATEGORIES = frozenset({"user_annotation", "gpu_user_annotation"})


@dataclass(frozen=True)
class TraceEvent:
    """One complete event of a trace: times in microseconds from the trace's first event."""

    name: str
    category: str
    lane: str
    start: float
    duration: float

    @property
    def end(self) -> float:
        """Return when the event ends, in microseconds from the trace's first event."""
        return self.start + self.duration


def _is_device_event(event: dict[str, Any]) -> bool:
    return str(event.get("cat", "")).lower() in DEVICE_CATEGORIES or "stream" in event.get("args", {})


def _stream(event: dict[str, Any]) -> str:
    stream = event.get("args", {}).get("stream", event.get("tid"))
    return str(stream).removeprefix("stream ").strip()


def read_chrome_trace(path: str | os.PathLike[str]) -> list[TraceEvent]:
    """Return the complete events of a Chrome trace file (``.json``, or ``.json.gz`` as ``tensorboard_trace_handler``
    writes with ``use_gzip=True``), sorted by start, each in its host or device lane."""
    opener = gzip.open if os.fspath(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as file:
        data = json.load(file)
    raw = data["traceEvents"] if isinstance(data, dict) else data
    # only events on a real process: kineto also writes spans on made-up ones ("Spans", "Traces")
    complete = [e for e in raw if e.get("ph") == "X" and isinstance(e.get("pid"), int) and "dur" in e]
    if not complete:
        return []
    origin = min(float(e["ts"]) for e in complete)
    # host threads are numbered in the order they first appear: thread ids change from run to run
    threads: dict[tuple[int, Any], int] = {}
    for event in sorted(complete, key=lambda e: float(e["ts"])):
        if not _is_device_event(event):
            threads.setdefault((event["pid"], event.get("tid")), len(threads))
    events = []
    for event in complete:
        if _is_device_event(event):
            device = event.get("args", {}).get("device", event["pid"])
            lane = f"GPU {device} stream {_stream(event)}"
        else:
            lane = f"host thread {threads[(event['pid'], event.get('tid'))]}"
        events.append(TraceEvent(name=str(event.get("name", "")), category=str(event.get("cat", "")), lane=lane,
                                 start=float(event["ts"]) - origin, duration=float(event["dur"])))
    return sorted(events, key=lambda e: (e.start, -e.duration))


def lanes(events: list[TraceEvent]) -> dict[str, list[TraceEvent]]:
    """Return the events by lane: host threads first, then device streams, each lane's events by start."""
    grouped: dict[str, list[TraceEvent]] = {}
    for event in sorted(events, key=lambda e: e.start):
        grouped.setdefault(event.lane, []).append(event)
    return dict(sorted(grouped.items(), key=lambda item: (not item[0].startswith("host"), item[0])))


def ranges(events: list[TraceEvent], name: str | None = None) -> list[TraceEvent]:
    """Return the ``record_function`` ranges (named ``name``, if given) as the host ran them, by start.

    On a GPU the profiler also copies each range onto the device's stream (category ``gpu_user_annotation``,
    spanning the range's kernels), so selecting ranges by name alone counts each one twice.
    """
    return sorted((e for e in events if e.category == "user_annotation" and (name is None or e.name == name)),
                  key=lambda e: e.start)


def device_work(events: list[TraceEvent]) -> list[TraceEvent]:
    """Return the work the devices did (kernels, copies, memsets), without the copies of the host's ranges: a
    range spans the gaps between its kernels, so counting it would call an idle device busy."""
    return [e for e in events if e.lane.startswith("GPU") and e.category not in LABEL_CATEGORIES]


def host_rows(averages: Any) -> list[Any]:
    """Return the rows of ``prof.key_averages()`` that ran on the host (operators and ``record_function`` ranges).

    With a GPU in the profile, each range has a second row, its device copy (same name, device type CUDA), and
    each kernel its own row: counting calls over every row would count each range twice.
    """
    from torch.profiler import DeviceType  # here, so that reading a trace does not import torch

    return [row for row in averages if row.device_type == DeviceType.CPU]


def without_device_ranges(averages: Any) -> Any:
    """Return ``prof.key_averages()`` without the device copies of ``record_function`` ranges, ready for
    ``.table(sort_by="self_device_time_total")``: a copy's device time is its whole span, so it tops the table
    without being work."""
    from torch.profiler import DeviceType

    kept = [row for row in averages if not (row.is_user_annotation and row.device_type != DeviceType.CPU)]
    table = copy.copy(averages)  # an EventList, with its settings (device, memory, flops columns)
    del table[:]
    table.extend(kept)
    return table


def busy_fraction(events: list[TraceEvent], start: float | None = None, end: float | None = None) -> float:
    """Return the share of the time from ``start`` to ``end`` (default: the events' span) that the events cover."""
    if not events:
        return 0.0
    start = min(e.start for e in events) if start is None else start
    end = max(e.end for e in events) if end is None else end
    covered, reached = 0.0, start
    for event in sorted(events, key=lambda e: e.start):  # the union of the intervals, clipped to [start, end]
        lo, hi = max(event.start, reached), min(event.end, end)
        if hi > lo:
            covered += hi - lo
            reached = hi
    return covered / (end - start) if end > start else 0.0


def _depths(labels: list[TraceEvent]) -> list[int]:
    """Return each range's nesting depth among ``labels`` (sorted by start): 0 for the outermost."""
    open_ends: list[float] = []
    depths = []
    for event in labels:
        while open_ends and open_ends[-1] <= event.start:
            open_ends.pop()
        depths.append(len(open_ends))
        open_ends.append(event.end)
    return depths


def plot_timeline(events: list[TraceEvent], ax: Any = None, title: str | None = None,
                  skip_categories: tuple[str, ...] = ("python_function",), fontsize: float = 7) -> Any:
    """Draw the events as one bar each, a row per lane (record_function ranges above); return the matplotlib Axes."""
    import matplotlib.pyplot as plt  # here, so that reading a trace does not need matplotlib
    from matplotlib.patches import Patch

    if ax is None:
        _, ax = plt.subplots(figsize=(9, 2.5))
    shown = [e for e in events if e.category not in skip_categories]
    if not shown:
        ax.set_title(title or "no events")
        return ax
    origin = min(e.start for e in shown)
    span = max(e.end for e in shown) - origin
    colours = plt.get_cmap("tab10")
    names_seen: dict[str, int] = {}  # one colour per range name, so that "forward" looks the same in every step
    axes_inches = ax.get_position().width * ax.figure.get_figwidth()
    row, ticks, names = 0.0, [], []
    for lane, lane_events in reversed(list(lanes(shown).items())):  # the first lane on top
        labels = [e for e in lane_events if e.category in LABEL_CATEGORIES]
        work = [e for e in lane_events if e.category not in LABEL_CATEGORIES]
        colour = "tab:orange" if lane.startswith("GPU") else "tab:blue"
        ax.broken_barh([((e.start - origin) / 1e3, e.duration / 1e3) for e in work], (row, 0.8),
                       facecolors=colour, edgecolor="none")
        ticks.append(row + 0.4)
        names.append(f"{lane}: {'kernels, copies' if lane.startswith('GPU') else 'operators'}")
        row += 1
        depths = _depths(labels)
        for depth in range(max(depths, default=-1), -1, -1):  # the outermost ranges on top
            for event in (e for e, d in zip(labels, depths, strict=True) if d == depth):
                left, width = (event.start - origin) / 1e3, event.duration / 1e3
                colour = colours(names_seen.setdefault(event.name, len(names_seen)) % 10)
                ax.broken_barh([(left, width)], (row, 0.8), facecolors=colour, alpha=0.35,
                               edgecolor="black", linewidth=0.5)
                # a name only where it fits: a character is about 0.6 font sizes wide, 72 points an inch
                if event.duration / span * axes_inches >= (len(event.name) + 1) * 0.6 * fontsize / 72:
                    ax.text(left + width / 2, row + 0.4, event.name, ha="center", va="center", fontsize=fontsize,
                            clip_on=True)
            ticks.append(row + 0.4)
            names.append(f"{lane}: record_function" if depth == 0 else f"ranges inside (level {depth + 1})")
            row += 1
        row += 0.3
    ax.set_yticks(ticks, names, fontsize=8)
    ax.set_xlim(0, span / 1e3)
    ax.set_xlabel("ms from the first event")
    # a legend, so that every box can be told apart where its name does not fit inside it
    handles = [Patch(facecolor="tab:blue", label="operator (host)")]
    if any(lane.startswith("GPU") for lane in lanes(shown)):
        handles.append(Patch(facecolor="tab:orange", label="kernel or copy (device)"))
    handles += [Patch(facecolor=colours(index % 10), alpha=0.35, edgecolor="black", linewidth=0.5, label=name)
                for name, index in names_seen.items()]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=fontsize, frameon=False,
              title="record_function ranges: boxes" if names_seen else None, title_fontsize=fontsize)
    if title:
        ax.set_title(title, fontsize=10)
    return ax
