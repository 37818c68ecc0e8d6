"""Chapter 14's multi-process checks, in one launch: context parallelism and expert parallelism against one process.

    torchrun --nproc-per-node=2 scripts/long_and_experts.py RESULTS.json     (2 or 4 processes)

Every rank builds the same random tensors (fixed seeds), so each can also run the whole computation alone and
compare. Rank 0 writes what was found to RESULTS.json, which the notebook reads:

- ring attention (``d2l_ext.context``), forward and backward, causal and not, contiguous and zig-zag, in float64 and
  float32: largest differences from one process, and the bytes each rank sent, counted by ``Ring``;
- Ulysses: the output's difference from one process, and its all-to-all bytes;
- a top-2 mixture of experts with the experts split over the ranks (``d2l_ext.experts``): output and gradient
  differences, tokens per expert, dropped tokens, all-to-all bytes;
- the deprecated ``torch.distributed.nn.functional.all_gather`` against the functional collective: K/V gradients;
- torch's own ``context_parallel``: its error on a CPU, or its difference from the ring on GPUs.

The device and backend come from ``d2l_ext.ranks.join``: NCCL and one GPU per rank where there are enough GPUs,
else gloo on the CPU.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist

from d2l_ext import context, experts
from d2l_ext.ranks import join, leave

USAGE = "start it with 2 or 4 processes: torchrun --nproc-per-node=2 scripts/long_and_experts.py RESULTS.json"
B, S, D, HEADS = 2, 64, 16, 4  # batch, sequence, head size, heads (Ulysses)


def relative(difference: torch.Tensor, reference: torch.Tensor) -> float:
    """Return the largest difference relative to the largest reference value."""
    return (difference.abs().max() / reference.abs().max()).item()


def grad(t: torch.Tensor) -> torch.Tensor:
    """Return ``t``'s gradient (after backward)."""
    assert t.grad is not None
    return t.grad


def world_group() -> dist.ProcessGroup:
    """Return the default process group."""
    group = dist.group.WORLD
    assert group is not None
    return group


def worst(value: float) -> float:
    """Return the largest ``value`` over the ranks."""
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def same_random(*shape: int, seed: int, dtype=torch.float64, device=None) -> torch.Tensor:
    """The same random tensor on every rank."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(device, dtype)


def ring_check(dtype: torch.dtype, causal: bool, layout: str, device: torch.device) -> dict:
    """Ring attention forward and backward against one process: errors and bytes sent."""
    rank, world = dist.get_rank(), dist.get_world_size()
    q, k, v, upstream = (same_random(B, S, D, seed=i, dtype=dtype, device=device) for i in range(4))
    whole = [t.clone().requires_grad_() for t in (q, k, v)]
    (context.full_attention(whole[0], whole[1], whole[2], causal=causal) * upstream).sum().backward()
    mine = context.positions(S, world, rank, layout).to(device)
    parts = [t[:, mine].clone().requires_grad_() for t in (q, k, v)]
    ring = context.Ring()
    out = context.ring_attention(parts[0], parts[1], parts[2], ring, S, causal=causal, layout=layout)
    forward_bytes = ring.bytes_sent
    (out * upstream[:, mine]).sum().backward()
    reference = context.full_attention(q, k, v, causal=causal)[:, mine]
    size = torch.finfo(dtype).bits // 8
    return {"dtype": str(dtype).removeprefix("torch."), "causal": causal, "layout": layout,
            "output_error": worst(relative(out - reference, reference)),
            "gradient_error": worst(max(relative(grad(p) - grad(w)[:, mine], grad(w)[:, mine])
                                        for p, w in zip(parts, whole, strict=True))),
            "forward_bytes": forward_bytes, "backward_bytes": ring.bytes_sent - forward_bytes,
            "forward_formula": context.ring_bytes(B, S, D, world, size),
            "backward_formula": context.ring_bytes(B, S, D, world, size, backward=True)}


def counted_all_to_all(sent_bytes: list[int]):
    """An all-to-all of rows along dimension 0 (equal blocks), counting the bytes sent to other ranks."""
    world = dist.get_world_size()

    def exchange(t: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(t)
        dist.all_to_all_single(out, t)
        sent_bytes[0] += t.numel() * t.element_size() * (world - 1) // world
        return out
    return exchange


def ulysses_check(device: torch.device) -> dict:
    """Ulysses against one process, and its bytes against ring attention's for the same tensors."""
    rank, world = dist.get_rank(), dist.get_world_size()
    q, k, v = (same_random(B, S, HEADS, D, seed=10 + i, device=device) for i in range(3))
    sent = [0]
    shard = slice(rank * S // world, (rank + 1) * S // world)
    out = context.ulysses_attention(q[:, shard], k[:, shard], v[:, shard], world, counted_all_to_all(sent),
                                    causal=True)
    heads = [t.transpose(1, 2) for t in (q, k, v)]
    reference = context.full_attention(*heads, causal=True).transpose(1, 2)[:, shard]
    return {"output_error": worst((out - reference).abs().max().item()), "bytes": sent[0],
            "formula": context.ulysses_bytes(B, S, HEADS, D, world, 8),
            "ring_bytes": context.multihead_ring_bytes(B, S, HEADS, D, world, 8)}


def autograd_all_to_all(sent_bytes: list[int]):
    """The autograd all-to-all of rows (functional collectives), counting the bytes sent to other ranks."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor  # private

    rank = dist.get_rank()

    def exchange(t: torch.Tensor, out_splits: list[int], in_splits: list[int]) -> torch.Tensor:
        sent_bytes[0] += (sum(in_splits) - in_splits[rank]) * t.shape[1] * t.element_size()
        out = all_to_all_single_autograd(t.contiguous(), out_splits, in_splits, world_group())
        return wait_tensor(out)
    return exchange


def moe_check(device: torch.device, tokens: int = 24, experts_count: int = 4) -> dict:
    """A top-2 MoE with experts split over the ranks against the same MoE in one process."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    moe = experts.MoE(D, 32, experts_count, top_k=2, capacity_factor=1.0).double().to(device)
    x_all = same_random(world * tokens, D, seed=20, device=device)
    grad_all = same_random(world * tokens, D, seed=21, device=device)
    ours = slice(rank * tokens, (rank + 1) * tokens)
    # one process: the same MoE on each rank's tokens (a capacity per rank, as expert parallelism has)
    x_ref = x_all.clone().requires_grad_()
    outputs = [moe(x_ref[r * tokens:(r + 1) * tokens])[0] for r in range(world)]
    (torch.cat(outputs) * grad_all).sum().backward()
    reference = outputs[rank].detach()
    reference_grads = [grad(p).clone() for p in moe.experts.parameters()]
    moe.zero_grad()
    x = x_all[ours].clone().requires_grad_()
    sent = [0]

    def exchange_counts(counts: torch.Tensor) -> torch.Tensor:
        got = torch.empty_like(counts)
        dist.all_to_all_single(got, counts.contiguous())
        return got
    out, routing = experts.expert_parallel_forward(moe, x, rank, world, autograd_all_to_all(sent), exchange_counts)
    (out * grad_all[ours]).sum().backward()
    local = experts_count // world
    mine = [p for e in range(rank * local, (rank + 1) * local) for p in moe.experts[e].parameters()]
    theirs = [g for e in range(rank * local, (rank + 1) * local)
              for g in reference_grads[2 * e:2 * e + 2]]
    counts = routing.tokens_per_expert(experts_count)
    assigned = torch.bincount(routing.experts.flatten(), minlength=experts_count)
    all_counts = [torch.empty_like(counts) for _ in range(world)]
    dist.all_gather(all_counts, counts)
    return {"output_error": worst((out - reference).abs().max().item()),
            "expert_gradient_error": worst(max((grad(p) - g).abs().max().item()
                                               for p, g in zip(mine, theirs, strict=True))),
            "input_gradient_error": worst((grad(x) - grad(x_ref)[ours]).abs().max().item()),
            "tokens_per_expert": [c.tolist() for c in all_counts], "capacity": routing.capacity,
            "dropped": routing.dropped(),
            "dropped_formula": int((assigned - routing.capacity).clamp(min=0).sum()),
            "bytes": sent[0],
            "bytes_formula": experts.all_to_all_bytes(torch.stack(all_counts), rank, D, 8),
            "balance_loss": round(experts.load_balancing_loss(routing).item(), 4)}


def all_gather_check(device: torch.device) -> dict:
    """K/V all-gathered for attention: gradients through the deprecated autograd all-gather and the functional one."""
    import warnings

    import torch.distributed._functional_collectives as functional
    import torch.distributed.nn.functional as deprecated

    rank, world = dist.get_rank(), dist.get_world_size()
    q, k, v, upstream = (same_random(B, S, D, seed=30 + i, device=device) for i in range(4))
    whole = [t.clone().requires_grad_() for t in (k, v)]
    (context.full_attention(q, whole[0], whole[1]) * upstream).sum().backward()
    mine = slice(rank * S // world, (rank + 1) * S // world)
    errors = {}
    for name in ("deprecated", "functional"):
        parts = [t[:, mine].clone().requires_grad_() for t in (k, v)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the deprecation warning
            if name == "deprecated":
                gathered = [torch.cat(deprecated.all_gather(p), dim=1) for p in parts]
            else:
                gathered = [functional.all_gather_tensor_autograd(p, 1, world_group()) for p in parts]
        (context.full_attention(q[:, mine], gathered[0], gathered[1]) * upstream[:, mine]).sum().backward()
        errors[name] = worst(max((grad(p) - grad(w)[:, mine]).abs().max().item()
                                 for p, w in zip(parts, whole, strict=True)))
    return errors


def context_parallel_check(device: torch.device) -> dict:
    """torch's own context_parallel: its error on a CPU, or on GPUs its difference from the from-scratch ring."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    rank, world = dist.get_rank(), dist.get_world_size()
    q, k, v = (same_random(B, HEADS, S, D, seed=40 + i, dtype=torch.float32, device=device) for i in range(3))
    try:
        mesh = init_device_mesh(device.type, (world,))
        buffers = [q.clone(), k.clone(), v.clone()]
        with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2, 2, 2]):
            out = context.full_attention(*buffers, causal=True)
        from torch.distributed.tensor.experimental._context_parallel._attention import (  # private, pinned torch
            context_parallel_unshard,
        )

        (whole,) = context_parallel_unshard(mesh, [out], [2])  # back in sequence order
    except Exception as error:  # noqa: BLE001 - the error is the finding, whatever its type
        first = (str(error).strip().splitlines() or [""])[0]
        return {"works": False, "error": f"{type(error).__name__}: {first[:160]}"}
    mine = context.positions(S, world, rank, "zigzag").to(device)
    ring = context.ring_attention(q[:, :, mine], k[:, :, mine], v[:, :, mine], context.Ring(), S, causal=True,
                                  layout="zigzag")
    return {"works": True, "error": None, "difference_from_ring": worst((whole[:, :, mine] - ring).abs().max().item())}


def main(path: str) -> None:
    started = time.perf_counter()
    _, device, backend = join()
    world = dist.get_world_size()
    results: dict = {"processes": world, "backend": backend, "device": device.type,
                     "torch": torch.__version__.split("+")[0]}
    results["ring"] = [ring_check(dtype, causal, layout, device)
                       for dtype in (torch.float64, torch.float32)
                       for causal, layout in ((False, "contiguous"), (True, "contiguous"), (True, "zigzag"))]
    results["ulysses"] = ulysses_check(device)
    results["moe"] = moe_check(device)
    results["all_gather"] = all_gather_check(device)
    results["context_parallel"] = context_parallel_check(device)
    results["seconds"] = round(time.perf_counter() - started, 2)
    if dist.get_rank() == 0:
        with open(path, "w", encoding="utf-8") as out:
            json.dump(results, out, indent=1)
    leave()


if __name__ == "__main__":
    if len(sys.argv) != 2 or os.environ.get("WORLD_SIZE") not in ("2", "4"):
        sys.exit(USAGE)
    main(sys.argv[1])
