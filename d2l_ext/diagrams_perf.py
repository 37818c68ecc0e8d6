"""Chapter 10's drawings: a collective's measured times against its latency-bandwidth fit, and a backward pass with
its collectives on the simulated device, each collective named on its bar."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .commcost import collective_seconds
from .simqueue import SimulatedDevice
from .simqueue import plot_timeline as plot_simulated_timeline


def alpha_beta_lines(times: Mapping[str, Sequence[tuple[int, float]]], fits: Mapping[str, tuple[float, float]],
                     world_size: int = 2) -> dict[str, list[tuple[int, float, float]]]:
    """For each collective: (size in bytes, measured seconds, the fit's seconds) at every size measured."""
    return {name: [(size, seconds, collective_seconds(name, world_size, size, *fits[name]))
                   for size, seconds in points] for name, points in times.items()}


def plot_alpha_beta(times: Mapping[str, Sequence[tuple[int, float]]], fits: Mapping[str, tuple[float, float]],
                    world_size: int = 2, ax: Any = None) -> Any:
    """Draw each collective's measured times (dots) and its fitted alpha-beta model (line) against the size, both
    axes logarithmic: flat where the latency dominates, a slope of 1 where the bandwidth does. Return the Axes."""
    import matplotlib.pyplot as plt  # here, so that importing the package does not need matplotlib

    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 3.6))
    for k, (name, rows) in enumerate(alpha_beta_lines(times, fits, world_size).items()):
        sizes, measured, fitted = zip(*rows, strict=True)
        colour = f"C{k}"
        ax.loglog(sizes, [t * 1e3 for t in measured], "o", color=colour, label=f"{name}, measured")
        ax.loglog(sizes, [t * 1e3 for t in fitted], "-", color=colour, linewidth=1, label=f"{name}, fit")
    ax.set_xlabel("size S (bytes)")
    ax.set_ylabel("ms")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return ax


SHORT = {"all-reduce": "AR", "all-gather": "AG", "reduce-scatter": "RS"}


def short_name(name: str) -> str:
    """A collective's name in two letters and its layer ("reduce-scatter 3" -> "RS 3"), for a narrow bar."""
    kind, _, layer = name.partition(" ")
    return " ".join(filter(None, [SHORT.get(kind, kind), layer]))


def plot_overlap(cases: Mapping[str, SimulatedDevice], axes: Sequence[Any]) -> list[list[str]]:
    """Draw each simulated backward pass on its Axes without the host's lane (it only queues the work), and name
    each collective: inside its bar when the name fits, else in two letters under it (AR: all-reduce, AG:
    all-gather, RS: reduce-scatter). Return the labels written, case by case."""
    written = []
    for ax, (title, device) in zip(axes, cases.items(), strict=True):
        spans = [span for span in device.spans() if span.lane != "host"]
        plot_simulated_timeline(spans, ax=ax, title=title, legend=False)
        origin = min(span.start for span in spans)
        width = device.now() - origin
        labels, narrow = [], 0
        for span in (span for span in spans if span.lane == "comm"):
            middle = (span.start + span.end - 2 * origin) / 2 * 1e3
            if span.duration > 0.12 * width:
                label = span.name
                ax.text(middle, 0, label, ha="center", va="center", fontsize=7, color="white")
            else:  # under the bar, alternating between two rows so that neighbours do not overlap
                label = short_name(span.name)
                ax.text(middle, -0.55 - 0.35 * (narrow % 2), label, ha="center", va="top", fontsize=6)
                narrow += 1
            labels.append(label)
        if narrow:
            ax.set_ylim(-1.4, ax.get_ylim()[1])
        written.append(labels)
    return written
