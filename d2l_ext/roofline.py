"""How fast can a step be? Peak compute, memory bandwidth, and the FLOPs a model does (chapter 10).

A device does at most ``peak`` floating-point operations per second (FLOP/s) and moves at most ``bandwidth``
bytes per second between its memory and its cores. An operation that does ``flops`` operations on ``bytes`` bytes
takes at least ``max(flops / peak, bytes / bandwidth)``: the *roofline*. Its *arithmetic intensity* is
``flops / bytes``; the *ridge point* ``peak / bandwidth`` divides operations that wait for memory
(memory-bound, intensity below the ridge) from those that wait for arithmetic (compute-bound, above it).

- ``GPUS``: the spec sheets of four GPUs (dense peaks, no sparsity), each figure with its source;
  ``peak_flops``, ``bandwidth`` and ``ridge_point`` read them;
- ``linear_flops``, ``mlp_step_flops``, ``conv2d_flops`` and ``transformer_block_flops``: the FLOPs of a training
  step in closed form, counted as ``torch.utils.flop_counter.FlopCounterMode`` counts them (matrix products and
  convolutions, 2 FLOPs per multiply-add; element-wise work is not counted);
- ``attainable``, ``roofline_seconds`` and ``bound``: an operation on the roofline;
- ``model_flops_utilization``: the share of the peak that a step's model FLOPs reach (MFU).

Every helper raises ``ValueError`` for a size that is not positive, and for a GPU or dtype the table does not
know (naming the ones it knows).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

# The spec table lives in d2l_ext.hardware, the one source of every hardware figure the course quotes: GPUS are
# the four rows chapter 10 prints, gpu_spec reads any row of hardware.SPECS.
from .hardware import GPUS as GPUS
from .hardware import GPUSpec as GPUSpec
from .hardware import gpu_spec as gpu_spec

DTYPE_BYTES = {"float32": 4, "tf32": 4, "float16": 2, "bfloat16": 2}



def _positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name} must be positive, got {value!r}")


def peak_flops(gpu: str, dtype: str) -> float:
    """Dense peak FLOP/s of ``gpu`` for ``dtype`` ('float32', 'tf32', 'float16' or 'bfloat16')."""
    spec = gpu_spec(gpu)
    if dtype not in spec.peak:
        raise ValueError(f"the table has no {dtype!r} peak for the {gpu}: it knows {', '.join(spec.peak)}")
    return spec.peak[dtype]


def ridge_point(gpu: str, dtype: str) -> float:
    """The arithmetic intensity (FLOP/byte) above which an operation on ``gpu`` in ``dtype`` is compute-bound."""
    return peak_flops(gpu, dtype) / gpu_spec(gpu).bandwidth


def attainable(intensity: float, peak: float, bandwidth: float) -> float:
    """The roofline: the FLOP/s an operation of ``intensity`` FLOP/byte can reach, ``min(peak, intensity x bw)``."""
    _positive(intensity=intensity, peak=peak, bandwidth=bandwidth)
    return min(peak, intensity * bandwidth)


def roofline_seconds(flops: float, nbytes: float, peak: float, bandwidth: float) -> float:
    """The least time an operation of ``flops`` FLOPs on ``nbytes`` bytes can take: the slower of its two limits."""
    _positive(flops=flops, nbytes=nbytes, peak=peak, bandwidth=bandwidth)
    return max(flops / peak, nbytes / bandwidth)


def bound(intensity: float, ridge: float) -> str:
    """'memory-bound' below the ridge point, 'compute-bound' at or above it."""
    _positive(intensity=intensity, ridge=ridge)
    return "compute-bound" if intensity >= ridge else "memory-bound"


def matmul_bytes(m: int, k: int, n: int, dtype_bytes: int = 4) -> int:
    """Bytes an (m, k) @ (k, n) product must move at least: read both inputs, write the output once."""
    _positive(m=m, k=k, n=n, dtype_bytes=dtype_bytes)
    return (m * k + k * n + m * n) * dtype_bytes


def linear_flops(batch: int, fan_in: int, fan_out: int, input_grad: bool = True) -> dict[str, int]:
    """FLOPs of ``nn.Linear(fan_in, fan_out)`` on ``batch`` rows: forward, backward and their sum.

    Forward: one (batch, fan_in) @ (fan_in, fan_out) product, 2 x batch x fan_in x fan_out (the bias adds are not
    counted). Backward: the weight's gradient costs the same again, and the input's gradient the same again only
    when it is needed (``input_grad``): the first layer of a model, whose input is the data, skips it.
    """
    _positive(batch=batch, fan_in=fan_in, fan_out=fan_out)
    product = 2 * batch * fan_in * fan_out
    backward = product * (2 if input_grad else 1)
    return {"forward": product, "backward": backward, "total": product + backward}


def mlp_step_flops(batch: int, sizes: list[int]) -> dict[str, int]:
    """FLOPs of one training step of an MLP of ``nn.Linear`` layers of ``sizes`` (e.g. [1024, 4096, 1024]),
    its first layer fed by data (no input gradient). The forward pass is 2 x batch x P_weights; the step is
    3 times that less the first layer's input gradient, where "6 x P x batch" counts it."""
    if len(sizes) < 2:
        raise ValueError(f"an MLP needs at least two sizes (input and output), got {sizes!r}")
    rows = [linear_flops(batch, a, b, input_grad=i > 0) for i, (a, b) in enumerate(zip(sizes, sizes[1:], strict=False))]
    return {key: sum(row[key] for row in rows) for key in ("forward", "backward", "total")}


def conv2d_flops(batch: int, in_channels: int, out_channels: int, kernel: int, out_height: int, out_width: int,
                 input_grad: bool = True) -> dict[str, int]:
    """FLOPs of ``nn.Conv2d(in_channels, out_channels, kernel)`` whose output is out_height x out_width: each
    output value is a dot product of in_channels x kernel x kernel pairs; the backward pass costs as much for the
    weight's gradient and, when needed, as much again for the input's."""
    _positive(batch=batch, in_channels=in_channels, out_channels=out_channels, kernel=kernel,
              out_height=out_height, out_width=out_width)
    forward = 2 * batch * out_channels * out_height * out_width * in_channels * kernel * kernel
    backward = forward * (2 if input_grad else 1)
    return {"forward": forward, "backward": backward, "total": forward + backward}


def transformer_block_flops(batch: int, seq: int, hidden: int, mlp_ratio: int = 4) -> dict[str, int]:
    """FLOPs of one pre-LayerNorm transformer block: q, k, v and output projections (4 hidden x hidden),
    attention's two products (q k^T, and the weights times v: 2 x batch x seq^2 x hidden each, whatever the number
    of heads), and an MLP hidden -> mlp_ratio x hidden -> hidden. Forward: 24·b·s·h² + 4·b·s²·h
    with the usual ratio 4. Backward: twice the forward. Every product computes its input's gradient, even in a
    first block: the LayerNorm before q, k and v has a weight, whose gradient needs it."""
    _positive(batch=batch, seq=seq, hidden=hidden, mlp_ratio=mlp_ratio)
    tokens = batch * seq
    projections = 4 * 2 * tokens * hidden * hidden
    attention = 2 * 2 * batch * seq * seq * hidden
    mlp = 2 * 2 * tokens * hidden * mlp_ratio * hidden
    forward = projections + attention + mlp
    return {"forward": forward, "backward": 2 * forward, "total": 3 * forward}


def model_flops_utilization(flops_per_step: float, step_seconds: float, peak: float) -> float:
    """MFU: the model's FLOPs per step over what the peak could do in the step's time (a share, 0 to 1).

    Counted with the FLOPs the model needs (recomputed activations not included); with them, the same formula
    gives the hardware FLOPs utilization (HFU)."""
    _positive(flops_per_step=flops_per_step, step_seconds=step_seconds, peak=peak)
    return flops_per_step / step_seconds / peak


# ---------------------------------------------------------------------------------------------- worked problems
# Each answer of chapter 10's problems is computed here from the table above, so that an error in a figure or a
# formula shows in a test. The assumptions are in each docstring; the chapter states them beside the answer.


def compute_bound_batch(gpu: str, dtype: str, d_in: int, d_out: int) -> int | None:
    """The smallest batch B at which (B, d_in) @ (d_in, d_out) in ``dtype`` reaches ``gpu``'s ridge point.

    Its intensity is 2·B·d_in·d_out / (s·(B·d_in + d_in·d_out + B·d_out)) with s bytes per number. It grows with
    B towards 2·d_in·d_out / (s·(d_in + d_out)); if even that stays under the ridge, no batch will do: None.
    """
    _positive(d_in=d_in, d_out=d_out)
    ridge, s = ridge_point(gpu, dtype), DTYPE_BYTES[dtype]
    denominator = 2 * d_in * d_out - ridge * s * (d_in + d_out)
    if denominator <= 0:
        return None
    return math.ceil(ridge * s * d_in * d_out / denominator)


def dp_hiding_tokens(gpu: str, dtype: str, link_bandwidth: float, gpus: int, mfu: float = 1.0) -> float:
    """Tokens per GPU per step above which data parallelism hides its gradient all-reduce behind the backward.

    The backward pass does 4·P FLOPs per token (twice the forward's 2·P) at ``mfu`` of the peak; the ring
    all-reduce sends 2(n - 1)/n of the gradients (P numbers of ``dtype``) over ``link_bandwidth`` bytes/s. The
    model's size cancels: tokens >= (n - 1)/n · s/2 · peak · mfu / link_bandwidth (s bytes per number).
    """
    _positive(link_bandwidth=link_bandwidth, mfu=mfu)
    if gpus < 2:
        raise ValueError(f"data parallelism needs at least 2 GPUs, got {gpus}")
    s = DTYPE_BYTES[dtype]
    return (gpus - 1) / gpus * s / 2 * peak_flops(gpu, dtype) * mfu / link_bandwidth


def tp_comm_bound_degree(gpu: str, dtype: str, link_bandwidth: float, ffn: int) -> float:
    """The tensor-parallel degree t above which a Megatron MLP (hidden -> ffn -> hidden, split over t GPUs) waits
    longer for its all-reduce than it computes.

    Per token the two products cost 4·hidden·ffn/t FLOPs on each GPU; the all-reduce of the output sends
    2(t - 1)/t·hidden·s bytes. Communication is longer when t - 1 > 2·ffn / (s · peak / link_bandwidth): the
    batch and the hidden size cancel. Returns that t (communication-bound above it).
    """
    _positive(link_bandwidth=link_bandwidth, ffn=ffn)
    s = DTYPE_BYTES[dtype]
    return 1 + 2 * ffn / (s * peak_flops(gpu, dtype) / link_bandwidth)


def training_seconds(params: float, tokens: float, gpus: int, gpu: str, dtype: str, mfu: float) -> float:
    """Time to train ``params`` parameters on ``tokens`` tokens with ``gpus`` GPUs at ``mfu``: 6·P·tokens FLOPs
    (2 forward, 4 backward per parameter and token) over gpus · peak · mfu."""
    _positive(params=params, tokens=tokens, gpus=gpus, mfu=mfu)
    return 6 * params * tokens / (gpus * peak_flops(gpu, dtype) * mfu)


def kv_cache_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype: str) -> int:
    """Bytes of KV cache one token of context keeps: a key and a value of ``kv_heads`` x ``head_dim`` numbers of
    ``dtype`` in each of ``layers`` layers, 2·layers·kv_heads·head_dim·s (Llama 3 70B in bfloat16: 320 KiB)."""
    _positive(layers=layers, kv_heads=kv_heads, head_dim=head_dim)
    return 2 * layers * kv_heads * head_dim * DTYPE_BYTES[dtype]


def decode_tokens_per_second(params: float, dtype: str, gpu: str, batch: int = 1, context: int = 0,
                             kv_bytes_per_token: float = 0) -> float:
    """The most tokens per second one GPU can generate in all for ``batch`` sequences of ``context`` tokens each.

    Each step makes one token per sequence. It reads every weight once (P numbers of ``dtype``) and each sequence's
    KV cache (``context`` x ``kv_bytes_per_token``), and does 2·P FLOPs per token: it takes the longer of its bytes
    over the bandwidth and its FLOPs over the peak (the activations are left out). With one sequence and no cache,
    the intensity is 2/s FLOP/byte, far under any ridge: the bandwidth sets the pace."""
    _positive(params=params, batch=batch)
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}: the table knows {', '.join(DTYPE_BYTES)}")
    if context < 0 or kv_bytes_per_token < 0:
        raise ValueError(f"context and KV bytes must be at least 0, got {context!r} and {kv_bytes_per_token!r}")
    nbytes = params * DTYPE_BYTES[dtype] + batch * context * kv_bytes_per_token
    step = max(nbytes / gpu_spec(gpu).bandwidth, 2 * params * batch / peak_flops(gpu, dtype))
    return batch / step


# ------------------------------------------------------------------------------------------- this machine's


# This machine's ridge point, FLOP/B, under each setting CI runs the notebooks with, and with one core busy
# (d2l_ext/cpu_ridges.json, written by `make measure-ridges MEASURE_RIDGES_ARGS=--record`). Chapter 10 compares
# each operation with all of them, so that its labels hold under every setting.
CPU_RIDGES_FILE = Path(__file__).resolve().parent / "cpu_ridges.json"
CPU_RIDGES: dict[str, float] = json.loads(CPU_RIDGES_FILE.read_text(encoding="utf-8"))["ridges"]


def side_of_every(intensity: float, ridges: Iterable[float]) -> str:
    """Return on which side of all ``ridges`` ``intensity`` lies: memory-bound below every one of them,
    compute-bound above every one, "either side" between the lowest and the highest."""
    ridges = list(ridges)
    if not ridges:
        raise ValueError("no ridge given")
    _positive(intensity=intensity, **{f"ridge {i}": ridge for i, ridge in enumerate(ridges)})
    if intensity < min(ridges):
        return "memory-bound"
    return "compute-bound" if intensity > max(ridges) else "either side"


@dataclass(frozen=True)
class Operation:
    """One operation of the course, its FLOPs and the least bytes it moves (float32), and a function running it."""

    name: str
    flops: int
    nbytes: int
    run: Callable[[], object]

    @property
    def intensity(self) -> float:
        return self.flops / self.nbytes


def course_operations(device: torch.device | str = "cpu") -> list[Operation]:
    """The operations chapter 10 places on the roofline, with inputs made on ``device``.

    Element-wise and row-wise operations read their input and write their output once: an add of two tensors
    does 1 FLOP per element for 12 bytes; softmax about 5 (max, subtract, exp, sum, divide) and LayerNorm about 8
    (mean, variance, normalize, scale and shift) per element for 8 bytes. A product of n x n matrices does
    2n³ FLOPs on 3n² numbers; a convolution as conv2d_flops counts, on its input, output and weights; the MLP step
    as mlp_step_flops counts, on each weight read twice and its gradient written once, each activation written
    and read once.
    """
    device = torch.device(device)
    g = torch.Generator(device="cpu").manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(device)

    operations = []
    n = 1 << 22
    a, b = randn(n), randn(n)
    operations.append(Operation("add", n, 12 * n, lambda: a + b))
    rows = randn(4096, 1024)
    layer_norm = torch.nn.LayerNorm(1024).to(device)
    operations.append(Operation("softmax", 5 * rows.numel(), 8 * rows.numel(), lambda: rows.softmax(-1)))
    operations.append(Operation("LayerNorm", 8 * rows.numel(), 8 * rows.numel(), lambda: layer_norm(rows)))
    for size in (64, 256, 1024, 2048):
        x, y = randn(size, size), randn(size, size)
        operations.append(Operation(f"matmul {size}", 2 * size**3, matmul_bytes(size, size, size),
                                    lambda x=x, y=y: x @ y))
    conv = torch.nn.Conv2d(64, 64, 3, padding=1).to(device)
    image = randn(8, 64, 32, 32)
    conv_bytes = 4 * (2 * image.numel() + conv.weight.numel())
    operations.append(Operation("conv 3x3, 64 channels", conv2d_flops(8, 64, 64, 3, 32, 32)["forward"],
                                conv_bytes, lambda: conv(image)))
    sizes, batch = [512, 2048, 512], 128
    mlp = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 512)).to(device)
    data = randn(batch, 512)
    weights = sum(p.numel() for p in mlp.parameters() if p.dim() == 2)
    activations = batch * sum(sizes)

    def mlp_step() -> None:
        mlp.zero_grad(set_to_none=True)
        mlp(data).sum().backward()

    operations.append(Operation("MLP step 512-2048-512", mlp_step_flops(batch, sizes)["total"],
                                4 * (3 * weights + 2 * activations), mlp_step))
    return operations


def measure_machine(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, size: int = 1024,
                    numel: int = 1 << 22) -> tuple[float, float]:
    """Measure ``device``'s roofline: (peak FLOP/s, bandwidth in bytes/s).

    The peak is what a ``size`` x ``size`` matrix product in ``dtype`` reaches (2·size³ FLOPs over its median
    time), the bandwidth what an add of two float32 tensors of ``numel`` numbers reaches (12 bytes per number),
    written as a learner writes it, ``a + b``, at the size ``course_operations`` adds. Both are timed in this
    one call, so that a busy machine is as busy for both: their ratio, the ridge point, moves less than either.

    On a CPU the default 16 MiB tensors are larger than most caches, and small enough that the allocator reuses
    the memory the last output freed: from 64 MiB on, glibc maps fresh pages for each new output, and touching
    them for the first time took as long as the add itself here (3.5 GB/s against 14 with ``out=``).
    """
    from . import timing  # torch.utils.benchmark, imported on first use

    _positive(size=size, numel=numel)
    device = torch.device(device)
    x, y = torch.randn(size, size, device=device, dtype=dtype), torch.randn(size, size, device=device, dtype=dtype)
    a, b = torch.randn(numel, device=device), torch.randn(numel, device=device)

    def seconds(work: Callable[[], object]) -> float:
        def run() -> None:  # each run waits for the device: torch.utils.benchmark synchronizes CUDA only, not MPS
            work()
            timing.synchronize(device)

        return timing.measure(run).median

    matmul, add = seconds(lambda: x @ y), seconds(lambda: a + b)
    return 2 * size**3 / matmul, 12 * numel / add
