"""What a collective costs: bytes on the wire, a latency-bandwidth model, and bandwidth the nccl-tests way.

A ring collective on n ranks moves its data in steps; in each step every rank sends one chunk to the next rank.
Each step costs a latency ``alpha`` (seconds) and its bytes at the link's bandwidth ``beta`` (bytes/s):

    time = steps x alpha + bytes sent by a rank / beta

with, for a tensor of S bytes (the whole result for all_gather, the whole input for reduce_scatter):

| collective     | steps    | bytes a rank sends | nccl-tests' bus factor |
|----------------|----------|--------------------|------------------------|
| all_reduce     | 2(n - 1) | 2(n - 1)/n x S     | 2(n - 1)/n             |
| all_gather     | n - 1    | (n - 1)/n x S      | (n - 1)/n              |
| reduce_scatter | n - 1    | (n - 1)/n x S      | (n - 1)/n              |
| all_to_all     | n - 1    | (n - 1)/n x S      | (n - 1)/n              |
| broadcast      | n - 1    | S                  | 1                      |

nccl-tests prints two bandwidths: *algbw* = S / time, what the caller sees, and *busbw* = algbw x the bus factor,
the rate each link actually carried. busbw can be compared with the link's speed whatever n is; algbw cannot.

``ring_all_reduce`` is the algorithm written with point-to-point messages: a reduce-scatter (n - 1 steps, each
rank ends with the sum of one chunk) then an all-gather (n - 1 steps). It takes an ``exchange`` function, so that
the same lines run over ``torch.distributed`` (chapters 9 and 10's scripts) and inside one process (the tests).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .diagrams import bucket_schedule
from .simqueue import SimulatedDevice

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


# DDP's first gradient bucket holds 1 MiB (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES), the others bucket_cap_mb
# (25 MiB by default): a model with fewer gradient bytes has one bucket, and nothing to overlap
DDP_FIRST_BUCKET_BYTES = 1 << 20


def _check(collective: str, world_size: int, nbytes: float | None = None) -> None:
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}: the model knows {', '.join(COLLECTIVES)}")
    if world_size < 2:
        raise ValueError(f"a collective needs at least 2 ranks, got {world_size}")
    if nbytes is not None and not nbytes > 0:
        raise ValueError(f"the size must be positive, got {nbytes!r} bytes")


def ring_steps(collective: str, world_size: int) -> int:
    """How many send steps a ring takes: 2(n - 1) for all_reduce, n - 1 for the others (broadcast: the root's data
    passes down a chain of n ranks)."""
    _check(collective, world_size)
    return 2 * (world_size - 1) if collective == "all_reduce" else world_size - 1


def bus_factor(collective: str, world_size: int) -> float:
    """nccl-tests' factor from algbw to busbw: 2(n - 1)/n for all_reduce, 1 for broadcast (every rank but the last
    forwards all S bytes), (n - 1)/n for the others."""
    if collective == "broadcast":
        _check(collective, world_size)
        return 1.0
    return ring_steps(collective, world_size) / world_size


def bytes_sent_per_rank(collective: str, world_size: int, nbytes: float) -> float:
    """Bytes each rank sends in a ring collective on a tensor of ``nbytes`` (see the table above)."""
    _check(collective, world_size, nbytes)
    return bus_factor(collective, world_size) * nbytes


def algbw_busbw(collective: str, world_size: int, nbytes: float, seconds: float) -> tuple[float, float]:
    """(algbw, busbw) in bytes/s, as nccl-tests reports them, for a collective on ``nbytes`` that took ``seconds``."""
    _check(collective, world_size, nbytes)
    if not seconds > 0:
        raise ValueError(f"the time must be positive, got {seconds!r} s")
    algbw = nbytes / seconds
    return algbw, algbw * bus_factor(collective, world_size)


def collective_seconds(collective: str, world_size: int, nbytes: float, alpha: float, beta: float) -> float:
    """The model's time: steps x alpha + bytes a rank sends / beta."""
    if not (alpha >= 0 and beta > 0):
        raise ValueError(f"alpha must be at least 0 and beta positive, got alpha={alpha!r}, beta={beta!r}")
    return ring_steps(collective, world_size) * alpha + bytes_sent_per_rank(collective, world_size, nbytes) / beta


def fit_alpha_beta(collective: str, world_size: int, sizes: Sequence[float],
                   seconds: Sequence[float]) -> tuple[float, float]:
    """Fit (alpha, beta) of the model to measured times of ``collective`` on tensors of ``sizes`` bytes.

    A least-squares line through (bytes sent, time), each point weighted by 1/time so that small sizes (where the
    latency shows) count as much as large ones (where the bandwidth shows). A negative intercept (noise at small
    sizes) is fitted again through zero latency. Raises ``ValueError`` with fewer than two distinct sizes (two
    parameters need two points) or when the times do not grow with the size.
    """
    if len(sizes) != len(seconds):
        raise ValueError(f"{len(sizes)} sizes but {len(seconds)} times")
    if len(set(sizes)) < 2:
        raise ValueError(f"fitting alpha and beta needs at least 2 distinct sizes, got {len(set(sizes))}: "
                         "time more sizes")
    if any(not t > 0 for t in seconds):
        raise ValueError("every time must be positive")
    x = torch.tensor([bytes_sent_per_rank(collective, world_size, s) for s in sizes], dtype=torch.float64)
    t = torch.tensor(list(seconds), dtype=torch.float64)
    w = 1 / t
    design = torch.stack([torch.ones_like(x), x], dim=1) * w[:, None]
    intercept, slope = torch.linalg.lstsq(design, (t * w)[:, None]).solution[:, 0].tolist()
    if intercept < 0:
        intercept, slope = 0.0, float(((x * w) @ (t * w)) / ((x * w) @ (x * w)))
    if not slope > 0:
        raise ValueError("the times do not grow with the size: no bandwidth can be fitted")
    return intercept / ring_steps(collective, world_size), 1 / slope


def exposed_seconds(comm: Sequence[float], compute: Sequence[float]) -> list[float]:
    """Communication not hidden behind computation, bucket by bucket: max(0, comm - compute) for each pair."""
    if len(comm) != len(compute):
        raise ValueError(f"{len(comm)} communication times but {len(compute)} computation times")
    return [max(0.0, c - w) for c, w in zip(comm, compute, strict=True)]


def exposed_after_backward(backward: Sequence[float], buckets: Sequence[int], allreduce: Sequence[float]) -> float:
    """How much later a DDP step's last all-reduce ends than its backward pass: the communication left exposed.

    ``backward`` are the layers' backward times, last layer first; ``buckets`` how many consecutive layers each
    gradient bucket holds; ``allreduce`` each bucket's all-reduce time (from ``collective_seconds``). The schedule
    is chapter 6's (``d2l_ext.diagrams.bucket_schedule``, which ``draw_ddp_buckets`` draws): a bucket's all-reduce
    starts when its last gradient is computed and the all-reduce before it is done.
    """
    intervals = bucket_schedule(list(backward), list(buckets), list(allreduce))
    return max(i.end for i in intervals if i.lane == "all-reduce") - sum(backward)


def ring_all_reduce(tensor: torch.Tensor, rank: int, world_size: int,
                    exchange: Callable[[torch.Tensor, int, torch.Tensor, int], Any]) -> int:
    """Sum ``tensor`` over ``world_size`` ranks in place with point-to-point messages; return the bytes it sent.

    ``exchange(outgoing, to_rank, incoming, from_rank)`` sends one chunk to the next rank while it receives one
    from the previous rank into ``incoming`` (``dist_exchange`` does it with ``torch.distributed``; the tests
    with queues). The tensor is cut into n chunks along its flattened length (``tensor_split``: the first ones
    one element longer where n does not divide it). Reduce-scatter: in step s, rank r sends chunk (r - s) mod n
    and adds what it receives into chunk (r - s - 1) mod n; after n - 1 steps rank r holds the whole sum of chunk
    (r + 1) mod n. All-gather: the sums travel round the ring the same way, n - 1 steps, each replacing a chunk.
    Each rank sends 2(n - 1) chunks: 2(n - 1)/n of the tensor's bytes when n divides it.
    """
    if world_size < 2 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} of {world_size}: a ring needs 2 or more ranks and a rank among them")
    chunks = list(tensor.view(-1).tensor_split(world_size))
    after, before = (rank + 1) % world_size, (rank - 1) % world_size
    sent = 0
    for phase in ("reduce-scatter", "all-gather"):
        for step in range(world_size - 1):
            out = (rank - step + (phase == "all-gather")) % world_size  # the chunk this rank passes on
            into = (out - 1) % world_size  # the chunk it receives from the previous rank
            incoming = torch.empty_like(chunks[into])
            exchange(chunks[out], after, incoming, before)
            sent += chunks[out].numel() * chunks[out].element_size()
            if phase == "reduce-scatter":
                chunks[into] += incoming
            else:
                chunks[into].copy_(incoming)
    return sent


def dist_exchange(outgoing: torch.Tensor, to_rank: int, incoming: torch.Tensor, from_rank: int) -> None:
    """``ring_all_reduce``'s exchange over ``torch.distributed``: the send and the receive issued in one batch
    (with NCCL, a send and a receive issued apart may wait on each other)."""
    import torch.distributed as dist

    for request in dist.batch_isend_irecv([dist.P2POp(dist.isend, outgoing, to_rank),
                                           dist.P2POp(dist.irecv, incoming, from_rank)]):
        request.wait()


def simulate_backward(backward: Sequence[float], after: Sequence[tuple[str, float, int]] = (),
                      before: Sequence[tuple[str, float, int]] = ()) -> SimulatedDevice:
    """Play a backward pass and its collectives on a ``SimulatedDevice``; return the device, to read or draw.

    ``backward`` are the layers' backward times in the order autograd runs them (the last layer first), on the
    compute engine. Each ``(name, seconds, layer)`` of ``after`` is a collective that starts once backward
    ``layer`` is done (a DDP bucket's all-reduce, an FSDP layer's reduce-scatter); each of ``before`` one that
    backward ``layer`` waits for (FSDP's all-gather of the layer's weights), issued while the layer before it
    runs (prefetch). Collectives share one comm engine, in the order they are issued. The device's ``now()``
    after ``synchronize()`` is the step's time; minus ``sum(backward)``, the communication left exposed.
    """
    for name, _, layer in (*after, *before):
        if not 0 <= layer < len(backward):
            raise ValueError(f"{name} names layer {layer}; the backward pass has layers 0 to {len(backward) - 1}")
    device = SimulatedDevice()
    gathered = {}

    def gather(layer: int) -> None:
        for name, seconds, at in before:
            if at == layer:
                gathered[layer] = device.launch(seconds, name, engine="comm")

    gather(0)
    for layer, seconds in enumerate(backward):
        waits = [gathered[layer]] if layer in gathered else []
        done = device.launch(seconds, f"backward {layer}", after=waits)
        gather(layer + 1)  # prefetch the next layer's weights while this one runs
        for name, comm_seconds, at in after:
            if at == layer:
                device.launch(comm_seconds, name, engine="comm", after=[done])
    device.synchronize()
    return device
