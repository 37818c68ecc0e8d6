"""Data parallelism from scratch, as chapter 6 builds it (saved here so that its solutions can reuse it).

The chapter defines these functions in a cell; tests/test_parallel.py checks that the two stay identical.
"""

from __future__ import annotations

from torch import nn


def split_batch(X, y, devices):
    """Return (X, y) in len(devices) parts, part i on devices[i] (some may be empty)."""
    # tensor_split always gives len(devices) parts; chunk gives fewer for a batch smaller than that
    parts = zip(X.tensor_split(len(devices)), y.tensor_split(len(devices)), devices, strict=True)
    return [(Xi.to(device), yi.to(device)) for Xi, yi, device in parts]


def allreduce(tensors):
    """Replace every tensor of the list by the sum of all (each on its own device)."""
    total = tensors[0].clone()
    for tensor in tensors[1:]:
        total += tensor.to(total.device)
    for tensor in tensors:
        tensor.copy_(total)  # copy_ copies across devices


def train_step(replicas, optimizers, X, y, devices):
    """One data-parallel step: forward/backward per worker, all-reduce, same update."""
    for net, (Xi, yi) in zip(replicas, split_batch(X, y, devices), strict=True):
        loss = nn.functional.cross_entropy(net(Xi), yi, reduction="sum") / len(y)
        loss.backward()
    for same_parameter in zip(*(net.parameters() for net in replicas), strict=True):
        allreduce([p.grad for p in same_parameter])
    for optimizer in optimizers:
        optimizer.step()
        optimizer.zero_grad()
