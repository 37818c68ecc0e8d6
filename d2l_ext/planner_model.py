"""The course's Llama-style block, small enough to run (chapter 15): the planner's activation and FLOP formulas
are checked against it, and ``scripts/plan_check.py`` trains a stack of them on 4 processes.

Attention is written out (scores, causal mask, softmax, weighted values) rather than fused, so that what
autograd saves is plain to count: the softmax's output grows with the sequence squared. ``recompute``:
"selective" recomputes attention's core from q, k and v in the backward pass (``torch.utils.checkpoint``),
"full" recomputes the whole block from its input.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) x weight, written out."""

    def __init__(self, hidden: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Block(nn.Module):
    """Pre-norm block: grouped-query attention (``kv_heads`` key and value heads), then a SwiGLU MLP."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, ffn: int, recompute: str = "none"):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.recompute = recompute
        self.norm1, self.norm2 = RMSNorm(hidden), RMSNorm(hidden)
        self.q = nn.Linear(hidden, heads * self.head_dim, bias=False)
        self.k = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.o = nn.Linear(heads * self.head_dim, hidden, bias=False)
        self.gate = nn.Linear(hidden, ffn, bias=False)
        self.up = nn.Linear(hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention of (batch, heads, seq, head_dim) queries, keys and values."""
        n = q.shape[-2]
        scores = q @ k.transpose(-2, -1) / self.head_dim**0.5
        mask = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
        return scores.masked_fill(mask, float("-inf")).softmax(-1) @ v

    def split(self, y: torch.Tensor, layer: nn.Linear, heads: int) -> torch.Tensor:
        """(batch, heads, seq, head_dim) of ``layer(y)``, each key or value head repeated for its query heads."""
        b, n, _ = y.shape
        out = layer(y).view(b, n, -1, self.head_dim).transpose(1, 2)
        return out.repeat_interleave(heads // out.shape[1], 1) if out.shape[1] < heads else out

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm1(x)
        q = self.split(y, self.q, 0)  # this rank's heads: all, or its share under tensor parallelism
        k, v = self.split(y, self.k, q.shape[1]), self.split(y, self.v, q.shape[1])
        if self.recompute == "selective":
            a = checkpoint(self.core, q, k, v, use_reentrant=False)
        else:
            a = self.core(q, k, v)
        return x + self.o(a.transpose(1, 2).flatten(2))  # (batch, seq, heads x head_dim)

    def layer(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attention(x)
        y = self.norm2(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute == "full" and torch.is_grad_enabled():
            return checkpoint(self.layer, x, use_reentrant=False)
        return self.layer(x)
