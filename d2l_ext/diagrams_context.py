"""Chapter 14's pictures: the ring's steps, zig-zag chunks, Ulysses' two all-to-alls, tokens routed to experts."""

from __future__ import annotations

import matplotlib.pyplot as plt
import torch

from d2l_ext import context
from d2l_ext.diagrams_serving import _box, _frame  # chapter 13's boxes and frames, drawn the same way

RANK_COLOURS = ("#8ecae6", "#f4a261", "#b5e48c", "#cdb4db")


def draw_ring(ranks: int = 4):
    """Each row is a step: rank r (column) holds its own queries and the K/V block of rank (r - step) mod n."""
    fig, ax = plt.subplots(figsize=(5, 0.5 + 0.6 * ranks))
    for step in range(ranks):
        y = ranks - 1 - step
        ax.text(-0.2, y + 0.4, f"step {step}", ha="right", va="center", fontsize=8)
        for rank in range(ranks):
            source = (rank - step) % ranks
            _box(ax, rank * 1.2, y, RANK_COLOURS[source % 4], f"Q{rank}·KV{source}", w=1.1)
    for rank in range(ranks):
        ax.text(rank * 1.2 + 0.55, -0.35, f"rank {rank}", ha="center", fontsize=8)
    _frame(ax, "K/V blocks move one rank on each step (colour: owner)")
    return fig


def draw_zigzag(seq_len: int = 16, ranks: int = 2):
    """The causal score matrix, each query row coloured by the rank that computes it: contiguous, then zig-zag."""
    fig, axes = plt.subplots(1, 2, figsize=(7, 3.4))
    for ax, layout in zip(axes, context.LAYOUTS, strict=True):
        owner = torch.empty(seq_len, dtype=torch.long)
        for rank in range(ranks):
            owner[context.positions(seq_len, ranks, rank, layout)] = rank
        for q in range(seq_len):
            for k in range(q + 1):  # only keys at or before the query are computed
                _box(ax, k, seq_len - 1 - q, RANK_COLOURS[int(owner[q]) % 4], w=1, h=1)
        work = context.attention_work_per_rank(seq_len, ranks, layout)
        ax.set_xlabel("key position")
        _frame(ax, f"{layout}: scores per rank {work}")
    return fig


def draw_ulysses(ranks: int = 2, heads: int = 4):
    """Sequence shards (rows by rank) become head shards (columns by rank) with one all-to-all, and back."""
    fig, axes = plt.subplots(1, 3, figsize=(8, 2.6))
    chunks = 2 * ranks
    titles = ("split by sequence", "all-to-all: split by heads", "all-to-all back")
    for ax, title, by_heads in zip(axes, titles, (False, True, False), strict=True):
        for chunk in range(chunks):
            for head in range(heads):
                owner = head * ranks // heads if by_heads else chunk * ranks // chunks
                _box(ax, head, chunks - 1 - chunk, RANK_COLOURS[owner % 4], f"s{chunk}h{head}")
        ax.text(heads / 2, -0.6, "heads →", ha="center", fontsize=8)
        _frame(ax, title)
    return fig


def draw_routing(tokens: int = 8, experts: int = 4, ranks: int = 2, top_k: int = 2, seed: int = 0):
    """Each token (left) goes to its top-k experts (right), which live on different ranks."""
    fig, ax = plt.subplots(figsize=(5, 3.2))
    g = torch.Generator().manual_seed(seed)
    chosen = torch.randn(tokens, experts, generator=g).topk(top_k, dim=-1).indices
    per_rank = experts // ranks
    for t in range(tokens):
        _box(ax, 0, tokens - 1 - t, RANK_COLOURS[t * ranks // tokens % 4], f"t{t}")
    spacing = tokens / experts
    for e in range(experts):
        y = tokens - (e + 0.5) * spacing - 0.4
        _box(ax, 4, y, RANK_COLOURS[e // per_rank % 4], f"expert {e}", w=1.6)
        for t in torch.nonzero((chosen == e).any(-1)).flatten().tolist():
            ax.plot([0.9, 4], [tokens - 1 - t + 0.4, y + 0.4], color="gray", linewidth=0.6)
    _frame(ax, f"Top-{top_k} routing (colour: the rank)")
    return fig
