"""Tensor and sequence parallelism on 2 processes, by hand and with DTensor, checked against one process: run it
with torchrun.

    torchrun --nproc-per-node=2 scripts/tensor_parallel.py
    torchrun --nproc-per-node=2 scripts/tensor_parallel.py --fused-qkv   # chapter 9's exercise 4: the block only

A Megatron-LM MLP (Shoeybi et al., 2019) split over the ranks: the first linear layer by columns (each rank holds
some of its output features), the second by rows (the matching input features). Each rank then computes a partial
sum of the output, and one all-reduce adds them. Two autograd functions carry the communication, and each is the
other's conjugate: ``f`` is the identity forward and an all-reduce backward (every rank's input gradient is a
partial sum), ``g`` an all-reduce forward and the identity backward. The all-reduce is a ring written with
point-to-point sends, so that the bytes each rank sends are counted, not assumed: 2 (n - 1) / n times the tensor's.
Then the same MLP with ``parallelize_module`` (ColwiseParallel, RowwiseParallel) on a device mesh, its collectives
counted by ``CommDebugMode``. Then a transformer block with its attention split by heads (q, k and v by columns,
so each rank computes whole heads; the output projection by rows), and the collectives of a step, forward and
backward, counted. Next, sequence parallelism on a LayerNorm and the MLP: each rank normalizes its own tokens, an
all-gather before the MLP and a reduce-scatter after it replace the all-reduce, and the LayerNorm saves 1/n of the
activations on each rank. On 4 processes, FSDP2 times tensor parallelism on a (2, 2) mesh too, each rank's
parameters, gradients, Adam state and saved activations measured. Every rank also builds the whole model from the
same seed and checks its output and gradients. Each process picks its device as scripts/ddp_train.py does (its own
GPU over NCCL when every process has one, else the CPU over gloo); rank 0 prints what every rank found, in rank
order, each part under a title line (``-- title --``) that chapter 9 shows in the section teaching it
(d2l_ext.parallel.section). With ``--fused-qkv`` only the block runs, with q, k and v fused into one layer
(chapter 9's exercise 4).
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import sys
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from d2l_ext import commcost
from d2l_ext.ranks import from_every_rank, join, leave, say

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle

HIDDEN, FFN, BATCH = 16, 64, 8  # the MLP widens 16 -> 64 -> 16; FFN must be a multiple of the processes
HEADS, HEAD_DIM = 4, 4  # the transformer block's attention: HIDDEN = HEADS x HEAD_DIM, whole heads on each rank
# parallelize_module's plans, by module name; the same names tell d2l_ext.estimate_parallel_memory what is split
MLP_PLAN = {"0": "colwise", "2": "rowwise"}
BLOCK_PLAN = {"q": "colwise", "k": "colwise", "v": "colwise", "out": "rowwise", "mlp.0": "colwise", "mlp.2": "rowwise"}
FUSED_BLOCK_PLAN = {"qkv": "colwise", "out": "rowwise", "mlp.0": "colwise", "mlp.2": "rowwise"}
SENT: list[tuple[str, int]] = []  # (where, bytes this rank sent) for each all-reduce, in order


def shard(full: torch.Tensor, dim: int, rank: int, degree: int) -> torch.Tensor:
    """Return this rank's equal slice of ``full`` along ``dim``; ValueError if ``degree`` does not divide it."""
    if full.shape[dim] % degree:
        raise ValueError(f"the tensor-parallel degree {degree} does not divide dimension {dim} of size "
                         f"{full.shape[dim]}")
    return full.chunk(degree, dim)[rank].clone()


def check_degree(degree: int, heads: int = HEADS, ffn: int = FFN, hidden: int = HIDDEN) -> None:
    """Raise ValueError naming what the tensor-parallel ``degree`` does not divide: the attention heads (a rank
    computes whole heads), the MLP's FFN width, or the hidden width (q's, k's and v's output features)."""
    if degree < 1:
        raise ValueError(f"the tensor-parallel degree must be at least 1, not {degree}")
    for size, what in ((heads, "heads"), (ffn, "FFN features"), (hidden, "hidden features")):
        if size % degree:
            raise ValueError(f"the tensor-parallel degree {degree} does not divide the {size} {what}")


def mesh_shape(world_size: int, dp: int, tp: int) -> tuple[int, int]:
    """The (dp, tp) shape of a two-dimensional mesh over ``world_size`` ranks; ValueError if it does not use every
    rank exactly once (init_device_mesh would fail later, and less clearly)."""
    if dp < 1 or tp < 1:
        raise ValueError(f"a mesh dimension must be at least 1, not dp={dp}, tp={tp}")
    if dp * tp != world_size:
        raise ValueError(f"a ({dp}, {tp}) mesh needs {dp * tp} processes, and the world size is {world_size}")
    return dp, tp


def styles(plan: dict[str, str]) -> dict[str, ParallelStyle]:
    """``plan`` ("colwise" or "rowwise" by module name) as parallelize_module takes it."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {name: ColwiseParallel() if style == "colwise" else RowwiseParallel() for name, style in plan.items()}


def ring_all_reduce(tensor: torch.Tensor, where: str) -> torch.Tensor:
    """Sum ``tensor`` over the ranks in place, as a ring (d2l_ext.commcost.ring_all_reduce): n - 1 steps that leave
    each rank one summed chunk (reduce-scatter), n - 1 that pass the sums round (all-gather). Records the bytes
    this rank sent in SENT."""
    sent = commcost.ring_all_reduce(tensor, dist.get_rank(), dist.get_world_size(), commcost.dist_exchange)
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
    distributed tensor counts its local part). The parameters are looked up as each tensor is saved: FSDP2
    registers the gathered (unsharded) ones in the module while it computes."""
    from torch.distributed.tensor import DTensor

    def local(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to_local() if isinstance(tensor, DTensor) else tensor

    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        mine = local(tensor)
        parameters = {local(p).untyped_storage().data_ptr() for p in module.parameters()}
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


class Block(nn.Module):
    """A pre-norm transformer block: LayerNorm, causal self-attention, added to the input; LayerNorm, the MLP, added
    to that. The number of heads comes from the width of q's output (``.view(b, s, -1, HEAD_DIM)``), so the same
    code runs on a rank that holds some of q's, k's and v's output features: it computes those heads, whole."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.q, self.k, self.v = nn.Linear(HIDDEN, HIDDEN), nn.Linear(HIDDEN, HIDDEN), nn.Linear(HIDDEN, HIDDEN)
        self.out = nn.Linear(HIDDEN, HIDDEN)
        self.mlp = nn.Sequential(nn.Linear(HIDDEN, FFN), nn.GELU(), nn.Linear(FFN, HIDDEN))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = self.norm1(x)
        q, k, v = (layer(h).view(b, s, -1, HEAD_DIM).transpose(1, 2) for layer in (self.q, self.k, self.v))
        heads = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # (b, heads here, s, HEAD_DIM)
        x = x + self.out(heads.transpose(1, 2).reshape(b, s, -1))  # the heads' features side by side again
        return x + self.mlp(self.norm2(x))


def full_block(device: torch.device) -> Block:
    torch.manual_seed(0)
    return Block().to(device)


def fuse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q's, k's and v's weights (or biases) as one layer's, head by head: q, k and v of head 0, then of head 1, ...
    A split by output features (ColwiseParallel) then still gives each rank whole heads, with their q, k and v;
    stacked [q; k; v] would give rank 0 only queries."""
    return torch.stack([t.unflatten(0, (HEADS, HEAD_DIM)) for t in (q, k, v)], dim=1).flatten(0, 2)


class FusedBlock(nn.Module):
    """The block with q, k and v fused into one layer, ``qkv``, as Megatron does, made from ``block``'s weights
    (so it computes the same). One column-split layer where there were three: backward all-reduces one input
    gradient for the three, not three."""

    def __init__(self, block: Block) -> None:
        super().__init__()
        self.norm1, self.norm2 = copy.deepcopy(block.norm1), copy.deepcopy(block.norm2)
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
        with torch.no_grad():
            self.qkv.weight.copy_(fuse(block.q.weight, block.k.weight, block.v.weight))
            self.qkv.bias.copy_(fuse(block.q.bias, block.k.bias, block.v.bias))
        self.out, self.mlp = copy.deepcopy(block.out), copy.deepcopy(block.mlp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h = self.norm1(x)
        # (b, s, heads here, 3, HEAD_DIM): each head's q, k and v side by side, as fuse() laid them out
        q, k, v = (t.transpose(1, 2) for t in self.qkv(h).view(b, s, -1, 3, HEAD_DIM).unbind(3))
        heads = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(heads.transpose(1, 2).reshape(b, s, -1))
        return x + self.mlp(self.norm2(x))


def transformer_block(device: torch.device, fused: bool = False) -> list[str]:
    """The block with attention split by heads: q, k and v by columns (each rank HEADS / n whole heads), the output
    projection by rows, the MLP as before; its output and every gradient equal one process's. ``fused``: q, k and
    v fused into one layer (FusedBlock), its gradient compared with the three layers' fused the same way."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import parallelize_module

    n = dist.get_world_size()
    reference = full_block(device)
    model: nn.Module = FusedBlock(reference) if fused else full_block(device)
    parallelize_module(model, init_device_mesh(device.type, (n,)), styles(FUSED_BLOCK_PLAN if fused else BLOCK_PLAN))
    torch.manual_seed(1)
    data = torch.randn(BATCH, SEQUENCE, HIDDEN, device=device)
    x, x_full = data.clone().requires_grad_(), data.clone().requires_grad_()
    outputs: list[torch.Tensor] = []
    saved = saved_activation_bytes(lambda: outputs.append(model(x)), model)
    whole = saved_activation_bytes(lambda: outputs.append(reference(x_full)), reference)
    expected = outputs[1]
    same = torch.allclose(outputs[0], expected, atol=1e-6, rtol=0)
    outputs[0].square().mean().backward()  # the mean, not the sum: gradients near 0.05, their float32 rounding
    expected.square().mean().backward()  # near 1e-8 (the sum's, 1,024 times larger, passes 1e-6)
    theirs = {name: grad(p) for name, p in reference.named_parameters()}
    if fused:
        for part in ("weight", "bias"):
            theirs[f"qkv.{part}"] = fuse(*(theirs.pop(f"{layer}.{part}") for layer in "qkv"))
    ours = {name: grad(p) for name, p in model.named_parameters()}
    assert ours.keys() == theirs.keys(), (ours.keys(), theirs.keys())
    for name, gradient in ours.items():  # a split parameter's gradient is split like it: gathered whole to compare
        whole_gradient = gradient.full_tensor() if isinstance(gradient, DTensor) else gradient
        same &= torch.allclose(whole_gradient, theirs[name], atol=1e-6, rtol=0)
    same &= torch.allclose(grad(x), grad(x_full), atol=1e-6, rtol=0)
    layer = "qkv" if fused else "q"
    weight = getattr(model, layer).weight
    assert isinstance(weight, DTensor)  # parallelize_module made it one
    lines = [f"transformer block: rank 0 computes {HEADS // n} of {HEADS} heads, {layer}'s weight "
             f"{tuple(weight.to_local().shape)} of {tuple(weight.shape)}",
             f"same output, input's gradient and {len(ours)} parameters' gradients as one process (within 1e-6): "
             f"{all(from_every_rank(bool(same)))}"]
    if not fused:  # q, k and v are views of one tensor when fused: counted once, by its first view's size
        lines.append(f"block's saved activations per rank {from_every_rank(saved)} B; on one process {whole:,} B")
    return lines


def collectives_per_step(device: torch.device, fused: bool = False) -> list[str]:
    """The collectives of a forward pass and of a backward pass, counted by CommDebugMode (it counts the backward
    pass's too, run inside it), for the MLP and the block, with an input that needs a gradient and one that
    does not.

    The counts are Megatron's f and g, which parallelize_module places for us. Forward: a RowwiseParallel layer
    leaves each rank a partial sum, and one all-reduce adds them (g): 1 in the MLP, 2 in the block (the output
    projection, the MLP's last layer); a ColwiseParallel layer needs none, its input being whole on every rank.
    Backward: g's backward sends nothing (every rank has the whole output gradient), but each ColwiseParallel
    layer's input gradient is a partial sum, from this rank's output features only, and is all-reduced (f's
    backward): 1 in the MLP, 4 in the block, since q, k and v are three layers, each with its own f (Megatron
    fuses them into one layer, one all-reduce), and the MLP's first layer. When the input needs no gradient
    the MLP's backward all-reduce disappears: nothing before the MLP wants it. The block's four stay: the
    LayerNorms before q, k, v and the MLP have weights, which need the gradient of their output. ``fused``: the
    block is a FusedBlock, whose one qkv layer has one f: two all-reduces backward."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    mlp, block = full_mlp(device), full_block(device)
    if fused:
        block = FusedBlock(block)
    parallelize_module(mlp, mesh, styles(MLP_PLAN))
    parallelize_module(block, mesh, styles(FUSED_BLOCK_PLAN if fused else BLOCK_PLAN))
    torch.manual_seed(1)
    lines = ["collectives per step (CommDebugMode): forward / backward / backward, the input needing no gradient"]
    for name, model, shape in (("MLP", mlp, (BATCH, HIDDEN)), ("block", block, (BATCH, SEQUENCE, HIDDEN))):
        data, counts = torch.randn(shape, device=device), []
        for needs_grad in (True, False):
            x = data.clone().requires_grad_(needs_grad)
            with CommDebugMode() as forward:
                y = model(x)
            with CommDebugMode() as backward:
                y.square().sum().backward()
            if needs_grad:
                counts.append(forward.get_comm_counts())
            counts.append(backward.get_comm_counts())
        shown = [{str(op).split(".")[-1]: k for op, k in sorted(c.items(), key=str)} for c in counts]
        lines.append(f"  {name + ':':<6} {shown[0]} / {shown[1]} / {shown[2]}")
    return lines


def two_dimensional(device: torch.device) -> list[str]:
    """FSDP2 over a data-parallel dimension times tensor parallelism, on a (2, 2) mesh of 4 processes: each rank
    holds a quarter of each split weight and of its Adam state; the gradients equal one process's on the whole
    batch."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    shape = mesh_shape(dist.get_world_size(), 2, 2)
    mesh = init_device_mesh(device.type, shape, mesh_dim_names=("dp", "tp"))
    reference, model = full_mlp(device), full_mlp(device)
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    torch.manual_seed(1)
    data = torch.randn(2 * BATCH, HIDDEN, device=device)
    reference(data).square().mean().backward()
    mine = data.chunk(2)[mesh.get_local_rank("dp")]  # this data-parallel rank's half of the batch
    outputs: list[torch.Tensor] = []
    activation_bytes = saved_activation_bytes(lambda: outputs.append(model(mine)), model)
    outputs[0].square().mean().backward()  # FSDP2 averages the gradients over "dp"
    gradient_bytes = 0
    for p in model.parameters():
        assert isinstance(p.grad, DTensor)  # sharded like its parameter
        gradient_bytes += p.grad.to_local().numel() * p.grad.element_size()
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
    # the forward pass saves, on each rank: the first layer's input for its weight's gradient, whole (this rank's
    # half of the batch; a column-split layer's input is the same on every "tp" rank), GELU's input, and GELU's
    # output (the second layer's input, for its weight's gradient), split by "tp". The loss's own (its square's
    # input) is left out, as chapter 8's estimate leaves it out
    rows, size = mine.shape[0], mine.element_size()
    activations = (rows * HIDDEN + 2 * rows * FFN // 2) * size
    return [f"FSDP2 x TP on a (2, 2) mesh: parameters per rank {from_every_rank(parameter_bytes)} B of {total:,} B; "
            f"Adam state per rank {from_every_rank(state_bytes)} B",
            f"formula: ({split:,} split / 4 + {last.bias.numel()} replicated / 2) x 4 B = {formula:,} B per rank, "
            f"Adam twice that",
            f"same gradients as one process on the whole batch (within 1e-6): {all(from_every_rank(bool(same)))}",
            f"gradients per rank {from_every_rank(gradient_bytes)} B; saved activations per rank "
            f"{from_every_rank(activation_bytes)} B",
            f"activations: the input {rows} x {HIDDEN} whole, GELU's input and output {rows} x {FFN // 2} each "
            f"(FFN / 2), x {size} B = {activations:,} B"]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--fused-qkv", action="store_true",
                        help="run only the transformer block, with q, k and v fused into one layer")
    fused = parser.parse_args().fused_qkv
    world_size = int(os.environ.get("WORLD_SIZE", "0"))
    try:
        check_degree(world_size)  # a degree that divides the heads also divides SEQUENCE, for sequence parallelism
    except ValueError as error:
        sys.exit(f"{error}; start it with a number of processes that divides {math.gcd(HEADS, FFN, HIDDEN)}: "
                 "torchrun --nproc-per-node=2 scripts/tensor_parallel.py")
    warnings.filterwarnings("ignore", module="torch.distributed")  # DTensor's notices, printed by every rank
    _, device, backend = join()
    say(f"{world_size} processes, backend {backend}, devices {from_every_rank(str(device))}")
    if fused:
        say("-- transformer block, q, k and v fused --", *transformer_block(device, fused=True),
            *collectives_per_step(device, fused=True))
        leave()
        return
    say("-- by hand --", *by_hand(device))
    say("-- DTensor --", *with_dtensor(device))
    say("-- transformer block --", *transformer_block(device), *collectives_per_step(device))
    say("-- sequence parallel --", *with_sequence_parallel(device))
    if world_size == 4:
        say("-- FSDP2 x TP --", *two_dimensional(device))
    leave()


if __name__ == "__main__":
    main()
