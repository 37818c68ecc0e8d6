"""ZeRO stage 1 from scratch on 2 processes, checked against DDP: run it with torchrun.

    torchrun --nproc-per-node=2 scripts/zero1.py

Every rank holds the whole model and all-reduces (averages) its gradients as DDP does, but the optimizer state
is split: the flattened parameters are cut into one contiguous range per rank (``shard_range``), and each rank
keeps Adam's two moments for its range only and updates only that range; an all_gather then hands every rank
the updated parameters of all ranges. The result must equal DDP with a full torch.optim.Adam on every rank, from
the same initialization and the same data. (ZeRO stage 2 would reduce-scatter the gradients instead, so that each
rank also receives only the gradients of its range.) Each process picks its device as scripts/ddp_train.py does:
its own GPU over NCCL if the machine has one for every process, else the CPU over gloo. Rank 0 prints what all
ranks found, in rank order, so the output reads the same every run.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from d2l_ext.ranks import from_every_rank, join, leave, say

STEPS, GLOBAL_BATCH = 5, 48  # 48: equal shares for 1, 2, 3, 4, 6 or 8 ranks
LR, BETAS, EPS = 1e-2, (0.9, 0.999), 1e-8  # torch.optim.Adam's defaults but the learning rate


def shard_range(numel: int, rank: int, world_size: int) -> tuple[int, int]:
    """Return the range [start, end) of ``numel`` flattened elements that ``rank`` owns out of ``world_size``.

    Contiguous ranges in rank order cover all elements once; their sizes differ by at most 1 (the first
    ``numel % world_size`` ranks own one element more).
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
    base, extra = divmod(numel, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))


def batch(step: int, rank: int, world_size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Return rank ``rank``'s equal share of the global batch number ``step``: the same data in every run."""
    generator = torch.Generator().manual_seed(step)
    X = torch.randn(GLOBAL_BATCH, 64, generator=generator)
    y = (X[:, 0] + X[:, 1] > 0).long()
    share = GLOBAL_BATCH // world_size
    return X[rank * share:(rank + 1) * share].to(device), y[rank * share:(rank + 1) * share].to(device)


def flat(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.detach().flatten() for t in tensors])


def ddp_reference(device: torch.device) -> torch.Tensor:
    """Train with DDP and a full Adam on every rank; return the flattened parameters."""
    torch.manual_seed(0)
    net = model().to(device)
    ddp = DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=LR, betas=BETAS, eps=EPS)
    for step in range(STEPS):
        X, y = batch(step, dist.get_rank(), dist.get_world_size(), device)
        optimizer.zero_grad()
        nn.functional.cross_entropy(ddp(X), y).backward()
        optimizer.step()
    return flat(net.parameters())


def zero1(device: torch.device) -> tuple[torch.Tensor, tuple[int, int], int]:
    """Train with ZeRO stage 1; return the flattened parameters, this rank's range and its Adam state's bytes."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initialization on every rank (DDP's broadcast is not needed)
    net = model().to(device)
    parameters = list(net.parameters())
    numel = sum(p.numel() for p in parameters)
    start, end = shard_range(numel, rank, world_size)
    ranges = [shard_range(numel, r, world_size) for r in range(world_size)]
    padded = math.ceil(numel / world_size)  # all_gather needs the same size from every rank: pad to the largest
    exp_avg = torch.zeros(end - start, device=device)  # Adam's state for this rank's range only
    exp_avg_sq = torch.zeros(end - start, device=device)
    for step in range(1, STEPS + 1):
        X, y = batch(step - 1, rank, world_size, device)
        net.zero_grad()
        nn.functional.cross_entropy(net(X), y).backward()
        grad = flat(p.grad for p in parameters if p.grad is not None)
        grad /= world_size  # as DDP does: divide, then sum over ranks
        dist.all_reduce(grad)
        # Adam on this rank's range, in the order torch.optim.Adam computes it
        mine, g = flat(parameters)[start:end], grad[start:end]  # copies of this rank's range
        exp_avg.lerp_(g, 1 - BETAS[0])
        exp_avg_sq.mul_(BETAS[1]).addcmul_(g, g, value=1 - BETAS[1])
        denom = (exp_avg_sq.sqrt() / math.sqrt(1 - BETAS[1] ** step)).add_(EPS)
        mine.addcdiv_(exp_avg, denom, value=-LR / (1 - BETAS[0] ** step))
        # every rank sends its updated range and receives everyone's, in rank order
        shards = [torch.zeros(padded, device=device) for _ in range(world_size)]
        dist.all_gather(shards, torch.cat([mine, mine.new_zeros(padded - len(mine))]))
        updated = torch.cat([shard[:e - s] for shard, (s, e) in zip(shards, ranges, strict=True)])
        with torch.no_grad():
            nn.utils.vector_to_parameters(updated, parameters)
    state_bytes = sum(t.numel() * t.element_size() for t in (exp_avg, exp_avg_sq))
    return flat(parameters), (start, end), state_bytes


def main() -> None:
    _, device, backend = join()  # this rank's device and backend, in the process group
    world_size = dist.get_world_size()
    say(f"{world_size} processes, backend {backend}, devices {from_every_rank(str(device))}")

    reference = ddp_reference(device)
    parameters, (start, end), state_bytes = zero1(device)
    numel = len(parameters)
    ddp_bytes = 2 * numel * parameters.element_size()  # exp_avg and exp_avg_sq for every parameter
    ranges = from_every_rank((start, end))
    lines = [f"{numel:,} parameters, Adam for {STEPS} steps on a global batch of {GLOBAL_BATCH} "
             f"({GLOBAL_BATCH // world_size} samples per rank)"]
    for r, ((s, e), b) in enumerate(zip(ranges, from_every_rank(state_bytes), strict=True)):
        lines.append(f"rank {r}: owns parameters [{s:,}, {e:,}): {e - s:,} of {numel:,}; "
                     f"Adam state {b:,} B (DDP: {ddp_bytes:,} B)")
    ends = [0] + [e for _, e in ranges]
    covered = all(s == ends[r] for r, (s, _) in enumerate(ranges)) and ends[-1] == numel
    same = all(from_every_rank(torch.allclose(parameters, reference, atol=1e-6, rtol=0)))
    say(*lines,
        f"the ranks' ranges cover every parameter once: {covered}",
        f"same parameters as DDP (within 1e-6): {same}")
    leave()  # barrier, destroy the group, exit without the teardown that gloo's threads may abort


if __name__ == "__main__":
    main()
