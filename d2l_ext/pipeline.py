"""Pipeline-parallel schedules on a simulated clock, in integer ticks (chapter 9, issue 31).

A model of ``p * v`` stages is split over ``p`` ranks; rank ``r`` holds the stages ``r, r + p, ..., r + (v - 1) p``
(``v`` chunks per rank: Megatron-LM's interleaving; ``v = 1`` is the plain split). A batch is cut into ``m``
micro-batches. Each rank runs its operations one at a time, in the order its schedule gives:

- ``F``: the forward pass of one micro-batch through one stage, ``t_f`` ticks; it needs that micro-batch's
  forward through the stage before;
- ``B``: its backward pass, ``t_b`` ticks; it needs the stage's own forward and the backward of the stage after;
- ``W`` (zero-bubble schedules only): the weights' gradients, split off the backward, ``t_w`` ticks; it needs the
  stage's ``B``, and nothing waits for it, so a rank can run it where it would otherwise wait.

An operation starts when its rank is free and what it needs has finished: the simulation is exact, with no
clock but the ticks. It returns every rank's lane, the time of the whole step, the bubble (the fraction of the
ranks' time spent idle) and the most micro-batches whose activations a rank holds at once (forward done,
backward not yet). The closed forms the tests check: GPipe and 1F1B take ``(m + p - 1)(t_f + t_b)`` for
``v = 1``; interleaving takes ``(m v + p - 1)(t_f + t_b)`` with per-chunk times; ZB-H1 takes
``m (t_f + t_b + t_w) + (p - 1)(t_f + t_b - t_w)`` when ``m >= p`` and ``t_w <= min(t_f, t_b)`` (as the paper
assumes); GPipe holds ``m`` micro-batches on every rank, 1F1B and ZB-H1 at most ``p``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")


@dataclass(frozen=True)
class Op:
    """One operation of one rank: ``kind`` F or B, on ``microbatch``, through the rank's chunk ``chunk``."""

    kind: str
    microbatch: int
    chunk: int = 0


@dataclass(frozen=True)
class Slot:
    """An operation placed on the clock: it runs on ``rank`` from ``start`` to ``end`` (ticks)."""

    rank: int
    op: Op
    start: int
    end: int


@dataclass(frozen=True)
class Timeline:
    """A simulated step: every rank's operations, in the order they ran."""

    p: int
    m: int
    v: int
    lanes: tuple[tuple[Slot, ...], ...]

    @property
    def makespan(self) -> int:
        """Ticks from the first forward to the last backward."""
        return max(slot.end for lane in self.lanes for slot in lane)

    @property
    def bubble(self) -> float:
        """The fraction of the ranks' time (``p`` times the makespan) spent idle."""
        busy = sum(slot.end - slot.start for lane in self.lanes for slot in lane)
        return 1 - busy / (self.p * self.makespan)

    def in_flight(self, rank: int) -> int:
        """The most (micro-batch, chunk) pairs whose forward has run on ``rank`` and whose backward has not: their
        activations are held. Where the backward is split, a stage's inputs are held until its ``W``."""
        release = "W" if any(slot.op.kind == "W" for slot in self.lanes[rank]) else "B"
        held = peak = 0
        for slot in self.lanes[rank]:
            held += {"F": 1, release: -1}.get(slot.op.kind, 0)
            peak = max(peak, held)
        return peak


def _check(p: int, m: int, v: int) -> None:
    if p < 1 or m < 1 or v < 1:
        raise ValueError(f"stages, micro-batches and chunks must be at least 1 (p={p}, m={m}, v={v})")


def schedule(name: str, p: int, m: int, v: int = 1) -> list[list[Op]]:
    """Return each rank's operations, in order, for the schedule ``name`` (one of SCHEDULES)."""
    _check(p, m, v)
    if name == "gpipe":
        _one_chunk(name, v)
        return [[Op("F", i) for i in range(m)] + [Op("B", i) for i in range(m)] for _ in range(p)]
    if name == "1f1b":
        _one_chunk(name, v)
        orders = []
        for rank in range(p):
            warmup = min(p - rank - 1, m)  # forwards before the first backward: what the later ranks need
            order = [Op("F", i) for i in range(warmup)]
            for i in range(m - warmup):
                order += [Op("F", warmup + i), Op("B", i)]
            orders.append(order + [Op("B", i) for i in range(m - warmup, m)])
        return orders
    if name == "interleaved":
        if m % p:
            raise ValueError(f"the interleaved schedule needs micro-batches in multiples of the ranks: "
                             f"{m} is not a multiple of {p}")
        return [_interleaved(rank, p, m, v) for rank in range(p)]
    if name == "zb-h1":
        _one_chunk(name, v)
        if m < p:
            raise ValueError(f"zb-h1 needs at least as many micro-batches as stages: {m} < {p}")
        return [_zero_bubble_h1(rank, p, m) for rank in range(p)]
    raise ValueError(f"unknown schedule {name!r}: choose one of {', '.join(SCHEDULES)}")


def _one_chunk(name: str, v: int) -> None:
    if v != 1:
        raise ValueError(f"{name} runs one chunk per rank (v=1), not {v}: use 'interleaved' for v > 1")


def _interleaved(rank: int, p: int, m: int, v: int) -> list[Op]:
    """Megatron-LM's interleaved 1F1B for one rank: forwards go through the chunks p micro-batches at a time."""
    total = m * v

    def forward(k: int) -> Op:
        return Op("F", (k // (p * v)) * p + k % p, (k // p) % v)

    def backward(k: int) -> Op:
        return Op("B", (k // (p * v)) * p + k % p, v - 1 - (k // p) % v)

    warmup = total if m == p else min((p - rank - 1) * 2 + (v - 1) * p, total)
    order = [forward(k) for k in range(warmup)]
    for k in range(total - warmup):
        order += [forward(warmup + k), backward(k)]
    return order + [backward(k) for k in range(total - warmup, total)]


def _zero_bubble_h1(rank: int, p: int, m: int) -> list[Op]:
    """ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023) for one rank: 1F1B with each backward split into
    ``B`` (the input's gradient, which the rank before waits for) and ``W`` (the weights' gradients, which nobody
    waits for). Rank ``r`` keeps ``r`` weight gradients pending and runs them where 1F1B would wait."""
    warmup = min(p - rank - 1, m)
    order = [Op("F", i) for i in range(warmup)]
    pending: list[int] = []
    for i in range(m):
        order += ([Op("F", warmup + i)] if warmup + i < m else []) + [Op("B", i)]
        pending.append(i)
        if len(pending) > rank or warmup + i >= m:
            order.append(Op("W", pending.pop(0)))
    return order + [Op("W", i) for i in pending]


def simulate(orders: list[list[Op]], t_f: int = 1, t_b: int = 2, v: int = 1, t_w: int = 0) -> Timeline:
    """Run each rank's operations in order on the simulated clock; return the timeline.

    ``t_f`` and ``t_b`` are the ticks of one forward and one backward through one stage (one chunk). Raises
    ValueError if the orders wait on each other forever (a schedule that deadlocks).
    """
    p = len(orders)
    stages = p * v
    m = 1 + max(op.microbatch for order in orders for op in order)
    done: dict[tuple[str, int, int], int] = {}  # (kind, stage, micro-batch) -> end tick
    free = [0] * p
    position = [0] * p
    lanes: list[list[Slot]] = [[] for _ in range(p)]
    while any(position[r] < len(orders[r]) for r in range(p)):
        moved = False
        for rank in range(p):
            while position[rank] < len(orders[rank]):
                op = orders[rank][position[rank]]
                stage = op.chunk * p + rank
                if op.kind == "F":
                    needs = [("F", stage - 1, op.microbatch)] if stage > 0 else []
                elif op.kind == "W":
                    needs = [("B", stage, op.microbatch)]
                else:
                    needs = [("F", stage, op.microbatch)]
                    needs += [("B", stage + 1, op.microbatch)] if stage < stages - 1 else []
                if any(need not in done for need in needs):
                    break
                start = max([free[rank]] + [done[need] for need in needs])
                end = start + {"F": t_f, "B": t_b, "W": t_w}[op.kind]
                done[(op.kind, stage, op.microbatch)] = end
                lanes[rank].append(Slot(rank, op, start, end))
                free[rank], position[rank], moved = end, position[rank] + 1, True
        if not moved:
            stuck = {rank: orders[rank][position[rank]] for rank in range(p) if position[rank] < len(orders[rank])}
            raise ValueError(f"the schedule deadlocks: each rank waits on another ({stuck})")
    return Timeline(p, m, v, tuple(tuple(lane) for lane in lanes))


COLOURS = {"F": "#4C72B0", "B": "#DD8452", "W": "#55A868"}  # forward, backward (input gradient), weights
NAMES = {"F": "forward", "B": "backward", "W": "weight gradients"}


def plot_schedule(timeline: Timeline, ax: Any = None, title: str | None = None) -> Any:
    """Draw every rank's lane, rank 0 on top: one bar per operation, labelled with its micro-batch (and chunk,
    lighter for later chunks); return the matplotlib Axes."""
    import matplotlib.pyplot as plt  # here, so that the simulation itself does not need matplotlib
    from matplotlib.patches import Patch

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.45 * timeline.p + 0.8))
    for rank, lane in enumerate(timeline.lanes):
        row = timeline.p - 1 - rank
        for slot in lane:
            alpha = 1.0 - 0.45 * slot.op.chunk / max(timeline.v - 1, 1)
            ax.barh(row, slot.end - slot.start, left=slot.start, height=0.7, color=COLOURS[slot.op.kind],
                    alpha=alpha, edgecolor="black", linewidth=0.5)
            if slot.end - slot.start >= 1:
                ax.text((slot.start + slot.end) / 2, row, str(slot.op.microbatch), ha="center", va="center",
                        fontsize=7, color="white")
    ax.set_yticks(range(timeline.p), [f"rank {rank}" for rank in reversed(range(timeline.p))])
    ax.set_xlim(0, timeline.makespan)
    ax.set_xlabel("simulated ticks")
    ax.set_title(title or f"{timeline.makespan} ticks, bubble {timeline.bubble:.1%}", fontsize=10)
    kinds = [kind for kind in COLOURS if any(slot.op.kind == kind for lane in timeline.lanes for slot in lane)]
    ax.legend(handles=[Patch(facecolor=COLOURS[k], edgecolor="black") for k in kinds],
              labels=[NAMES[k] for k in kinds], loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7,
              frameon=False)
    return ax
