"""Context parallelism from scratch (chapter 14): ring attention and Ulysses, for sequences split over ranks.

Ring attention (Liu et al., 2023): each rank keeps the queries of its part of the sequence, and the key and value
blocks travel around a ring of ranks. Each rank merges the block results with an online log-sum-exp, as Flash
attention does within one GPU, so that no rank ever holds the whole score matrix. ``RingAttention`` is the
autograd function: its backward passes K, V and their gradients around the ring again.

Zig-zag layout: with a causal mask, contiguous chunks give the last rank most of the work; rank r taking chunks
r and 2n-1-r of 2n equal chunks balances it (``attention_work_per_rank``).

Ulysses (Jacobs et al., 2023): one all-to-all turns sequence shards into head shards, each rank attends over the
whole sequence for its heads, and a second all-to-all turns them back.

The step functions work on one rank's tensors; the ``simulated_*`` functions run every rank in one process
(what the unit tests check); ``Ring`` does the real transfers with ``torch.distributed``, counting bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

LAYOUTS = ("contiguous", "zigzag")


def chunk_size(seq_len: int, ranks: int, layout: str = "contiguous") -> int:
    """Return the positions in one chunk; ValueError if the sequence does not split evenly for ``layout``."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, not {layout!r}")
    if ranks < 1:
        raise ValueError(f"ranks must be 1 or more, not {ranks}")
    parts = ranks if layout == "contiguous" else 2 * ranks
    if seq_len < parts or seq_len % parts:
        raise ValueError(f"a sequence of {seq_len} does not split evenly into {parts} chunks "
                         f"({layout} layout over {ranks} ranks)")
    return seq_len // parts


def positions(seq_len: int, ranks: int, rank: int, layout: str = "contiguous") -> torch.Tensor:
    """Return the sequence positions that ``rank`` holds: one chunk, or chunks r and 2n-1-r for zig-zag."""
    c = chunk_size(seq_len, ranks, layout)
    if layout == "contiguous":
        return torch.arange(rank * c, (rank + 1) * c)
    last = 2 * ranks - 1 - rank
    return torch.cat([torch.arange(rank * c, (rank + 1) * c), torch.arange(last * c, (last + 1) * c)])


def attention_work_per_rank(seq_len: int, ranks: int, layout: str = "contiguous") -> list[int]:
    """Return the unmasked (query, key) scores of causal attention that each rank computes."""
    # query position p sees keys 0..p: p + 1 scores
    return [int((positions(seq_len, ranks, r, layout) + 1).sum()) for r in range(ranks)]


def contiguous_work(seq_len: int, ranks: int) -> list[int]:
    """Return the closed form of contiguous chunks' causal work: rank r gets r·c² + c(c+1)/2 scores."""
    c = chunk_size(seq_len, ranks, "contiguous")
    return [r * c * c + c * (c + 1) // 2 for r in range(ranks)]


def causal_mask(query_positions: torch.Tensor, key_positions: torch.Tensor) -> torch.Tensor:
    """Return the (queries, keys) mask: True where a query may see a key (key position <= query position)."""
    return key_positions[None, :] <= query_positions[:, None]


def block_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                    guard: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Return attention of ``q`` over one K/V block, normalised within the block, and each row's log-sum-exp.

    A row whose keys are all masked has log-sum-exp -inf; ``guard`` gives it output 0 instead of NaN."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    # exp(-inf - (-inf)) is NaN: subtract 0 on fully masked rows, whose scores are all -inf (weights 0)
    shift = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse)) if guard else lse
    return torch.exp(scores - shift[..., None]) @ v, lse


def merge(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor, block_lse: torch.Tensor,
          guard: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Return the online log-sum-exp merge of two partial attention results over disjoint keys."""
    total = torch.logaddexp(lse, block_lse)
    safe = torch.where(torch.isfinite(total), total, torch.zeros_like(total)) if guard else total
    weight, block_weight = torch.exp(lse - safe)[..., None], torch.exp(block_lse - safe)[..., None]
    return weight * out + block_weight * block_out, total


def block_gradients(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor,
                    lse: torch.Tensor, delta: torch.Tensor, mask: torch.Tensor | None
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return one K/V block's share of dQ, and its dK and dV, from the final log-sum-exp (Flash's backward)."""
    scale = 1 / math.sqrt(q.shape[-1])
    scores = q @ k.transpose(-2, -1) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    p = torch.exp(scores - lse[..., None])  # the final attention weights of this block
    grad_scores = p * (grad_out @ v.transpose(-2, -1) - delta[..., None])
    return grad_scores @ k * scale, grad_scores.transpose(-2, -1) @ q * scale, p.transpose(-2, -1) @ grad_out


def full_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """Return plain attention over the whole sequence (one process), with torch's own kernel."""
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)


def simulated_ring(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ranks: int, causal: bool = False,
                   layout: str = "contiguous", guard: bool = True) -> torch.Tensor:
    """Return ring attention's output with every rank run in this process, in sequence order (forward only)."""
    seq_len = q.shape[-2]
    held = [positions(seq_len, ranks, r, layout) for r in range(ranks)]
    out = torch.empty_like(q)
    for rank in range(ranks):
        mine = held[rank]
        result, lse = block_attention(q[..., mine, :], k[..., mine, :], v[..., mine, :],
                                      causal_mask(mine, mine) if causal else None, guard)
        for step in range(1, ranks):
            source = held[(rank - step) % ranks]  # the block that reached this rank at this step
            mask = causal_mask(mine, source) if causal else None
            block = block_attention(q[..., mine, :], k[..., source, :], v[..., source, :], mask, guard)
            result, lse = merge(result, lse, *block, guard=guard)
        out[..., mine, :] = result
    return out


class Ring:
    """One rank's link in the ring: send to the next rank, receive from the one before, counting bytes sent."""

    def __init__(self, group: dist.ProcessGroup | None = None):
        self.group = group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.bytes_sent = 0

    def start(self, *tensors: torch.Tensor) -> Callable[[], list[torch.Tensor]]:
        """Start passing ``tensors`` on; return a function that waits and returns what arrived."""
        after, before = (self.rank + 1) % self.world, (self.rank - 1) % self.world
        sent = [t.contiguous() for t in tensors]
        arrived = [torch.empty_like(t) for t in sent]
        operations = [dist.P2POp(dist.isend, t, after, self.group) for t in sent]
        operations += [dist.P2POp(dist.irecv, t, before, self.group) for t in arrived]
        requests = dist.batch_isend_irecv(operations)
        self.bytes_sent += sum(t.numel() * t.element_size() for t in sent)

        def wait() -> list[torch.Tensor]:
            for request in requests:
                request.wait()
            return arrived
        return wait

    def shift(self, *tensors: torch.Tensor) -> list[torch.Tensor]:
        """Pass ``tensors`` on and return what arrived."""
        return self.start(*tensors)()


class RingAttention(torch.autograd.Function):
    """Ring attention of this rank's queries over every rank's keys and values; call ``ring_attention``."""

    @staticmethod
    def forward(ctx, q, k, v, ring, held, causal):  # type: ignore[override]
        def mask(step: int) -> torch.Tensor | None:
            return causal_mask(held[ring.rank], held[(ring.rank - step) % ring.world]) if causal else None

        block_k, block_v = k, v
        wait = ring.start(block_k, block_v) if ring.world > 1 else None  # the next block moves meanwhile
        out, lse = block_attention(q, block_k, block_v, mask(0))
        for step in range(1, ring.world):
            assert wait is not None
            block_k, block_v = wait()
            wait = ring.start(block_k, block_v) if step < ring.world - 1 else None
            out, lse = merge(out, lse, *block_attention(q, block_k, block_v, mask(step)))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.held, ctx.causal = ring, held, causal
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        q, k, v, out, lse = ctx.saved_tensors
        ring, held = ctx.ring, ctx.held
        delta = (grad_out * out).sum(-1)
        grad_q = torch.zeros_like(q)
        block_k, block_v, grad_k, grad_v = k, v, torch.zeros_like(k), torch.zeros_like(v)
        for step in range(ring.world):
            source = (ring.rank - step) % ring.world
            mask = causal_mask(held[ring.rank], held[source]) if ctx.causal else None
            if mask is None or bool(mask.any()):  # a fully masked block adds nothing
                dq, dk, dv = block_gradients(q, block_k, block_v, grad_out, lse, delta, mask)
                grad_q, grad_k, grad_v = grad_q + dq, grad_k + dk, grad_v + dv
            if step < ring.world - 1:  # each block's gradients travel with it
                block_k, block_v, grad_k, grad_v = ring.shift(block_k, block_v, grad_k, grad_v)
        grad_k, grad_v = ring.shift(grad_k, grad_v)  # one more step brings them home
        return grad_q, grad_k, grad_v, None, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ring: Ring, seq_len: int,
                   causal: bool = False, layout: str = "contiguous") -> torch.Tensor:
    """Return this rank's attention output for its positions (``positions``), by ring attention."""
    held = [positions(seq_len, ring.world, r, layout).to(q.device) for r in range(ring.world)]
    return RingAttention.apply(q, k, v, ring, held, causal)


def ring_bytes(batch: int, seq_len: int, dim: int, ranks: int, bytes_per_number: int,
               backward: bool = False) -> int:
    """Return the bytes one rank sends: (n-1)·2 blocks forward; backward (n-1)·4 + 2 (K, V and their gradients)."""
    block = batch * chunk_size(seq_len, ranks) * dim * bytes_per_number
    return ((ranks - 1) * 4 + 2) * block if backward else (ranks - 1) * 2 * block


def check_heads(heads: int, ranks: int) -> int:
    """Return the heads each rank keeps in Ulysses; ValueError if ``heads`` do not split over ``ranks``."""
    if ranks < 1 or heads % ranks:
        raise ValueError(f"{heads} heads do not split over {ranks} ranks for Ulysses")
    return heads // ranks


def sequence_to_heads(shard: torch.Tensor, ranks: int, exchange: Callable[[torch.Tensor], torch.Tensor]
                      ) -> torch.Tensor:
    """Turn a (batch, seq/n, heads, dim) sequence shard into a (batch, seq, heads/n, dim) head shard.

    ``exchange`` is the all-to-all: block i of dimension 0 goes to rank i, block i of its result came from rank i."""
    b, s, h, d = shard.shape
    send = shard.reshape(b, s, ranks, check_heads(h, ranks), d).permute(2, 0, 1, 3, 4).contiguous()
    got = exchange(send)  # (ranks, b, s, h/n, d): sequence chunk i from rank i
    return got.permute(1, 0, 2, 3, 4).reshape(b, ranks * s, h // ranks, d)


def heads_to_sequence(shard: torch.Tensor, ranks: int, exchange: Callable[[torch.Tensor], torch.Tensor]
                      ) -> torch.Tensor:
    """Undo ``sequence_to_heads``: a (batch, seq, heads/n, dim) head shard back to (batch, seq/n, heads, dim)."""
    b, s, h, d = shard.shape
    if s % ranks:
        raise ValueError(f"a sequence of {s} does not split evenly over {ranks} ranks")
    send = shard.reshape(b, ranks, s // ranks, h, d).permute(1, 0, 2, 3, 4).contiguous()
    got = exchange(send)  # (ranks, b, s/n, h/n, d): head group i from rank i
    return got.permute(1, 2, 0, 3, 4).reshape(b, s // ranks, ranks * h, d)


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ranks: int,
                      exchange: Callable[[torch.Tensor], torch.Tensor], causal: bool = False) -> torch.Tensor:
    """Return this rank's (batch, seq/n, heads, dim) output: all-to-all, attention on its heads, all-to-all."""
    q, k, v = (sequence_to_heads(t, ranks, exchange).transpose(1, 2) for t in (q, k, v))
    return heads_to_sequence(full_attention(q, k, v, causal).transpose(1, 2), ranks, exchange)


def simulated_all_to_all(sent: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Return what each rank receives when rank r sends block i of ``sent[r]`` to rank i (one process)."""
    return [torch.stack([sent[source][target] for source in range(len(sent))]) for target in range(len(sent))]


def simulated_ulysses(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ranks: int,
                      causal: bool = False) -> torch.Tensor:
    """Return Ulysses attention of (batch, seq, heads, dim) tensors with every rank run in this process."""
    check_heads(q.shape[2], ranks)

    def swap(per_rank: list[torch.Tensor], turn: Callable) -> list[torch.Tensor]:
        sent: list[torch.Tensor] = []

        def keep(x: torch.Tensor) -> torch.Tensor:  # the sending half of each rank's layout change
            sent.append(x)
            return x
        for shard in per_rank:
            turn(shard, ranks, keep)
        got = iter(simulated_all_to_all(sent))
        return [turn(shard, ranks, lambda _: next(got)) for shard in per_rank]

    heads = [swap(list(t.chunk(ranks, dim=1)), sequence_to_heads) for t in (q, k, v)]
    outs = [full_attention(heads[0][r].transpose(1, 2), heads[1][r].transpose(1, 2), heads[2][r].transpose(1, 2),
                           causal).transpose(1, 2) for r in range(ranks)]
    return torch.cat(swap(outs, heads_to_sequence), dim=1)


def ulysses_bytes(batch: int, seq_len: int, heads: int, dim: int, ranks: int, bytes_per_number: int) -> int:
    """Return the bytes one rank sends in Ulysses' forward: 4 all-to-alls (q, k, v in, output back) of (n-1)/n."""
    check_heads(heads, ranks)
    shard = batch * chunk_size(seq_len, ranks) * heads * dim * bytes_per_number
    return 4 * shard * (ranks - 1) // ranks


def multihead_ring_bytes(batch: int, seq_len: int, heads: int, dim: int, ranks: int, bytes_per_number: int) -> int:
    """Return the bytes one rank sends in ring attention's forward with ``heads`` heads: (n-1)·2 K/V blocks."""
    return ring_bytes(batch, seq_len, heads * dim, ranks, bytes_per_number)


class Block(nn.Module):
    """A pre-norm transformer block (attention, then a 4x MLP); ``flash`` uses torch's fused attention kernel,
    which saves no (seq × seq) matrix for backward, instead of softmax(QKᵀ)V written out."""

    def __init__(self, dim: int, heads: int, flash: bool = False):
        super().__init__()
        self.heads, self.flash = heads, flash
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if self.flash:
            a = full_attention(q, k, v, causal=True)
        else:
            scores = (q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)).masked_fill(
                ~causal_mask(torch.arange(s), torch.arange(s)), float("-inf"))
            a = scores.softmax(-1) @ v
        x = x + self.out(a.transpose(1, 2).reshape(b, s, d))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


def activation_bytes(block: Block, batch: int, seq_len: int) -> int:
    """Return the activation bytes autograd saves for one forward of ``block`` (chapter 8's counter)."""
    from d2l_ext.precision import saved_tensor_bytes

    x = torch.randn(batch, seq_len, block.norm1.normalized_shape[0], requires_grad=True)
    return saved_tensor_bytes(lambda: block(x))["activations"]


def ring_schedule(ranks: int, compute_seconds: float, transfer_seconds: float, overlap: bool = True):
    """Return a ``SimulatedDevice`` that ran one rank's ring forward: each step's block attention on the compute
    engine and the next K/V transfer on the comm engine, during it (``overlap``) or after it."""
    from d2l_ext.simqueue import SimulatedDevice

    device = SimulatedDevice()
    arrived: list = []  # the transfer that brought this step's block
    for step in range(ranks):
        later = step < ranks - 1
        sent = device.launch(transfer_seconds, f"K,V {step + 1}", engine="comm", after=arrived) if (
            later and overlap) else None
        work = device.launch(compute_seconds, f"block {step}", after=arrived)
        if later and not overlap:
            sent = device.launch(transfer_seconds, f"K,V {step + 1}", engine="comm", after=[work])
        arrived = [sent] if sent is not None else []
    device.synchronize()
    return device
