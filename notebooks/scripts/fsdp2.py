"""FSDP2 (``fully_shard``) on 2 processes, checked against one process training the whole model: run it with torchrun.

    torchrun --nproc-per-node=2 scripts/fsdp2.py

``fully_shard`` on each Linear and then on the root turns every parameter into a DTensor of which each rank keeps
one slice of rows (Shard(dim=0)); Adam's state follows the parameters, so it is sharded too. In the forward and
backward passes each layer's full parameters are all-gathered just in time and freed after, and the gradients
are reduce-scattered (averaged), so each rank receives only the gradients of its slice. Each rank trains on an
equal half of every batch, so the mean of the two halves' mean losses is the whole batch's mean loss: the losses
must equal those of one process training an unsharded copy (made before sharding) on the whole batch.

Each process picks its device as scripts/ddp_train.py does: its own GPU over NCCL if the machine has one for every
process, else the CPU over gloo. The device mesh is made for that device type and passed to ``fully_shard``:
without it, FSDP2 would build its mesh on the machine's accelerator whatever the backend (on one GPU shared by 2
processes over gloo, both would put their parameters on it); init_device_mesh("cpu", ...) runs over gloo (torch 2.14).
Rank 0 prints what all ranks found, in rank order, so the output reads the same every run.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from d2l_ext.ranks import from_every_rank, join, leave, say

STEPS, GLOBAL_BATCH, LR = 5, 48, 1e-2  # 48: equal shares for 1, 2, 3, 4, 6 or 8 ranks


def model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))


def batch(step: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Return the global batch number ``step``: the same data in every run."""
    generator = torch.Generator().manual_seed(step)
    X = torch.randn(GLOBAL_BATCH, 64, generator=generator)
    return X.to(device), (X[:, 0] + X[:, 1] > 0).long().to(device)


def local(tensor: torch.Tensor) -> torch.Tensor:
    """Return the part of ``tensor`` this rank holds (all of it unless it is a DTensor)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def adam_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Return the bytes of Adam's two moments (exp_avg, exp_avg_sq) that this rank holds."""
    return sum(local(state[name]).numel() * local(state[name]).element_size()
               for state in optimizer.state.values() for name in ("exp_avg", "exp_avg_sq"))


def train(net: nn.Module, device: torch.device, share: slice) -> tuple[list[float], torch.optim.Optimizer]:
    """Train ``net`` with Adam on ``share`` of every batch; return the mean loss of each step over all ranks."""
    optimizer = torch.optim.Adam(net.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        X, y = batch(step, device)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(net(X[share]), y[share])
        loss.backward()
        losses.append(loss.detach())
        optimizer.step()
    mean = torch.stack(losses)  # averaged over ranks after the loop: one collective, not one per step
    if isinstance(next(net.parameters()), DTensor):  # sharded: the mean of the ranks' shares
        dist.all_reduce(mean)
        mean /= dist.get_world_size()
    return mean.tolist(), optimizer


def main() -> None:
    _, device, backend = join()  # this rank's device and backend, in the process group
    rank, world_size = dist.get_rank(), dist.get_world_size()
    say(f"{world_size} processes, backend {backend}, devices {from_every_rank(str(device))}")

    torch.manual_seed(0)  # the same initialization on every rank
    net = model().to(device)
    whole = copy.deepcopy(net)  # the unsharded reference, trained by rank 0 alone below
    numel = sum(p.numel() for p in net.parameters())
    unsharded_bytes = 2 * sum(p.numel() * p.element_size() for p in net.parameters())  # Adam's 2 moments
    mesh = init_device_mesh(device.type, (world_size,))
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)  # one all-gather per layer, just before the layer needs it
    fully_shard(net, mesh=mesh)  # the root: whatever the layers left over (nothing here)
    weight = net[0].weight
    assert isinstance(weight, DTensor)
    held = sum(local(p).numel() for p in net.parameters())

    share = GLOBAL_BATCH // world_size
    losses, optimizer = train(net, device, slice(rank * share, (rank + 1) * share))
    state_bytes = adam_state_bytes(optimizer)
    full = torch.cat([p.full_tensor().flatten() for p in net.parameters() if isinstance(p, DTensor)])
    lines = [f"{numel:,} parameters; the first layer's weight is a DTensor: global {tuple(weight.shape)}, "
             f"local {tuple(weight.to_local().shape)}, "
             f"sharded along dim {', '.join(str(getattr(q, 'dim', '-')) for q in weight.placements)}"]
    for r, (h, b) in enumerate(zip(from_every_rank(held), from_every_rank(state_bytes), strict=True)):
        lines.append(f"rank {r}: holds {h:,} of {numel:,} parameters; Adam state {b:,} B "
                     f"(one process: {unsharded_bytes:,} B)")
    if rank == 0:
        reference, _ = train(whole, device, slice(share * world_size))  # the samples the ranks shared
        same_loss = all(abs(a - b) <= 1e-5 for a, b in zip(losses, reference, strict=True))
        same_parameters = torch.allclose(full, torch.cat([p.detach().flatten() for p in whole.parameters()]),
                                         atol=1e-5, rtol=0)
        # 2 decimals: another machine's float noise (about 1e-6) leaves the printed text the same
        lines += [f"loss, step 1 -> {STEPS}: FSDP2 {losses[0]:.2f} -> {losses[-1]:.2f}, "
                  f"one process {reference[0]:.2f} -> {reference[-1]:.2f}",
                  f"same loss as one process (within 1e-5), every step: {same_loss}",
                  f"same parameters as one process (within 1e-5): {same_parameters}"]
    say(*lines)
    leave()  # barrier, destroy the group, exit without the teardown that gloo's threads may abort


if __name__ == "__main__":
    main()
