"""Data parallelism from scratch, as chapter 6 builds it (saved here so that its solutions can reuse it), and
``section``: chapter 9 shows each part of its one launch's output in the section that teaches it.

Chapter 6 defines split_batch, allreduce and train_step in a cell; tests/test_parallel.py checks that the two stay
identical.
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


def section(output: str, title: str) -> str:
    """Return the lines of ``output`` under the title line ``-- title --``, up to the next title line (a script's
    part, as scripts/tensor_parallel.py prints them); KeyError naming the titles there if ``title`` is not one."""
    parts: dict[str, list[str]] = {}
    lines: list[str] | None = None
    for line in output.splitlines():
        if line.startswith("-- ") and line.endswith(" --"):
            lines = parts.setdefault(line[3:-3], [])
        elif lines is not None:
            lines.append(line)
    if title not in parts:
        raise KeyError(f"no part {title!r} in the output; its parts: {list(parts)}")
    return "\n".join(parts[title])
