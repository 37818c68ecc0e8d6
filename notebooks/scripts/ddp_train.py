"""Train a small classifier with DistributedDataParallel (DDP): one process per device.

Run it with torchrun, which starts the processes and sets RANK, LOCAL_RANK and WORLD_SIZE:

    torchrun --nproc-per-node=2 scripts/ddp_train.py --epochs 5      # 2 processes on this machine
    torchrun --nnodes=2 --nproc-per-node=4 --rdzv-id=job1 \\
             --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 scripts/ddp_train.py   # the same on each of 2 machines

(with the c10d rendezvous, the machines' node ranks are assigned when they meet: no --node-rank).

With a GPU for every process on the machine, each process drives one GPU over NCCL; otherwise (no GPU, or
fewer GPUs than processes) each process is a CPU worker and they talk over gloo. The data is synthetic (made
from a fixed seed, identical in every process), so nothing is downloaded. It is small, so each process puts it
on its device once and takes every batch from it there.
Only rank 0 prints, so the output reads the same whatever the number of processes.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler, TensorDataset

from d2l_ext import rank_device_and_backend
from d2l_ext.ranks import keep_process_groups


def synthetic_data(n: int, seed: int) -> TensorDataset:
    """Return n samples of 20 features labelled in 4 classes by a fixed nonlinear rule."""
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(n, 20, generator=generator)
    teacher = torch.randn(20, 4, generator=torch.Generator().manual_seed(1234))
    labels = (torch.tanh(features @ teacher) + 0.1 * features[:, :4]).argmax(dim=1)
    return TensorDataset(features, labels)


def model(hidden: int = 256) -> nn.Module:
    """Return the classifier: two hidden layers of ``hidden`` units."""
    return nn.Sequential(nn.Linear(20, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 4))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=128, help="global batch, split across processes")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--hidden", type=int, default=256, help="units per hidden layer")
    parser.add_argument("--fail-rank", type=int, default=-1, help="this rank raises an error (for the demo)")
    parser.add_argument("--settings", nargs="+", metavar="BATCH:LR", default=[],
                        help="several trainings in one launch, each from a fresh model, one per global batch size "
                             "and learning rate (they replace --batch-size and --lr); each starts with '== BATCH:LR'")
    args = parser.parse_args()

    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    world_size, local_world_size = int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_WORLD_SIZE"])
    # one CUDA GPU per process over NCCL if this machine has a GPU for every local process; else CPU and gloo
    # (so 2 processes on a machine with 1 GPU run on the CPU: NCCL refuses two ranks on one GPU)
    device, backend = rank_device_and_backend(local_rank, local_world_size)
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before anything touches the GPU: this process owns one
    # reads MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE set by torchrun; device_id binds NCCL to this process's GPU
    # at once (errors show here, not at the first collective)
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    for setting in args.settings or [f"{args.batch_size}:{args.lr}"]:
        if args.settings and rank == 0:
            print(f"== {setting}", flush=True)
        batch_size, lr = setting.split(":")
        train(argparse.Namespace(**{**vars(args), "batch_size": int(batch_size), "lr": float(lr)}),
              rank, world_size, device)
    # only after success: on an error, shutting NCCL down while the other ranks wait in a collective can
    # block (pytorch/pytorch#119215); the failing process just exits, and torchrun stops the others.
    # keep_process_groups: the group's C++ object outlives this function, since destroying a gloo group as its
    # last collective is being freed can deadlock the process (d2l_ext.ranks says how)
    keep_process_groups()
    dist.destroy_process_group()


def train(args: argparse.Namespace, rank: int, world_size: int, device: torch.device) -> None:
    torch.manual_seed(0)
    net = model(args.hidden).to(device)
    # DDP broadcasts rank 0's parameters at construction and all-reduces (averages) gradients in backward
    ddp = DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    train_set, test_set = synthetic_data(args.samples, seed=1), synthetic_data(2048, seed=2)
    # the data set (5 MiB at 65,536 samples) goes to the device once; each batch is then a gather there. A
    # DataLoader over a TensorDataset builds each batch on the host from single samples, one by one: tens of
    # milliseconds for 2048 samples on a small CPU, longer than a GPU's whole step in chapter 6.4's large run
    features, labels = (tensor.to(device) for tensor in train_set.tensors)
    # each process sees a different 1/world_size of every epoch; the global batch stays the same
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    per_process = args.batch_size // world_size
    if rank == 0:
        print(f"{world_size} process(es), backend {dist.get_backend()}, device type {device.type}, "
              f"{math.ceil(len(sampler) / per_process)} steps of {per_process} samples per process and epoch",
              flush=True)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # a new shuffle each epoch, the same in every process
        start = time.perf_counter()
        # this process's share of the epoch in the sampler's order: one copy of indices per epoch, not per step
        order = torch.tensor(list(sampler), device=device)
        totals = torch.zeros(2, device=device)  # loss sum and sample count
        samples = 0
        for batch in order.split(per_process):  # the batches a DataLoader would make from this sampler
            X, y = features[batch], labels[batch]
            loss = nn.functional.cross_entropy(ddp(X), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            totals[0] += loss.detach() * len(y)  # summed on the device: no waiting for it at every step
            samples += len(y)  # counted in Python: a new tensor from a number would be a copy that waits
        totals[1] = samples  # once per epoch
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        dist.all_reduce(totals)  # sum over processes: the mean loss of the whole epoch
        if rank == 0:
            mean_loss = totals[0].item() / totals[1].item()
            print(f"epoch {epoch + 1}: mean training loss {mean_loss:.4f} (in {seconds:.3f} s)", flush=True)
        if rank == args.fail_rank:
            raise RuntimeError(f"rank {rank} fails on purpose after epoch {epoch + 1}")

    # every process must hold the same parameters: gather them all and compare with rank 0's
    flat = torch.cat([p.detach().flatten() for p in net.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world_size)]
    dist.all_gather(gathered, flat)
    with torch.no_grad():
        X, y = test_set.tensors
        accuracy = (net(X.to(device)).argmax(dim=1) == y.to(device)).float().mean().item()
    if rank == 0:
        identical = all(torch.equal(gathered[0], other) for other in gathered[1:])
        print(f"parameters identical in all {world_size} process(es): {identical}", flush=True)
        print(f"test accuracy: {accuracy:.3f}", flush=True)


if __name__ == "__main__":
    main()
