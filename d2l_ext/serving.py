"""Chapter 13: serving a model. A small GPT with grouped-query attention and a KV cache, trained on text the
course ships; the cache's bytes; a paged cache with a block allocator; and quantized weights.

The scheduler (continuous batching) and speculative decoding are in ``d2l_ext.serving_sched``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .roofline import DTYPE_BYTES, kv_cache_bytes_per_token

# Published configurations (Meta's config.json of each model on Hugging Face, meta-llama/Meta-Llama-3-8B and
# meta-llama/Meta-Llama-3-70B: num_hidden_layers, num_attention_heads, num_key_value_heads, hidden_size;
# head_dim = hidden_size / num_attention_heads = 4096 / 32 = 8192 / 64 = 128).
LLAMA3 = {"Llama 3 8B": {"layers": 32, "heads": 32, "kv_heads": 8, "head_dim": 128},
          "Llama 3 70B": {"layers": 80, "heads": 64, "kv_heads": 8, "head_dim": 128}}
LLAMA3_SOURCE = ("Meta, config.json of meta-llama/Meta-Llama-3-8B and meta-llama/Meta-Llama-3-70B "
                 "(Hugging Face, April 2024)")


def kv_cache_bytes(*, layers: int, kv_heads: int, head_dim: int, tokens: int = 1, batch: int = 1,
                   dtype: str = "bfloat16") -> int:
    """Bytes of KV cache for ``batch`` sequences of ``tokens`` tokens: 2 · layers · kv_heads · head_dim · bytes
    per token (a key and a value per layer), the formula of chapter 10's ``roofline.kv_cache_bytes_per_token``."""
    if tokens < 0 or batch < 0:
        raise ValueError(f"tokens and batch must be at least 0, got {tokens} and {batch}")
    return kv_cache_bytes_per_token(layers, kv_heads, head_dim, dtype) * tokens * batch


def course_text(name: str = "LICENSE") -> str:
    """The text of the course's ``name`` (its LICENSE: a text that does not change), found from the working
    folder upwards, as a notebook or a script runs."""
    for folder in [Path.cwd(), *Path.cwd().parents]:
        if (folder / name).is_file():
            return (folder / name).read_text(encoding="utf-8")
    raise FileNotFoundError(f"no {name} in {Path.cwd()} or a folder above it")


class Vocabulary:
    """Characters as token ids: the sorted characters of a text."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.ids = {c: i for i, c in enumerate(self.chars)}

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor([self.ids[c] for c in text])

    def decode(self, tokens: torch.Tensor) -> str:
        return "".join(self.chars[int(t)] for t in tokens)


# ------------------------------------------------------------------------------------------------ the caches
class ContiguousCache:
    """One sequence's keys and values, ``context`` positions reserved in advance for each layer."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, context: int, dtype=torch.float32,
                 device=None):
        self.k = torch.zeros(layers, kv_heads, context, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store keys and values (kv_heads, T, head_dim) at positions start..start+T-1."""
        self.k[layer, :, start:start + k.shape[1]] = k
        self.v[layer, :, start:start + v.shape[1]] = v

    def read(self, layer: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[layer, :, :length], self.v[layer, :, :length]


class BlockAllocator:
    """A pool of ``blocks`` blocks of ``block_size`` positions, and the list of the free ones."""

    def __init__(self, blocks: int, block_size: int, layers: int, kv_heads: int, head_dim: int,
                 dtype=torch.float32):
        self.block_size = block_size
        self.k = torch.zeros(blocks, layers, kv_heads, block_size, head_dim, dtype=dtype)
        self.v = torch.zeros_like(self.k)
        self.free = list(range(blocks))

    def allocate(self, n: int) -> list[int]:
        if n > len(self.free):
            raise ValueError(f"out of KV blocks: {len(self.free)} free of {len(self.k)}, {n} asked for")
        taken, self.free = self.free[:n], self.free[n:]
        return taken

    def release(self, blocks: list[int]) -> None:
        self.free.extend(blocks)


class PagedCache:
    """One sequence's keys and values in blocks of an allocator's pool; its block table lists them in order."""

    def __init__(self, allocator: BlockAllocator):
        self.pool, self.table = allocator, []

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        size, end = self.pool.block_size, start + k.shape[1]
        needed = -(-end // size) - len(self.table)
        if needed > 0:
            self.table += self.pool.allocate(needed)
        for position in range(start, end):
            block, offset = self.table[position // size], position % size
            self.pool.k[block, layer, :, offset] = k[:, position - start]
            self.pool.v[block, layer, :, offset] = v[:, position - start]

    def read(self, layer: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        blocks = self.table[:-(-length // self.pool.block_size)]
        k = torch.cat(list(self.pool.k[blocks, layer]), dim=1)[:, :length]  # (kv_heads, positions, head_dim)
        v = torch.cat(list(self.pool.v[blocks, layer]), dim=1)[:, :length]
        return k, v

    def release(self) -> None:
        self.pool.release(self.table)
        self.table = []


# ------------------------------------------------------------------------------------------------- the model
def check_heads(heads: int, kv_heads: int) -> None:
    if kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"{heads} query heads are not a multiple of {kv_heads} KV heads: each KV head must "
                         "serve the same number of query heads")


class Block(nn.Module):
    """Pre-norm attention with ``kv_heads`` key and value heads shared by ``heads`` query heads, then an MLP.
    ``reduce`` adds the partial outputs of tensor-parallel ranks (after the attention and after the MLP)."""

    def __init__(self, dim: int, heads: int, kv_heads: int, head_dim: int, ffn: int):
        super().__init__()
        check_heads(heads, kv_heads)
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.q = nn.Linear(dim, heads * head_dim, bias=False)
        self.k = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.v = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.out = nn.Linear(heads * head_dim, dim, bias=False)
        self.up, self.down = nn.Linear(dim, ffn, bias=False), nn.Linear(ffn, dim, bias=False)

    def forward(self, x, layer, caches, starts, reduce):
        (b, t, _), hd = x.shape, self.head_dim
        h = self.norm1(x)
        q = self.q(h).view(b, t, self.heads, hd).transpose(1, 2)
        k = self.k(h).view(b, t, self.kv_heads, hd).transpose(1, 2)
        v = self.v(h).view(b, t, self.kv_heads, hd).transpose(1, 2)
        if caches is not None:  # store the new keys and values, read the whole context back
            for row, cache in enumerate(caches):
                cache.write(layer, starts[row], k[row], v[row])
            longest = max(starts) + t
            pairs = [cache.read(layer, start + t) for cache, start in zip(caches, starts, strict=True)]
            k = torch.stack([F.pad(kk, (0, 0, 0, longest - kk.shape[1])) for kk, _ in pairs])
            v = torch.stack([F.pad(vv, (0, 0, 0, longest - vv.shape[1])) for _, vv in pairs])
        group = self.heads // self.kv_heads  # query heads per KV head
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
        positions = torch.tensor(starts, device=x.device)[:, None] + torch.arange(t, device=x.device)
        visible = torch.arange(k.shape[2], device=x.device) <= positions[:, :, None]  # (b, t, keys): causal, no padding
        scores = scores.masked_fill(~visible[:, None], float("-inf"))
        attended = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, self.heads * hd)
        x = x + reduce(self.out(attended))
        return x + reduce(self.down(F.gelu(self.up(self.norm2(x)))))


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


class GPT(nn.Module):
    """A character GPT: token and position embeddings, ``layers`` blocks, a final norm and a head."""

    reduce: Callable[[torch.Tensor], torch.Tensor]

    def __init__(self, vocab: int, dim: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                 ffn: int = 256, context: int = 128, head_dim: int | None = None):
        super().__init__()
        self.config = {"vocab": vocab, "dim": dim, "layers": layers, "heads": heads, "kv_heads": kv_heads,
                       "ffn": ffn, "context": context, "head_dim": head_dim or dim // heads}
        self.context, self.head_dim = context, head_dim or dim // heads
        self.embed, self.position = nn.Embedding(vocab, dim), nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, kv_heads, self.head_dim, ffn) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)
        self.reduce = _identity  # tensor parallelism replaces it with an all-reduce

    def new_cache(self, context: int | None = None) -> ContiguousCache:
        weight = self.embed.weight
        return ContiguousCache(len(self.blocks), self.config["kv_heads"], self.head_dim,
                               context or self.context, weight.dtype, weight.device)

    def forward(self, tokens: torch.Tensor, caches=None, starts=None) -> torch.Tensor:
        """Logits for ``tokens`` (batch, T). With ``caches`` (one per row), the tokens sit at positions
        ``starts[row]``.. and attend to what the cache holds before them."""
        b, t = tokens.shape
        starts = list(starts) if starts is not None else [0] * b
        if max(starts) + t > self.context:
            raise ValueError(f"{max(starts) + t} positions are more than the model's context of {self.context}")
        positions = torch.tensor(starts, device=tokens.device)[:, None] + torch.arange(t, device=tokens.device)
        x = self.embed(tokens) + self.position(positions)
        for layer, block in enumerate(self.blocks):
            x = block(x, layer, caches, starts, self.reduce)
        return self.head(self.norm(x))


def linear_weights(model: nn.Module) -> int:
    """The numbers in the model's matrix products' weights (every ``nn.Linear``): 2 FLOPs each per token."""
    total = 0
    for m in model.modules():
        if isinstance(m, nn.Linear | Int8Linear):
            total += m.weight.numel()
    return total


def forward_flops(model: GPT, new: int, context: int) -> int:
    """FLOPs of one forward of ``new`` tokens that attend to ``context`` positions: 2 per weight per token, and
    2 · 2 · heads · head_dim per (token, position) pair in each layer (the scores, then the sum of values)."""
    c = model.config
    return 2 * linear_weights(model) * new + 4 * c["layers"] * c["heads"] * c["head_dim"] * new * context


def check_prompt(model: GPT, prompt: torch.Tensor, new_tokens: int) -> None:
    if new_tokens < 0:
        raise ValueError(f"new_tokens must be at least 0, got {new_tokens}")
    if len(prompt) + new_tokens > model.context:
        raise ValueError(f"a prompt of {len(prompt)} tokens plus {new_tokens} new ones is longer than the "
                         f"model's context of {model.context}")


@torch.no_grad()
def generate(model: GPT, prompt: torch.Tensor, new_tokens: int, cache=None, use_cache: bool = True):
    """Greedy decoding: the prompt then ``new_tokens`` tokens. Without the cache, every step runs the model on the
    whole sequence so far; with it (a ``ContiguousCache`` unless ``cache`` is given), the prompt once (prefill)
    then one token a step (decode)."""
    check_prompt(model, prompt, new_tokens)
    tokens = prompt.clone()
    if new_tokens == 0:
        return tokens
    if not use_cache:
        for _ in range(new_tokens):
            tokens = torch.cat([tokens, model(tokens[None])[0, -1].argmax()[None]])
        return tokens
    cache = cache if cache is not None else model.new_cache()
    logits = model(prompt[None], [cache], [0])  # prefill
    for _ in range(new_tokens):
        tokens = torch.cat([tokens, logits[0, -1].argmax()[None]])
        if len(tokens) - len(prompt) < new_tokens:
            logits = model(tokens[None, -1:], [cache], [len(tokens) - 1])  # decode
    return tokens


def train(model: GPT, data: torch.Tensor, steps: int = 300, batch: int = 32, length: int = 64,
          lr: float = 1e-2, seed: int = 0) -> float:
    """Train ``model`` to predict the next token of random windows of ``data``; return the last loss."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    loss = torch.tensor(float("nan"))
    for _ in range(steps):
        starts = torch.randint(len(data) - length - 1, (batch,), generator=generator)
        window = torch.stack([data[s:s + length + 1] for s in starts])
        loss = F.cross_entropy(model(window[:, :-1]).flatten(0, 1), window[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss.item()


# ------------------------------------------------------------------------------------------- quantization
class Int8Linear(nn.Module):
    """A linear layer whose weights are stored in int8, one float32 scale per output row (symmetric: the
    row's largest magnitude maps to 127). The product dequantizes them: fewer bytes to read, the same FLOPs."""

    weight: torch.Tensor
    scale: torch.Tensor

    def __init__(self, linear: nn.Linear):
        super().__init__()
        w = linear.weight.detach()
        scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127
        self.register_buffer("weight", (w / scale).round().clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.to(x.dtype) * self.scale)


def quantize_int8(model: GPT) -> GPT:
    """A copy of ``model`` with every linear layer replaced by an ``Int8Linear``."""
    import copy

    copied = copy.deepcopy(model)
    for module in list(copied.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, Int8Linear(child))
    return copied


def import_torchao():
    """Import and return torchao (requirements.txt pins it). Importing torchao 0.18 under torch 2.14 logs one
    warning about an enum inside torchao (torch.utils._pytree's logger); only that logger is quieted, meanwhile."""
    import logging

    pytree = logging.getLogger("torch.utils._pytree")
    level = pytree.level
    pytree.setLevel(logging.ERROR)
    try:
        import torchao
        import torchao.quantization  # noqa: F401  (the submodule the chapter uses)
    finally:
        pytree.setLevel(level)
    return torchao


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Bytes a tensor stores. A quantized tensor subclass (torchao's ``Int8Tensor``, ...) reports the float
    shape it stands for, so its bytes are those of the tensors it holds (``__tensor_flatten__``)."""
    flatten = getattr(tensor, "__tensor_flatten__", None)
    if flatten is not None:
        names, _ = flatten()
        return sum(tensor_bytes(inner) for inner in (getattr(tensor, n) for n in names) if inner is not None)
    return tensor.numel() * tensor.element_size()


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters and buffers (int8 weights and their scales included, torchao's too)."""
    return sum(tensor_bytes(t) for t in [*model.parameters(), *model.buffers()])


def decode_setting(gpus: int) -> tuple[str, torch.dtype]:
    """The device and dtype the chapter's GPU cell times decode in, from the number of GPUs torch reports:
    the first GPU in float16 (weights read at 2 bytes each, as served), or the CPU in float32 without one."""
    return ("cuda", torch.float16) if gpus > 0 else ("cpu", torch.float32)


def step_seconds(params: float, dtype: str, bandwidth: float, batch: int = 1, context: int = 0,
                 kv_bytes_per_token: float = 0) -> float:
    """The bandwidth model of one decode step: every weight and each sequence's KV cache read once."""
    return (params * DTYPE_BYTES[dtype] + batch * context * kv_bytes_per_token) / bandwidth
