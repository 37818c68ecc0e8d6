"""Time collectives over sizes from 1 KiB to 64 MiB, and run a ring all-reduce written with sends: run it with
torchrun.

    torchrun --nproc-per-node=2 scripts/collectives.py [--largest-mib 64] [--repeats 5] [--cpu]
        [--collectives all_reduce,all_gather,reduce_scatter,all_to_all]

Each process picks its device as scripts/ddp_train.py does (its own GPU over NCCL when every process has one, else
the CPU over gloo); ``--cpu`` keeps every process on the CPU over gloo even where there are GPUs (chapter 10.5 sets
these times beside CPU step times). For each collective and each size S (the bytes of the whole tensor: all_reduce's
tensor, all_gather's result, reduce_scatter's input, all_to_all's input), every rank makes its tensors once, runs
the collective once to warm up, then ``--repeats`` times, each between two barriers, and the median is kept: only
the collective is timed, not the making of its tensors. Rank 0 prints one line per measurement:

    time all_reduce 1048576 0.000412

Then ``d2l_ext.commcost.ring_all_reduce`` (chapter 9's) sums a tensor of 12 x 5 x n float32 numbers with ``isend``
and ``irecv``: every rank's result must equal ``dist.all_reduce``'s, and every rank must have sent exactly
2(n - 1)/n of its bytes. Rank 0 prints what each rank sent.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from d2l_ext.commcost import dist_exchange, ring_all_reduce
from d2l_ext.ranks import from_every_rank, join, leave, say

# torch 2.14 renamed all_gather_into_tensor and reduce_scatter_tensor (the old names warn); Colab's 2.11 has only those
ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def collective_call(collective: str, nbytes: int, device: torch.device) -> Callable[[], object]:
    """Make the tensors of ``collective`` on ``nbytes`` of float32 (see the module's docstring); return the call
    that runs it once on them."""
    n = dist.get_world_size()
    numel = nbytes // 4
    if collective == "all_reduce":
        tensor = torch.ones(numel, device=device)
        return lambda: dist.all_reduce(tensor)
    if collective == "all_gather":
        output, part = torch.empty(numel, device=device), torch.ones(numel // n, device=device)
        return lambda: ALL_GATHER(output, part)
    if collective == "reduce_scatter":
        part, whole = torch.empty(numel // n, device=device), torch.ones(numel, device=device)
        return lambda: REDUCE_SCATTER(part, whole)
    if collective == "all_to_all":
        output, whole = torch.empty(numel, device=device), torch.ones(numel, device=device)
        return lambda: dist.all_to_all_single(output, whole)
    raise ValueError(f"unknown collective {collective!r}")


def median_seconds(collective: str, nbytes: int, device: torch.device, repeats: int) -> float:
    call = collective_call(collective, nbytes, device)  # made once, outside the timing
    call()  # warm-up: buffers, connections
    times = []
    for _ in range(repeats):
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        call()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    # the collective ends when the slowest rank is done: take each repeat's longest time over the ranks
    slowest = [max(ts) for ts in zip(*from_every_rank(times), strict=True)]
    return statistics.median(slowest)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--largest-mib", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--collectives", default="all_reduce,all_gather,reduce_scatter,all_to_all")
    parser.add_argument("--cpu", action="store_true", help="the CPU and gloo, even where there are GPUs")
    args = parser.parse_args()
    _, device, backend = join(cpu=args.cpu)
    n = dist.get_world_size()
    say(f"{n} processes over {backend}, each on {device.type}")
    sizes, size = [], 1024
    while size <= args.largest_mib * 2**20:
        sizes.append(size)
        size *= 4
    for collective in args.collectives.split(","):
        for nbytes in sizes:
            seconds = median_seconds(collective, nbytes, device, args.repeats)
            say(f"time {collective} {nbytes} {seconds:.6f}")

    torch.manual_seed(dist.get_rank())
    tensor = torch.randn(12 * 5 * n, device=device)
    expected = tensor.clone()
    dist.all_reduce(expected)
    sent = ring_all_reduce(tensor, dist.get_rank(), n, dist_exchange)
    equal = from_every_rank(bool(torch.allclose(tensor, expected, rtol=0, atol=1e-5)))
    every_sent = from_every_rank(sent)
    nbytes = tensor.numel() * tensor.element_size()
    say(f"ring all-reduce of {nbytes} bytes: equal to dist.all_reduce on every rank: {all(equal)}",
        f"bytes each rank sent: {every_sent} (2(n - 1)/n x {nbytes} = {2 * (n - 1) * nbytes // n})")
    leave()


if __name__ == "__main__":
    main()
