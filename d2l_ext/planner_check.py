"""The planner's predictions for chapter 15's real runs (``scripts/plan_check.py``): a stack of 4 of the course's
blocks in float32 on 4 processes, under each layout they allow, with the collectives each layout calls a step.

Each prediction comes from ``planner``'s own terms: the parameters a rank holds, Adam's two float32 moments
(4 + 4 + 8 bytes a parameter; chapter 8's ZeRO count with float32 weights), ``layer_activation_bytes`` times the
micro-batches in flight on the rank from chapter 9's simulator.
"""

from __future__ import annotations

import math

from . import commcost, pipeline
from .planner import Layout, ModelConfig, gathered_parameters, layer_activation_bytes

MODEL = ModelConfig("plan_check", layers=4, hidden=64, heads=8, kv_heads=4, ffn=128, vocab=0, seq=32,
                    global_batch=8)
COLWISE, ROWWISE, NORMS = 5, 2, 2  # per block: q, k, v, gate, up; o, down; two RMSNorms
# name -> the layout, and how many layers save their all-gathered input whole (PyTorch's SequenceParallel)
LAYOUTS = {
    "DP": (Layout(dp=4, zero=0, micro_batch=2), 0),
    "FSDP2": (Layout(dp=4, zero=3, micro_batch=2), 0),
    "TP": (Layout(tp=4, sp=False, micro_batch=8), 0),
    "TP+SP": (Layout(tp=4, sp=True, micro_batch=8), COLWISE),
    "PP": (Layout(pp=4, zero=0, micro_batch=2), 0),
    "FSDP2 x TP": (Layout(dp=2, tp=2, zero=3, sp=False, micro_batch=4), 0),
    "PP x DP": (Layout(dp=2, pp=2, zero=0, micro_batch=1), 0),
}


def ddp_buckets(gradient_bytes: int, cap: int = 25 << 20) -> int:
    """DDP's buckets for ``gradient_bytes``: the first holds 1 MiB, the others ``cap`` (chapter 10)."""
    rest = max(0, gradient_bytes - commcost.DDP_FIRST_BUCKET_BYTES)
    return 1 + math.ceil(rest / cap)


def predicted_bytes(name: str, rank: int = 0) -> dict[str, float]:
    """The planner's bytes on ``rank`` for the layout ``name``: parameters, gradients, optimizer state,
    activations (what autograd saves, at its peak)."""
    layout, gathered = LAYOUTS[name]
    m = MODEL.global_batch // (layout.dp * layout.micro_batch)
    blocks = MODEL.layers // layout.pp
    held = blocks * MODEL.layer_parameters() / layout.tp  # the norms' weights are in fact whole on each rank
    shards = layout.dp
    in_flight = 1
    if layout.pp > 1:
        stage = rank % layout.pp
        in_flight = pipeline.simulate(pipeline.schedule("1f1b", layout.pp, m)).in_flight(stage)
    one = layer_activation_bytes(MODEL, layout.micro_batch, "none", layout.tp, 1, layout.sp, 4, gathered)
    return {"parameters": 4 * held / (shards if layout.zero == 3 else 1),
            "gradients": 4 * held / (shards if layout.zero >= 2 else 1),
            "optimizer state": 8 * held / (shards if layout.zero >= 1 else 1),
            "activations": blocks * one * in_flight,
            "gathered block": 4 * gathered_parameters(MODEL, layout)[0]}  # one copy of a block, whole (FSDP2)


# MemTracker's kinds, and the planner's terms that make each. FSDP2 holds three copies of a block whole
# (planner.gathered_parameters): its weights are parameters; the all-gather's buffer, kept through the forward, is
# allocated there, so MemTracker files it as an activation; its gradients wait for the reduce-scatter
TRACKED = {"PARAM": ("parameters", "gathered block"), "GRAD": ("gradients", "gathered block"),
           "OPT": ("optimizer state",), "ACT": ("activations", "gathered block")}


def predicted_peaks(name: str, rank: int = 0) -> dict[str, float]:
    """The planner's bytes of each MemTracker kind at its most on ``rank`` under the layout ``name``."""
    terms = predicted_bytes(name, rank)
    return {kind: sum(terms[t] for t in parts) for kind, parts in TRACKED.items()}


def predicted_collectives(name: str) -> dict[str, int]:
    """Collectives a step calls on each rank under the layout ``name``, by kind."""
    layout, _ = LAYOUTS[name]
    blocks = MODEL.layers // layout.pp
    counts: dict[str, int] = {}
    if layout.zero == 3:  # FSDP2: each block gathered for its forward and its backward, gradients scattered
        counts.update(all_gather=2 * blocks, reduce_scatter=blocks)
    elif layout.dp > 1:  # DDP: one all-reduce per bucket
        counts["all_reduce"] = ddp_buckets(4 * blocks * MODEL.layer_parameters())
    if layout.tp > 1 and not layout.sp:  # Megatron's g forward (row-wise layers), f backward (column-wise)
        counts["all_reduce"] = counts.get("all_reduce", 0) + blocks * (ROWWISE + COLWISE)
    if layout.tp > 1 and layout.sp:  # each all-gather's backward is a reduce-scatter, and the reverse
        counts["all_gather"] = counts.get("all_gather", 0) + blocks * (COLWISE + ROWWISE)
        counts["reduce_scatter"] = counts.get("reduce_scatter", 0) + blocks * (ROWWISE + COLWISE)
        # the norms' weight gradients stay partial sums; Adam's step sums them each of the 3 times it reads them
        counts["all_reduce"] = counts.get("all_reduce", 0) + blocks * NORMS * 3
    return counts


KINDS = {"_allgather_base_": "all_gather", "all_gather_into_tensor": "all_gather",
         "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
         "allreduce_": "all_reduce", "all_reduce": "all_reduce", "broadcast_": "broadcast"}


def measured_collectives(counts: dict[str, int]) -> dict[str, int]:
    """CommDebugMode's counts by kind (its c10d and functional names merged)."""
    merged: dict[str, int] = {}
    for op, n in counts.items():
        if op in KINDS:
            merged[KINDS[op]] = merged.get(KINDS[op], 0) + n
    return merged
