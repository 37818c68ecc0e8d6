"""Mixture of experts from scratch (chapter 14): a top-k router with a capacity, and experts split over ranks.

A router scores each token against every expert; the token goes to its top k experts, and its output is their
outputs weighted by the router's (renormalised) probabilities. Each expert takes at most ``capacity`` tokens
(the capacity factor times an even share); tokens beyond it are dropped for that expert, in token order.
The load-balancing loss (Switch Transformer, Fedus et al., 2021) pushes the router to spread tokens evenly.

Expert parallelism: each rank holds E/n experts. Tokens are dispatched to the rank of their expert with one
``all_to_all_single``, and their outputs come back with a second one (``ExpertParallelMoE``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn


def check_moe(experts: int, top_k: int, capacity_factor: float, ranks: int = 1) -> None:
    """Raise ValueError if top-k exceeds the experts, the capacity factor is not positive, or experts do not split."""
    if not 1 <= top_k <= experts:
        raise ValueError(f"top-k must be between 1 and the {experts} experts, not {top_k}")
    if capacity_factor <= 0:
        raise ValueError(f"the capacity factor must be above 0, not {capacity_factor}")
    if ranks < 1 or experts % ranks:
        raise ValueError(f"{experts} experts do not split over {ranks} ranks")


def capacity(tokens: int, experts: int, top_k: int, capacity_factor: float) -> int:
    """Return the most tokens one expert takes: ceil(capacity_factor · tokens · k / experts)."""
    check_moe(experts, top_k, capacity_factor)
    return math.ceil(capacity_factor * tokens * top_k / experts)


@dataclass
class Routing:
    """A router's decision for a batch of tokens: which experts, with what weights, and what was kept."""

    experts: torch.Tensor  # (tokens, k) expert indices
    weights: torch.Tensor  # (tokens, k) their weights (renormalised top-k probabilities)
    kept: torch.Tensor  # (tokens, k) False where the expert was over capacity
    probabilities: torch.Tensor  # (tokens, experts) the router's softmax
    capacity: int

    def tokens_per_expert(self, experts: int) -> torch.Tensor:
        """Return how many (kept) tokens each expert gets."""
        return torch.bincount(self.experts[self.kept], minlength=experts)

    def dropped(self) -> int:
        """Return how many (token, expert) assignments were dropped for capacity."""
        return int((~self.kept).sum())


def route(logits: torch.Tensor, top_k: int, capacity_factor: float) -> Routing:
    """Return the top-k routing of (tokens, experts) router logits, with each expert's capacity applied."""
    tokens, experts = logits.shape
    limit = capacity(tokens, experts, top_k, capacity_factor)
    probabilities = logits.softmax(-1)
    top, chosen = probabilities.topk(top_k, dim=-1)
    weights = top / top.sum(-1, keepdim=True)
    # an assignment's place in its expert's queue, in token order (then by choice), decides if it fits
    flat = chosen.flatten()
    one_hot = torch.nn.functional.one_hot(flat, experts)
    place = (one_hot.cumsum(0) * one_hot).sum(-1) - 1
    return Routing(chosen, weights, (place < limit).reshape(tokens, top_k), probabilities, limit)


def load_balancing_loss(routing: Routing) -> torch.Tensor:
    """Return Switch's auxiliary loss: experts · Σ_e (share of choices of e) · (mean probability of e); 1 if even."""
    experts = routing.probabilities.shape[-1]
    share = torch.bincount(routing.experts.flatten(), minlength=experts) / routing.experts.numel()
    return experts * (share.to(routing.probabilities.dtype) * routing.probabilities.mean(0)).sum()


class Expert(nn.Module):
    """One expert: a two-layer MLP, dim → hidden → dim."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.up, self.down = nn.Linear(dim, hidden, bias=False), nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


class MoE(nn.Module):
    """A top-k mixture-of-experts layer in one process; ``forward`` returns the output and the routing."""

    def __init__(self, dim: int, hidden: int, experts: int, top_k: int = 2, capacity_factor: float = 1.25):
        super().__init__()
        check_moe(experts, top_k, capacity_factor)
        self.router = nn.Linear(dim, experts, bias=False)
        self.experts = nn.ModuleList(Expert(dim, hidden) for _ in range(experts))
        self.top_k, self.capacity_factor = top_k, capacity_factor

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, Routing]:
        routing = route(self.router(x), self.top_k, self.capacity_factor)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            token, slot = torch.nonzero((routing.experts == e) & routing.kept, as_tuple=True)
            if len(token):
                out = out.index_add(0, token, routing.weights[token, slot, None] * expert(x[token]))
        return out, routing


def dispatch_order(routing: Routing) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return the kept assignments sorted by expert: their tokens, their slots (which of k), and their experts."""
    token, slot = torch.nonzero(routing.kept, as_tuple=True)
    expert = routing.experts[token, slot]
    order = torch.argsort(expert, stable=True)
    return token[order], slot[order], expert[order]


AllToAll = Callable[[torch.Tensor, list[int], list[int]], torch.Tensor]


def expert_parallel_forward(moe: MoE, x: torch.Tensor, rank: int, ranks: int, all_to_all: AllToAll,
                            exchange_counts: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, Routing]:
    """Return this rank's MoE output for its tokens ``x``, running only its experts (E/n of ``moe.experts``).

    ``exchange_counts`` is an all-to-all of (ranks, experts/n) counts; ``all_to_all(t, out_splits, in_splits)``
    an autograd all-to-all of rows. The router and every expert's weights are the same on every rank, but only
    the local experts are used."""
    experts = len(moe.experts)
    check_moe(experts, moe.top_k, moe.capacity_factor, ranks)
    local = experts // ranks
    routing = route(moe.router(x), moe.top_k, moe.capacity_factor)
    token, slot, expert = dispatch_order(routing)
    counts = torch.bincount(expert, minlength=experts)  # rows for each expert, in expert order
    received = exchange_counts(counts.reshape(ranks, local))  # (source rank, local expert) rows that arrive
    send_splits = counts.reshape(ranks, local).sum(1).tolist()
    receive_splits = received.sum(1).tolist()
    rows = all_to_all(x[token], receive_splits, send_splits)  # grouped by source rank, then local expert
    sizes = received.flatten().tolist()
    pieces = list(rows.split(sizes))
    outputs = [moe.experts[rank * local + i % local](piece) for i, piece in enumerate(pieces)]
    back = all_to_all(torch.cat(outputs), send_splits, receive_splits)  # in the order the rows left
    out = torch.zeros_like(x).index_add(0, token, routing.weights[token, slot, None] * back)
    return out, routing


def all_to_all_bytes(tokens_per_expert: torch.Tensor, rank: int, dim: int, bytes_per_number: int) -> int:
    """Return the bytes ``rank`` sends to other ranks in dispatch and combine, from every rank's (ranks, experts)
    tokens per expert: its rows for other ranks' experts, then the other ranks' rows back from its own experts."""
    ranks, experts = tokens_per_expert.shape
    per_rank = tokens_per_expert.reshape(ranks, ranks, experts // ranks).sum(-1)  # (from rank, to rank) rows
    dispatched = int(per_rank[rank].sum() - per_rank[rank, rank])
    returned = int(per_rank[:, rank].sum() - per_rank[rank, rank])
    return (dispatched + returned) * dim * bytes_per_number


def expert_parallel_bytes(tokens: int, top_k: int, dim: int, ranks: int, bytes_per_number: int) -> float:
    """Return the expected bytes a rank sends per layer with expert parallelism, routing even: 2·T·k·D·b·(n-1)/n."""
    return 2 * tokens * top_k * dim * bytes_per_number * (ranks - 1) / ranks


def expert_gather_bytes(experts: int, dim: int, hidden: int, ranks: int, bytes_per_number: int,
                        matrices: int = 2) -> float:
    """Return the bytes a rank receives to all-gather every expert's weights instead: (n-1)/n · E · m·D·H · b."""
    return experts * matrices * dim * hidden * bytes_per_number * (ranks - 1) / ranks
