"""Plan a run: how to split a model over N GPUs, will it fit, how long will a step take (chapter 15).

The planner is built from the course's tested pieces, and prints every term it adds up:

- memory per GPU: the model state of chapter 8's ZeRO count (``estimate.zero_bytes_per_gpu``: 2 bytes of
  bfloat16 weights, 2 of gradients, 12 of Adam's float32 state per parameter), the activations of one layer
  in closed form (``layer_activation_bytes``, equal to chapter 8's ``estimate.saved_bytes`` on the course's
  block, ``planner_model.Block``), times the micro-batches in flight from chapter 9's simulator;
- step time per GPU: compute from chapter 10's ``roofline.training_seconds`` at a stated efficiency; the pipeline
  bubble from chapter 9's ``pipeline.simulate``; tensor-, context- and expert-parallel collectives on the
  critical path and the data-parallel gradient reduction overlapped with the backward pass, all priced with
  chapter 10's alpha-beta model (``commcost.collective_seconds``, ``commcost.exposed_after_backward``).

A planner is a model, not an oracle: its ranking depends on the efficiency and overlap it assumes. Test its
terms, not its optimum. Ranks are placed tp innermost, then cp, then dp (with ep inside dp x cp), then pp: a
group whose ranks span at most ``gpus_per_node`` GPUs talks over the intra-node link, else over the network.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, field, replace
from typing import Any

from . import commcost, estimate, hardware, pipeline, roofline

RECOMPUTE = ("none", "selective", "full")
LLAMA3_SOURCE = ("Meta, config.json of meta-llama/Meta-Llama-3-8B, Meta-Llama-3-70B and Llama-3.1-405B (Hugging "
                 "Face); layouts: Dubey et al. 2024, The Llama 3 Herd of Models, Table 4")


@dataclass(frozen=True)
class ModelConfig:
    """A Llama-style decoder: ``layers`` blocks of grouped-query attention and a SwiGLU MLP, RMSNorms, separate
    input embedding and output head (``experts`` > 1: each MLP is ``experts`` experts, ``top_k`` used per token),
    trained on ``global_batch`` sequences of ``seq`` tokens a step."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq: int
    global_batch: int
    experts: int = 1
    top_k: int = 1

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def layer_parameters(self) -> int:
        """Parameters of one block: q and o (hidden x hidden), k and v (hidden x kv_heads·head_dim), the MLP's
        gate, up and down (3 x hidden x ffn, per expert, plus the router), two RMSNorm weights."""
        attention = 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_heads * self.head_dim
        mlp = 3 * self.hidden * self.ffn * self.experts + (self.hidden * self.experts if self.experts > 1 else 0)
        return attention + mlp + 2 * self.hidden

    def parameters(self) -> int:
        """All parameters: the blocks, the embedding and the output head (vocab x hidden each), the final norm."""
        return self.layers * self.layer_parameters() + 2 * self.vocab * self.hidden + self.hidden

    def matmul_parameters(self) -> int:
        """Parameters a token multiplies by (6 FLOPs each in training): the blocks' matrices with only ``top_k``
        experts, and the output head; the embedding is a lookup, the norms are element-wise."""
        attention = 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_heads * self.head_dim
        mlp = 3 * self.hidden * self.ffn * self.top_k
        return self.layers * (attention + mlp) + self.vocab * self.hidden


def _llama(name: str, layers: int, hidden: int, heads: int, ffn: int, seq: int, batch: int) -> ModelConfig:
    return ModelConfig(name, layers, hidden, heads, 8, ffn, 128256, seq, batch)


# Llama 3 trained with 16M-token batches at 8,192 tokens (Table 4); the two smaller models use the same here
PRESETS = {
    "Llama 3 8B": _llama("Llama 3 8B", 32, 4096, 32, 14336, 8192, 2048),
    "Llama 3 70B": _llama("Llama 3 70B", 80, 8192, 64, 28672, 8192, 2048),
    "Llama 3 405B": _llama("Llama 3 405B", 126, 16384, 128, 53248, 8192, 2048),
}
# Table 4 of the Llama 3 paper: the 405B layouts on H100s, and the BF16 MFU each reached
PUBLISHED: dict[str, dict[str, Any]] = {
    "8K on 8,192 GPUs": dict(tp=8, cp=1, pp=16, dp=64, seq=8192, mfu=0.43),
    "8K on 16,384 GPUs": dict(tp=8, cp=1, pp=16, dp=128, seq=8192, mfu=0.41),
    "128K on 16,384 GPUs": dict(tp=8, cp=16, pp=16, dp=8, seq=131072, mfu=0.38),
}


@dataclass(frozen=True)
class Cluster:
    """``gpus`` GPUs of model ``gpu`` (a row of ``hardware.SPECS``), ``gpus_per_node`` to a node. Links, per
    direction: ``intra`` inside a node (default: the GPU's NVLink from the table), ``inter`` between nodes (an
    assumption: 50 GB/s, one 400 Gb/s network card per GPU); ``alpha_*`` are latencies per ring step (assumed).
    ``efficiency``: the share of the bfloat16 peak the matrix products reach (Llama 3 reached 38-43%);
    ``usable``: the share of memory training may fill (the rest: CUDA context, buffers, fragmentation)."""

    gpu: str
    gpus: int
    gpus_per_node: int = 8
    intra: float = 0.0
    inter: float = 50e9
    alpha_intra: float = 5e-6
    alpha_inter: float = 10e-6
    efficiency: float = 0.4
    usable: float = 0.9
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        if self.gpu not in hardware.SPECS:
            raise ValueError(f"GPU {self.gpu!r} is not in the course's hardware table (d2l_ext.hardware.SPECS): "
                             f"it knows {', '.join(hardware.SPECS)}")
        if self.intra == 0.0:
            link = hardware.gpu_spec(self.gpu).link
            object.__setattr__(self, "intra", link if link else self.inter)

    @property
    def memory_bytes(self) -> float:
        return hardware.gpu_spec(self.gpu).memory_gib * 1e9 * self.usable

    def link(self, ranks_spanned: int) -> tuple[float, float]:
        """(alpha, beta) of a group whose ranks span ``ranks_spanned`` consecutive GPUs."""
        if ranks_spanned <= self.gpus_per_node:
            return self.alpha_intra, self.intra
        return self.alpha_inter, self.inter


@dataclass(frozen=True)
class Layout:
    """Degrees of data (dp), tensor (tp), pipeline (pp), context (cp) and expert (ep) parallelism, the ZeRO stage,
    the recomputation ("none", "selective": attention's scores, "full": whole layers), sequences per
    micro-batch, and whether tensor parallelism shards the norms by sequence (``sp``)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    zero: int = 1
    recompute: str = "none"
    micro_batch: int = 1
    sp: bool = True

    def short(self) -> str:
        return (f"dp{self.dp} tp{self.tp} pp{self.pp} cp{self.cp} ep{self.ep} z{self.zero} "
                f"{self.recompute[:4]} mb{self.micro_batch}")


@dataclass(frozen=True)
class Plan:
    """One layout's terms: ``memory`` and ``time`` map each term's name to bytes per GPU and seconds per step."""

    layout: Layout
    memory: dict[str, float] = field(default_factory=dict)
    time: dict[str, float] = field(default_factory=dict)

    @property
    def memory_bytes(self) -> float:
        return sum(self.memory.values())

    @property
    def step_seconds(self) -> float:
        return sum(self.time.values())

    def explain(self) -> str:
        """Every term, one a line: memory in GB, time in seconds."""
        lines = [f"{self.layout.short()}: {self.memory_bytes / 1e9:.1f} GB, {self.step_seconds:.2f} s a step"]
        lines += [f"  memory {k:<22} {v / 1e9:8.2f} GB" for k, v in self.memory.items()]
        lines += [f"  time   {k:<22} {v:8.3f} s" for k, v in self.time.items()]
        return "\n".join(lines)


def layer_activation_bytes(model: ModelConfig, micro_batch: int, recompute: str = "none", tp: int = 1,
                           cp: int = 1, sp: bool = True, dtype_bytes: int = 2, gathered: int = 0) -> float:
    """Bytes one rank's autograd saves for one block and one micro-batch (the course's block, counted as chapter
    8's ``estimate.saved_bytes`` counts it: see the tests). Per token, with h = hidden, f = ffn:

    - 10h + 2 numbers for the norms, their outputs, q, k, v (k and v repeated to every head), attention's output,
      the residual; 4f for the MLP (gate, its SiLU, up, their product). Tensor parallelism splits q, k, v,
      attention's output and the MLP by tp; sequence parallelism (``sp``) splits the norms' 6h + 2 too, as
      Megatron-LM does (it saves the norms' outputs split and gathers them again for the backward pass).
      ``gathered``: how many layers save their all-gathered input whole instead (PyTorch's ColwiseParallel
      after SequenceParallel: one copy per layer, 5 in the course's block);
    - "none" adds the softmax's output, heads x seq numbers a token, split by tp, and the causal mask (seq x seq
      booleans); "selective" recomputes them from q and k; "full" keeps only each block's input (h).
    Context parallelism splits the tokens by cp: a rank's queries meet all seq keys."""
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, not {recompute!r}")
    h, f, e = model.hidden, model.ffn * model.top_k, dtype_bytes
    tokens = micro_batch * model.seq // cp
    if not sp or tp == 1:
        norms = 6 * h + 2
    else:
        norms = (4 * h + 2) / tp + (gathered * h if gathered else 2 * h / tp)
    if recompute == "full":
        return e * tokens * h / (tp if sp else 1)
    saved = e * tokens * (norms + (4 * h + 4 * f) / tp)
    if recompute == "none":
        saved += e * tokens * model.heads // tp * model.seq + model.seq // cp * model.seq
    return saved


def attention_flops(model: ModelConfig, tokens: float) -> float:
    """Training FLOPs of attention's two products (scores and weighted values): 3 x 4·layers·seq·hidden a
    token, counted without the causal half, as ``FlopCounterMode`` counts the course's block."""
    return 3 * 4 * model.layers * model.seq * model.hidden * tokens


def recompute_flops(model: ModelConfig, tokens: float, recompute: str) -> float:
    """FLOPs recomputation adds, as ``torch.utils.checkpoint`` (non-reentrant) does them: it stops once the
    saved tensors are rebuilt, so the last product is never redone. "selective": the scores q·kᵀ only,
    2·layers·seq·hidden a token; "full": each block's forward but its down projection."""
    if recompute == "none":
        return 0.0
    scores = 2 * model.layers * model.seq * model.hidden * tokens
    if recompute == "selective":
        return scores
    blocks = model.matmul_parameters() - model.vocab * model.hidden
    down = model.layers * model.hidden * model.ffn * model.top_k
    return 2 * scores + 2 * (blocks - down) * tokens


def ring_attention_bytes(model: ModelConfig, micro_batch: int, cp: int, dtype_bytes: int = 2) -> int:
    """Bytes a rank sends in one layer's forward under ring attention: cp - 1 steps, each passing on its
    chunk's keys and values, (cp - 1)·2·B·(S/cp)·D_kv·bytes with D_kv = kv_heads·head_dim."""
    d_kv = model.kv_heads * model.head_dim
    return (cp - 1) * 2 * micro_batch * (model.seq // cp) * d_kv * dtype_bytes


def expert_all_to_all_bytes(model: ModelConfig, micro_batch: int, cp: int = 1, dtype_bytes: int = 2) -> int:
    """Bytes of one all-to-all of a layer's routed tokens (dispatch, or combine): each of a rank's tokens
    goes to ``top_k`` experts with its hidden vector."""
    return micro_batch * (model.seq // cp) * model.top_k * model.hidden * dtype_bytes


SIMULATED_OPS = 4096  # above pp x m operations, the closed form the tests check against the simulator


@functools.lru_cache(maxsize=4096)
def one_f_one_b(pp: int, m: int) -> tuple[int, int]:
    """(makespan in ticks, micro-batches in flight on the first stage) of 1F1B with a backward twice a forward:
    chapter 9's simulator for up to SIMULATED_OPS operations, else its closed form 3(m + pp - 1), min(pp, m)."""
    if pp * m <= SIMULATED_OPS:
        timeline = pipeline.simulate(pipeline.schedule("1f1b", pp, m), t_f=1, t_b=2)
        return timeline.makespan, timeline.in_flight(0)
    return 3 * (m + pp - 1), min(pp, m)


def stage_layers(model: ModelConfig, pp: int) -> tuple[int, bool]:
    """Blocks on the fullest stage, and whether that stage also holds the embedding (or the head). pp must
    divide the layers, or the layers + 2 (Llama 3's balance: the first and last stages hold one block fewer,
    for the embedding and the output head)."""
    if model.layers % pp == 0:
        return model.layers // pp, True
    if (model.layers + 2) % pp == 0:
        return (model.layers + 2) // pp, pp == 1
    raise ValueError(f"pp={pp} divides neither the {model.layers} layers nor layers + 2")


def check(model: ModelConfig, cluster: Cluster, layout: Layout) -> int:
    """Raise ValueError naming the problem if ``layout`` cannot split ``model`` on ``cluster``; return the
    micro-batches each pipeline runs a step."""
    lay = layout
    product = lay.dp * lay.tp * lay.pp * lay.cp
    if product != cluster.gpus:
        raise ValueError(f"dp x tp x pp x cp = {lay.dp} x {lay.tp} x {lay.pp} x {lay.cp} = {product}, "
                         f"not the {cluster.gpus} GPUs")
    if model.heads % lay.tp or model.kv_heads % lay.tp and lay.tp % model.kv_heads:
        raise ValueError(f"tp={lay.tp} does not divide the {model.heads} heads ({model.kv_heads} KV heads)")
    stage_layers(model, lay.pp)
    if model.seq % (2 * lay.cp) and lay.cp > 1:
        raise ValueError(f"cp={lay.cp}: 2 x cp chunks (zig-zag) do not divide the sequence of {model.seq}")
    if model.experts % lay.ep or (lay.dp * lay.cp) % lay.ep:
        raise ValueError(f"ep={lay.ep} does not divide the {model.experts} experts and dp x cp")
    if lay.zero not in (0, 1, 2, 3) or lay.recompute not in RECOMPUTE:
        raise ValueError(f"zero must be 0-3 and recompute one of {RECOMPUTE}")
    if model.global_batch % (lay.dp * lay.micro_batch):
        raise ValueError(f"dp x micro_batch = {lay.dp * lay.micro_batch} does not divide the global batch of "
                         f"{model.global_batch} sequences")
    return model.global_batch // (lay.dp * lay.micro_batch)


def gathered_parameters(model: ModelConfig, layout: Layout) -> tuple[float, float]:
    """Parameters a GPU also holds whole under ZeRO-3 (FSDP2) over more than one rank, split by tensor parallelism:
    (one block's, the root unit's: embedding, final norm and head); (0, 0) without ZeRO-3. At its most a GPU holds
    three copies of a block: its weights, the all-gather's buffer, which FSDP2 keeps until the next all-gather in the
    forward ("defer free to allow for overlap of this copy-out with next all-gather", torch's _fsdp_param_group),
    or the next block's weights prefetched in the backward, and its gradients until they are reduce-scattered. The
    root is not resharded after the forward (torch's _fsdp_state): its weights and gradients stay whole. Chapter
    15's check measures the block's three copies with MemTracker (a model without embedding)."""
    if layout.zero < 3 or layout.dp * layout.cp == 1:
        return 0.0, 0.0
    expert = 3 * model.hidden * model.ffn if model.experts > 1 else 0
    block = model.layer_parameters() - expert * model.experts + expert * model.experts // layout.ep
    root = 2 * model.vocab * model.hidden + model.hidden if model.vocab else 0
    return block / layout.tp, root / layout.tp


def memory_terms(model: ModelConfig, layout: Layout, m: int) -> dict[str, float]:
    """Bytes per GPU on the fullest pipeline stage: parameters, gradients, optimizer state (ZeRO over dp x cp
    ranks, chapter 8's count), the activations of one micro-batch and of the others in flight, and under ZeRO-3
    the copies of a block and of the root held whole (``gathered_parameters``, 2 bytes a number)."""
    lay = layout
    blocks, embedding = stage_layers(model, lay.pp)
    expert = 3 * model.hidden * model.ffn if model.experts > 1 else 0
    dense = model.layer_parameters() - expert * model.experts
    if lay.pp == 1:  # every block, the embedding, the head and the final norm
        whole = model.parameters() - model.layers * expert * model.experts * (lay.ep - 1) // lay.ep
    else:
        whole = blocks * (dense + expert * model.experts // lay.ep) + (
            model.vocab * model.hidden if embedding else 0)
    held = whole // lay.tp if whole % lay.tp == 0 else whole / lay.tp
    shards = lay.dp * lay.cp
    state = estimate.zero_bytes_per_gpu(held, shards, lay.zero)
    weights = 2 * held / (shards if lay.zero == 3 else 1)
    grads = 2 * held / (shards if lay.zero >= 2 else 1)
    one = blocks * layer_activation_bytes(model, lay.micro_batch, lay.recompute, lay.tp, lay.cp, lay.sp)
    in_flight = one_f_one_b(lay.pp, m)[1]
    block, root = gathered_parameters(model, lay)
    return {"parameters": weights, "gradients": grads, "optimizer state": state - weights - grads,
            "activations": one, "in-flight micro-batches": one * (in_flight - 1),
            "gathered (ZeRO-3)": 2 * (3 * block + 2 * root)}


def time_terms(model: ModelConfig, cluster: Cluster, layout: Layout, m: int) -> dict[str, float]:
    """Seconds of one step per GPU: compute, recomputation, the bubble, and the communication not hidden."""
    lay, c = layout, cluster
    tokens = model.global_batch * model.seq
    peak = roofline.peak_flops(c.gpu, c.dtype) * c.efficiency
    compute = (roofline.training_seconds(model.matmul_parameters(), tokens, c.gpus, c.gpu, c.dtype, c.efficiency)
               + attention_flops(model, tokens) / (c.gpus * peak))
    redo = recompute_flops(model, tokens, lay.recompute) / (c.gpus * peak)
    bubble = (compute + redo) * (one_f_one_b(lay.pp, m)[0] / (3 * m) - 1)
    blocks = stage_layers(model, lay.pp)[0]
    act = 2 * lay.micro_batch * model.seq // lay.cp * model.hidden  # one micro-batch's (tokens, hidden)
    alpha, beta = c.link(lay.tp)
    # Megatron with sequence parallelism: 2 all-gathers and 2 reduce-scatters forward, as many backward
    tp = 0.0 if lay.tp == 1 else 4 * sum(commcost.collective_seconds(op, lay.tp, act, alpha, beta)
                                         for op in ("all_gather", "reduce_scatter"))
    alpha, beta = c.link(lay.tp * lay.cp)
    sent = ring_attention_bytes(model, lay.micro_batch, lay.cp) / lay.tp  # a rank's KV heads
    ring = 3 * ((lay.cp - 1) * alpha + sent / beta)  # K and V forward; K, V and their grads backward
    attention_one = attention_flops(model, lay.micro_batch * model.seq) / model.layers / (
        lay.tp * lay.cp * peak)
    cp = max(0.0, ring - attention_one)  # the ring hides behind attention's own products
    alpha, beta = c.link(lay.tp * lay.cp * lay.dp)
    routed = expert_all_to_all_bytes(model, lay.micro_batch, lay.cp) / lay.tp
    ep = 0.0 if lay.ep == 1 else 4 * commcost.collective_seconds("all_to_all", lay.ep, routed, alpha, beta)
    per_layer = (compute + redo) / (m * blocks) * 2 / 3  # one layer's backward of the last micro-batch
    grads = 2 * (model.layer_parameters() / lay.tp)
    shards = lay.dp * lay.cp
    op = "all_reduce" if lay.zero < 2 else "reduce_scatter"
    reduce = 0.0 if shards == 1 else commcost.collective_seconds(op, shards, grads, alpha, beta)
    dp = 0.0 if shards == 1 else commcost.exposed_after_backward([per_layer] * blocks, [1] * blocks,
                                                                 [reduce] * blocks)
    if lay.zero == 3 and shards > 1:  # gathered again for each micro-batch, forward and backward
        gather = commcost.collective_seconds("all_gather", shards, grads, alpha, beta)
        dp += 2 * m * blocks * max(0.0, gather - per_layer)
    alpha, beta = c.link(lay.tp * lay.cp * lay.dp * lay.pp)
    hop = 0.0 if lay.pp == 1 else 2 * m * (alpha + act / lay.tp / beta)  # sent on, and its gradient back
    return {"compute": compute, "recomputation": redo, "pipeline bubble": bubble, "pipeline comm": hop,
            "tensor-parallel comm": m * blocks * tp, "context-parallel comm": m * blocks * cp,
            "expert-parallel comm": m * blocks * ep, "data-parallel comm": dp}


def evaluate(model: ModelConfig, cluster: Cluster, layout: Layout) -> Plan:
    """The memory and time terms of ``layout``; ValueError if it cannot split ``model`` on ``cluster``."""
    m = check(model, cluster, layout)
    return Plan(layout, memory_terms(model, layout, m), time_terms(model, cluster, layout, m))


def _divisors(n: int, up_to: int | None = None) -> list[int]:
    return [d for d in range(1, min(n, up_to or n) + 1) if n % d == 0]


def layouts(model: ModelConfig, cluster: Cluster, micro_batches: tuple[int, ...] = (1, 2, 4),
            largest: int = 32) -> list[Layout]:
    """Every layout that splits ``model`` on ``cluster``: tp within a node, pp and cp at most ``largest``, ZeRO-2
    and 3 only without a pipeline (their gradients would be reduced once per micro-batch)."""
    found = []
    for tp, cp, pp in itertools.product(_divisors(cluster.gpus, cluster.gpus_per_node),
                                        _divisors(cluster.gpus, largest), _divisors(cluster.gpus, largest)):
        if cluster.gpus % (tp * cp * pp):
            continue
        dp = cluster.gpus // (tp * cp * pp)
        for ep, zero, recompute, mb in itertools.product(_divisors(model.experts), range(4), RECOMPUTE,
                                                         micro_batches):
            layout = Layout(dp, tp, pp, cp, ep, zero, recompute, mb)
            if zero >= 2 and pp > 1:
                continue
            try:
                check(model, cluster, layout)
            except ValueError:
                continue
            found.append(layout)
    return found


def plan(model: ModelConfig, cluster: Cluster, top: int = 10, **fixed: int | str) -> list[Plan]:
    """The ``top`` fastest layouts that fit in memory, fastest first; ``fixed`` pins degrees (e.g. tp=8).
    ValueError if none fits, naming the smallest memory found and what would have to change."""
    plans = [evaluate(model, cluster, layout) for layout in layouts(model, cluster)
             if all(getattr(layout, k) == v for k, v in fixed.items())]
    if not plans:
        raise ValueError(f"no layout splits {model.name} on {cluster.gpus} GPUs with {fixed}")
    fitting = [p for p in plans if p.memory_bytes <= cluster.memory_bytes]
    if not fitting:
        least = min(plans, key=lambda p: p.memory_bytes)
        raise ValueError(
            f"no layout fits: the smallest needs {least.memory_bytes / 1e9:.1f} GB per GPU "
            f"({least.layout.short()}), above {cluster.memory_bytes / 1e9:.1f} GB; use more GPUs, a GPU with "
            f"more memory, a shorter sequence or a smaller batch")
    return sorted(fitting, key=lambda p: (p.step_seconds, p.memory_bytes))[:top]


def rank_of(model: ModelConfig, cluster: Cluster, layout: Layout) -> tuple[int, int]:
    """Where ``layout`` ranks among the fitting layouts (1 = fastest) with the same micro-batch and recompute
    choices enumerated, and how many fit."""
    target = evaluate(model, cluster, layout).step_seconds
    fitting = [p.step_seconds for p in (evaluate(model, cluster, lay) for lay in layouts(model, cluster))
               if p.memory_bytes <= cluster.memory_bytes]
    return 1 + sum(t < target for t in fitting), len(fitting)


def table(plans: list[Plan]) -> str:
    """One line per plan: the layout, GB per GPU and each time term."""
    head = f"{'layout':<36} {'GB':>6} {'step s':>7} {'comp':>6} {'bubble':>6} {'tp':>5} {'cp':>5} {'dp':>5}"
    rows = [f"{p.layout.short():<36} {p.memory_bytes / 1e9:6.1f} {p.step_seconds:7.2f} "
            f"{p.time['compute'] + p.time['recomputation']:6.2f} {p.time['pipeline bubble']:6.2f} "
            f"{p.time['tensor-parallel comm']:5.2f} {p.time['context-parallel comm']:5.2f} "
            f"{p.time['data-parallel comm']:5.2f}" for p in plans]
    return "\n".join([head, *rows])


def with_seq(model: ModelConfig, seq: int) -> ModelConfig:
    """``model`` trained at ``seq`` tokens with the same tokens a step."""
    return replace(model, seq=seq, global_batch=max(1, model.global_batch * model.seq // seq))
