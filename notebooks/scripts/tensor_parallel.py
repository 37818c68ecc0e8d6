"""Tensor and sequence parallelism on 2 processes, by hand and with DTensor, checked against one process: run it
with torchrun.

    torchrun --nproc-per-node=2 scripts/tensor_parallel.py

A Megatron-LM MLP (Shoeybi et al., 2019) split over the ranks: the first linear layer by columns (each rank holds
some of its output features), the second by rows (the matching input features). Each rank then computes a partial
sum of the output, and one all-reduce adds them. Two autograd functions carry the communication, and each is the
other's conjugate: ``f`` is the identity forward and an all-reduce backward (every rank's input gradient is a
partial sum), ``g`` an all-reduce forward and the identity backward. The all-reduce is a ring written with
point-to-point sends, so that the bytes each rank sends are counted, not assumed: 2 (n - 1) / n times the tensor's.
Then the same MLP with ``parallelize_module`` (ColwiseParallel, RowwiseParallel) on a device mesh, its collectives
counted by ``CommDebugMode``. Last, sequence parallelism on a LayerNorm and the MLP: each rank normalizes its own
tokens, an all-gather before the MLP and a reduce-scatter after it replace the all-reduce, and the LayerNorm saves
1/n of the activations on each rank. On 4 processes, FSDP2 times tensor parallelism on a (2, 2) mesh too. Every
rank also builds the whole MLP from the same seed and checks its output and gradients. Each process picks its
device as scripts/ddp_train.py does (its own GPU over NCCL when every process has one, else the CPU over gloo);
rank 0 prints what every rank found, in rank order.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from d2l_ext.launch import from_every_rank, join, leave, say

HIDDEN, FFN, BATCH = 16, 64, 8  # the MLP widens 16 -> 64 -> 16; FFN must be a multiple of the processes
SENT: list[tuple[str, int]] = []  # (where, bytes this rank sent) for each all-reduce, in order


def shard(full: torch.Tensor, dim: int, rank: int, degree: int) -> torch.Tensor:
    """Return this rank's equal slice of ``full`` along ``dim``; ValueError if ``degree`` does not divide it."""
    if full.shape[dim] % degree:
        raise ValueError(f"the tensor-parallel degree {degree} does not divide dimension {dim} of size "
                         f"{full.shape[dim]}")
    return full.chunk(degree, dim)[rank].clone()


def ring_all_reduce(tensor: torch.Tensor, where: str) -> torch.Tensor:
    """Sum ``tensor`` over the ranks in place, as a ring: n - 1 steps that leave each rank one summed chunk
    (reduce-scatter), n - 1 that pass the sums round (all-gather). Records the bytes this rank sent in SENT."""
    n, rank = dist.get_world_size(), dist.get_rank()
    chunks, sent = list(tensor.view(-1).tensor_split(n)), 0
    right, left = (rank + 1) % n, (rank - 1) % n
    for phase in ("reduce-scatter", "all-gather"):
        for step in range(n - 1):
            out = (rank - step + (phase == "all-gather")) % n  # the chunk this rank passes on
            into = (out - 1) % n  # the chunk it receives from the left
            incoming = torch.empty_like(chunks[into])
            # sent and received in one batch: with NCCL, a send and a receive issued apart may wait on each other
            for request in dist.batch_isend_irecv([dist.P2POp(dist.isend, chunks[out], right),
                                                   dist.P2POp(dist.irecv, incoming, left)]):
                request.wait()
            sent += chunks[out].numel() * chunks[out].element_size()
            if phase == "reduce-scatter":
                chunks[into] += incoming
            else:
                chunks[into].copy_(incoming)
    SENT.append((where, sent))
    return tensor


class CopyToTensorParallel(torch.autograd.Function):
    """Megatron's f: the input goes to every rank as it is; backward, the ranks' partial gradients are summed."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor) -> torch.Tensor:
        return ring_all_reduce(grads[0].contiguous().clone(), "f backward")


class ReduceFromTensorParallel(torch.autograd.Function):
    """Megatron's g: the ranks' partial outputs are summed; backward, the gradient goes to every rank as it is."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return ring_all_reduce(x.contiguous().clone(), "g forward")

    @staticmethod
    def backward(ctx, *grads: torch.Tensor) -> torch.Tensor:
        return grads[0]


def full_mlp(device: torch.device) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(HIDDEN, FFN), nn.GELU(), nn.Linear(FFN, HIDDEN)).to(device)


def linears(mlp: nn.Sequential) -> tuple[nn.Linear, nn.Linear]:
    """The MLP's first and last layers."""
    first, last = mlp[0], mlp[2]
    assert isinstance(first, nn.Linear) and isinstance(last, nn.Linear)
    return first, last


def grad(tensor: torch.Tensor) -> torch.Tensor:
    assert tensor.grad is not None, "no gradient: backward did not reach it"
    return tensor.grad


class MegatronMLP(nn.Module):
    """This rank's part of ``full``: rows of the first weight (its output features), columns of the second."""

    def __init__(self, full: nn.Sequential, rank: int, degree: int):
        super().__init__()
        first, last = linears(full)
        self.w1 = nn.Parameter(shard(first.weight.detach(), 0, rank, degree))
        self.b1 = nn.Parameter(shard(first.bias.detach(), 0, rank, degree))
        self.w2 = nn.Parameter(shard(last.weight.detach(), 1, rank, degree))
        self.b2 = nn.Parameter(last.bias.detach().clone())  # added once, after the sum

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = CopyToTensorParallel.apply(x)
        partial = nn.functional.gelu(x @ self.w1.T + self.b1) @ self.w2.T
        return ReduceFromTensorParallel.apply(partial) + self.b2


def by_hand(device: torch.device) -> list[str]:
    rank, n = dist.get_rank(), dist.get_world_size()
    full = full_mlp(device)
    tp = MegatronMLP(full, rank, n)
    torch.manual_seed(1)
    data = torch.randn(BATCH, HIDDEN, device=device)
    x, x_full = data.clone().requires_grad_(), data.clone().requires_grad_()
    full(x_full).square().sum().backward()
    SENT.clear()
    y = tp(x)
    forward = list(SENT)
    y.square().sum().backward()
    backward = SENT[len(forward):]
    same_output = torch.allclose(y, full(x_full), atol=1e-6, rtol=0)
    first, last = linears(full)
    expected = {"w1": shard(grad(first.weight), 0, rank, n), "b1": shard(grad(first.bias), 0, rank, n),
                "w2": shard(grad(last.weight), 1, rank, n), "b2": grad(last.bias)}
    same_grads = all(torch.allclose(grad(getattr(tp, name)), value, atol=1e-6, rtol=0)
                     for name, value in expected.items())
    same_grads &= torch.allclose(grad(x), grad(x_full), atol=1e-6, rtol=0)
    SENT.clear()
    tp(data).square().sum().backward()  # an input that needs no gradient: f's backward sends nothing
    without_input_grad = [where for where, _ in SENT]
    size = BATCH * HIDDEN * data.element_size()
    sent = from_every_rank([b for _, b in forward + backward])
    return [
        f"by hand: rank 0 holds w1 {tuple(tp.w1.shape)} of {tuple(first.weight.shape)}, "
        f"w2 {tuple(tp.w2.shape)} of {tuple(last.weight.shape)}",
        f"all-reduces: forward {[w for w, _ in forward]}, backward {[w for w, _ in backward]}; "
        f"backward without an input gradient {[w for w in without_input_grad if 'backward' in w]}",
        f"bytes sent per all-reduce, by rank: {sent}; 2 (n - 1) / n x {size:,} B = {2 * (n - 1) * size // n:,} B",
        f"same output as one process (within 1e-6): {all(from_every_rank(same_output))}",
        f"same gradients, input's included (within 1e-6): {all(from_every_rank(bool(same_grads)))}",
    ]


def with_dtensor(device: torch.device) -> list[str]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    reference, model = full_mlp(device), full_mlp(device)
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    torch.manual_seed(1)
    x = torch.randn(BATCH, HIDDEN, device=device)
    with CommDebugMode() as comm:
        y = model(x)
    counts = {str(op).split(".")[-1]: n for op, n in comm.get_comm_counts().items()}
    same = all(from_every_rank(torch.allclose(y, reference(x), atol=1e-6, rtol=0)))
    weight = linears(model)[0].weight
    assert isinstance(weight, DTensor)  # parallelize_module made it one
    return [f"DTensor: rank 0 holds the first weight's {tuple(weight.to_local().shape)} of {tuple(weight.shape)}; "
            f"collectives forward {counts}",
            f"same output as one process (within 1e-6): {same}"]


SEQUENCE = 8  # tokens per sequence in the sequence-parallel block, a multiple of the processes


class NormMLP(nn.Module):
    """LayerNorm, then the MLP: the part of a transformer block where sequence parallelism splits the norm."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(HIDDEN)
        self.mlp = nn.Sequential(nn.Linear(HIDDEN, FFN), nn.GELU(), nn.Linear(FFN, HIDDEN))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.norm(x))


def saved_activation_bytes(forward: Callable[[], object], module: nn.Module) -> int:
    """Bytes this rank saves for backward while ``forward()`` runs, ``module``'s parameters left out (a
    distributed tensor counts its local part)."""
    from torch.distributed.tensor import DTensor

    def local(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to_local() if isinstance(tensor, DTensor) else tensor

    parameters = {local(p).untyped_storage().data_ptr() for p in module.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        mine = local(tensor)
        if mine.untyped_storage().data_ptr() not in parameters:
            saved[mine.untyped_storage().data_ptr()] = mine.numel() * mine.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        forward()
    return sum(saved.values())


def with_sequence_parallel(device: torch.device) -> list[str]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    rank, n = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh(device.type, (n,))
    torch.manual_seed(0)
    reference = NormMLP().to(device)
    tp_only, sp = NormMLP().to(device), NormMLP().to(device)
    for model in (tp_only, sp):
        model.load_state_dict(reference.state_dict())
    parallelize_module(tp_only, mesh, {"mlp.0": ColwiseParallel(), "mlp.2": RowwiseParallel()})
    parallelize_module(sp, mesh, {"norm": SequenceParallel(),
                                  "mlp.0": ColwiseParallel(input_layouts=Shard(1)),
                                  "mlp.2": RowwiseParallel(output_layouts=Shard(1))})
    torch.manual_seed(1)
    x = torch.randn(BATCH, SEQUENCE, HIDDEN, device=device)
    mine = x.chunk(n, dim=1)[rank]  # this rank's tokens
    counts, outputs = {}, {}
    for name, model, given in (("TP", tp_only, x), ("TP+SP", sp, mine)):
        with CommDebugMode() as comm:
            outputs[name] = model(given)
        counts[name] = {str(op).split(".")[-1]: k for op, k in sorted(comm.get_comm_counts().items(), key=str)}
    norm_bytes = {"TP": saved_activation_bytes(lambda: tp_only.norm(x.clone().requires_grad_()), tp_only.norm),
                  "TP+SP": saved_activation_bytes(lambda: sp.norm(mine.clone().requires_grad_()), sp.norm)}
    expected = reference(x)
    same = torch.allclose(outputs["TP"], expected, atol=1e-6, rtol=0)
    same &= torch.allclose(outputs["TP+SP"], expected.chunk(n, dim=1)[rank], atol=1e-6, rtol=0)
    return [f"sequence parallel: collectives forward, TP {counts['TP']}, TP+SP {counts['TP+SP']}",
            f"LayerNorm's saved activations per rank: TP {norm_bytes['TP']:,} B, TP+SP {norm_bytes['TP+SP']:,} B "
            f"(1/{n}: {norm_bytes['TP+SP'] * n == norm_bytes['TP']})",
            f"same output as one process, each rank its tokens (within 1e-6): {all(from_every_rank(bool(same)))}"]


def two_dimensional(device: torch.device) -> list[str]:
    """FSDP2 over a data-parallel dimension times tensor parallelism, on a (2, 2) mesh of 4 processes: each rank
    holds a quarter of each split weight and of its Adam state; the gradients equal one process's on the whole
    batch."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh(device.type, (2, 2), mesh_dim_names=("dp", "tp"))
    reference, model = full_mlp(device), full_mlp(device)
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    torch.manual_seed(1)
    data = torch.randn(2 * BATCH, HIDDEN, device=device)
    reference(data).square().mean().backward()
    mine = data.chunk(2)[mesh.get_local_rank("dp")]  # this data-parallel rank's half of the batch
    model(mine).square().mean().backward()  # FSDP2 averages the gradients over "dp"
    optimizer = torch.optim.Adam(model.parameters())
    optimizer.step()
    same = True
    for (name, ours), theirs in zip(model.named_parameters(), reference.parameters(), strict=True):
        assert isinstance(ours.grad, DTensor) and theirs.grad is not None, name
        same &= torch.allclose(ours.grad.full_tensor(), theirs.grad, atol=1e-6, rtol=0)
    local = [p.to_local() for p in model.parameters() if isinstance(p, DTensor)]
    parameter_bytes = sum(t.numel() * t.element_size() for t in local)
    state_bytes = sum(v.to_local().numel() * v.element_size() for state in optimizer.state.values()
                      for v in state.values() if isinstance(v, DTensor))
    total = sum(p.numel() * p.element_size() for p in reference.parameters())
    # split by "tp" then by "dp": a quarter each; the last bias, replicated over "tp", is split by "dp" only
    first, last = linears(reference)
    split = first.weight.numel() + first.bias.numel() + last.weight.numel()
    formula = (split // 4 + last.bias.numel() // 2) * 4
    return [f"FSDP2 x TP on a (2, 2) mesh: parameters per rank {from_every_rank(parameter_bytes)} B of {total:,} B; "
            f"Adam state per rank {from_every_rank(state_bytes)} B",
            f"formula: ({split:,} split / 4 + {last.bias.numel()} replicated / 2) x 4 B = {formula:,} B per rank, "
            f"Adam twice that",
            f"same gradients as one process on the whole batch (within 1e-6): {all(from_every_rank(bool(same)))}"]


def main() -> None:
    world_size = int(os.environ.get("WORLD_SIZE", "0"))
    if world_size < 1 or FFN % world_size:
        sys.exit(f"start it with a number of processes that divides {FFN}: "
                 "torchrun --nproc-per-node=2 scripts/tensor_parallel.py")
    warnings.filterwarnings("ignore", module="torch.distributed")  # DTensor's notices, printed by every rank
    _, device, backend = join()
    say(f"{world_size} processes, backend {backend}, devices {from_every_rank(str(device))}")
    say(*by_hand(device))
    say(*with_dtensor(device))
    say(*with_sequence_parallel(device))
    if world_size == 4:
        say(*two_dimensional(device))
    leave()


if __name__ == "__main__":
    main()
