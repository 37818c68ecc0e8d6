"""What DDP training needs besides the training loop, shown on 2 processes: run it with torchrun.

    torchrun --nproc-per-node=2 scripts/ddp_practice.py --checkpoint-dir /tmp/somewhere

Four sections, one after the other in the same processes (each process start costs seconds):
collectives (all_reduce, broadcast, all_gather, reduce_scatter), a checkpoint saved by rank 0 and loaded by
every rank, gradient accumulation with ``no_sync()``, and ``SyncBatchNorm``. Each process picks its device as
scripts/ddp_train.py does: its own GPU over NCCL if the machine has one for every process, else the CPU over
gloo. Rank 0 prints what all ranks found, collected in rank order, so the output reads the same every run.
"""

# no "from __future__ import annotations": DDP checks the comm hook's annotations as objects

import argparse
import contextlib
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from d2l_ext.ranks import from_every_rank, join, leave, say  # rank 0 prints what every rank found

# what a launcher may set up for each process: torchrun sets all of these, torch.multiprocessing.spawn none
LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def rounded(tensor: torch.Tensor) -> list[float]:
    return [round(v, 4) for v in tensor.flatten().tolist()]


def collectives(device: torch.device) -> None:
    rank, world_size = dist.get_rank(), dist.get_world_size()
    mine = torch.tensor([1.0, 2.0, 3.0, 4.0], device=device) * (rank + 1)  # rank r holds (r + 1) * [1, 2, 3, 4]
    say("== collectives", *(f"rank {r} holds {v}" for r, v in enumerate(from_every_rank(rounded(mine)))))

    total = mine.clone()
    dist.all_reduce(total)  # in place: every rank ends with the sum over ranks
    say(f"all_reduce (sum): {from_every_rank(rounded(total))}")

    copy = mine.clone()
    dist.broadcast(copy, src=0)  # in place: every rank ends with rank 0's tensor
    say(f"broadcast from rank 0: {from_every_rank(rounded(copy))}")

    gathered = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(gathered, mine)  # every rank ends with every rank's tensor, in rank order
    say(f"all_gather, as rank 0 sees it: {[rounded(t) for t in gathered]}")

    part = torch.empty(len(mine) // world_size, device=device)
    dist.reduce_scatter(part, list(mine.chunk(world_size)))  # rank r gets the sum of every rank's part r
    say(f"reduce_scatter (sum): {from_every_rank(rounded(part))}")


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def batch(step: int, rank: int, size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Return rank ``rank``'s share of the global batch number ``step``: the same data in every run."""
    generator = torch.Generator().manual_seed(1000 * step + rank)
    X = torch.randn(size, 8, generator=generator)
    return X.to(device), (X[:, 0] > 0).long().to(device) + (X[:, 1] > 1).long().to(device)


def flat_parameters(net: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in net.parameters()]).cpu()


def train(ddp: nn.Module, optimizer: torch.optim.Optimizer, steps: range, device: torch.device) -> None:
    for step in steps:
        X, y = batch(step, dist.get_rank(), 16, device)
        optimizer.zero_grad()
        nn.functional.cross_entropy(ddp(X), y).backward()
        optimizer.step()


def wrap(net: nn.Module, device: torch.device) -> DistributedDataParallel:
    return DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None)


def checkpoint(device: torch.device, local_rank: int, folder: Path) -> None:
    rank = dist.get_rank()
    path = folder / "checkpoint.pt"
    # the reference: 6 steps without stopping
    torch.manual_seed(0)
    ddp = wrap(model().to(device), device)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    train(ddp, optimizer, range(6), device)
    uninterrupted = flat_parameters(ddp.module)

    # the same run, stopped after 3 steps: rank 0 alone writes (all ranks hold the same state; two writers to one
    # file would clash), and the barrier keeps the other ranks from reading before the file is complete
    torch.manual_seed(0)
    ddp = wrap(model().to(device), device)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    train(ddp, optimizer, range(3), device)
    if rank == 0:
        torch.save({"model": ddp.module.state_dict(), "optimizer": optimizer.state_dict(), "step": 3}, path)
    dist.barrier()

    # resume in new objects, initialized differently on each rank: only the checkpoint can make them agree
    torch.manual_seed(100 + rank)
    net = model().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    # tensors saved from cuda:0 would load onto cuda:0 in every process: map them onto this process's device
    map_location = {"cuda:0": f"cuda:{local_rank}"} if device.type == "cuda" else device
    state = torch.load(path, map_location=map_location)
    net.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])  # momentum buffers too: without them the run would differ
    loaded_on = str(next(iter(state["model"].values())).device)
    agree = from_every_rank(flat_parameters(net))  # before DDP, whose construction would copy rank 0's anyway
    ddp = wrap(net, device)
    train(ddp, optimizer, range(state["step"], 6), device)
    resumed = flat_parameters(ddp.module)
    say("== checkpoint",
        f"saved by rank 0 after step {state['step']}; loaded on: {from_every_rank(loaded_on)}",
        f"after loading, every rank holds the same parameters: {all(torch.equal(agree[0], p) for p in agree)}",
        f"resumed for 3 steps, equal to 6 steps without stopping, on every rank: "
        f"{all(from_every_rank(torch.equal(resumed, uninterrupted)))}")
    dist.barrier()  # everyone has read the file before the notebook deletes it


def counting_allreduce(state: dict[str, int],
                       bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:  # pyright: ignore[reportPrivateImportUsage]
    """DDP's own all-reduce (the average of the bucket's gradients over ranks), counted."""
    state["all-reduces"] += 1
    return default_hooks.allreduce_hook(None, bucket)  # pyright: ignore[reportArgumentType]


def gradients(ddp: DistributedDataParallel) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in ddp.parameters() if p.grad is not None]).cpu()


def accumulation(device: torch.device, micro_batches: int = 4) -> None:
    rank = dist.get_rank()
    torch.manual_seed(0)
    ddp = wrap(model().to(device), device)
    counter = {"all-reduces": 0}
    ddp.register_comm_hook(counter, counting_allreduce)  # called once per bucket of gradients to all-reduce
    X, y = batch(0, rank, 16 * micro_batches, device)  # this rank's share of the global batch

    def one_backward_per(parts: list[tuple[torch.Tensor, torch.Tensor]], skip_sync: bool) -> tuple[torch.Tensor, int]:
        ddp.zero_grad()
        counter["all-reduces"] = 0
        for i, (Xi, yi) in enumerate(parts):
            # no_sync must hold the forward pass too: DDP decides there whether the backward will all-reduce
            with ddp.no_sync() if skip_sync and i < len(parts) - 1 else contextlib.nullcontext():
                loss = nn.functional.cross_entropy(ddp(Xi), yi) / len(parts)  # the mean over the whole share
                loss.backward()  # under no_sync the gradients only add up locally; else all-reduced
        return gradients(ddp), counter["all-reduces"]

    whole, whole_count = one_backward_per([(X, y)], skip_sync=False)
    parts = list(zip(X.chunk(micro_batches), y.chunk(micro_batches), strict=True))
    every, every_count = one_backward_per(parts, skip_sync=False)
    accumulated, accumulated_count = one_backward_per(parts, skip_sync=True)
    same = all(from_every_rank(all(torch.allclose(g, whole, atol=1e-6) for g in (every, accumulated))))
    say("== gradient accumulation",
        f"all-reduces for one optimizer step: {whole_count} with one batch of {len(X)} per rank; with "
        f"{micro_batches} micro-batches of {len(X) // micro_batches}, {every_count} without no_sync and "
        f"{accumulated_count} with no_sync",
        f"the gradients of all three agree (within 1e-6) on every rank: {same}")


def sync_batchnorm(device: torch.device) -> None:
    rank = dist.get_rank()
    # different local batches: rank 0 has 8 samples around 0, rank 1 has 24 around 2 (sizes may differ too)
    generator = torch.Generator().manual_seed(rank)
    X = (torch.randn(8 + 16 * rank, 3, generator=generator) + 2 * rank).to(device)
    everything = torch.cat(from_every_rank(X.cpu()))  # CPU copies: a pickled CUDA tensor would keep its GPU
    full_mean = everything.mean(dim=0)
    plain = nn.BatchNorm1d(3, momentum=None).to(device)  # momentum None: after one batch, running mean = its mean
    plain(X)
    local_means = from_every_rank(plain.running_mean.cpu())  # pyright: ignore[reportOptionalMemberAccess]
    differ = not torch.allclose(local_means[0], local_means[1], atol=1e-3)
    lines = ["== SyncBatchNorm", f"BatchNorm1d: the ranks' running means differ: {differ}"]
    synced = nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(nn.BatchNorm1d(3, momentum=None))).to(device)
    layer = next(module for module in synced.modules() if isinstance(module, nn.SyncBatchNorm))  # the converted one
    try:
        synced(X)
        running_mean = layer.running_mean.cpu()  # pyright: ignore[reportOptionalMemberAccess]
        lines.append(f"SyncBatchNorm on {device.type}: running mean equal to the full batch's on every rank: "
                     f"{all(from_every_rank(torch.allclose(running_mean, full_mean, atol=1e-5)))}")
    except ValueError as error:  # torch supports it on GPUs (CUDA, XPU, HPU) only
        lines.append(f"SyncBatchNorm on {device.type}: ValueError: {error}")
    # what it computes, by hand: sums and counts all-reduced, so every rank gets the statistics of the full batch
    sums = torch.cat([X.sum(dim=0), torch.tensor([float(len(X))], device=device)])
    dist.all_reduce(sums)
    by_hand = (sums[:-1] / sums[-1]).cpu()
    lines.append(f"by hand (all_reduce of sums and counts): mean equal to the full batch's on every rank: "
                 f"{all(from_every_rank(torch.allclose(by_hand, full_mean, atol=1e-5)))}")
    say(*lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint-dir", type=Path, required=True, help="a folder every process can read")
    args = parser.parse_args()
    local_rank, device, backend = join()  # this rank's device and backend, in the process group
    say(f"{dist.get_world_size()} processes, backend {backend}, devices {from_every_rank(str(device))}",
        f"set by torchrun: {[name for name in LAUNCH_VARIABLES if name in os.environ]}")
    collectives(device)
    checkpoint(device, local_rank, args.checkpoint_dir)
    accumulation(device)
    sync_batchnorm(device)
    leave()  # barrier, destroy the group, exit without the teardown that gloo's threads may abort


if __name__ == "__main__":
    main()
