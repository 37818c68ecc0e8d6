"""Every figure the course quotes about hardware it did not run on, each with its source (chapters 3, 9, 10).

A figure is a spec sheet's (what the vendor states the part can do) or a recorded measurement (what someone
measured and published); it says which, and what it counts: one direction of a link or both, dense or sparse
FLOP/s. Nothing here was measured by the course.

- ``SPECS``: the spec sheets of the GPUs the course knows, dense peak FLOP/s per dtype, memory, its bandwidth and
  the GPU-to-GPU link; ``GPUS``: the four that chapter 10 compares (``roofline`` reads them), ``gpu_spec`` reads
  any row;
- ``SM_LIMITS``: what one SM of an H100 and an A100 holds at once (registers, shared memory, warps, blocks),
  for chapter 12's occupancy;
- ``RECORDED``: measured figures (busbw, the largest matrix product reached (MAMF), MFU, host copies, a
  cluster's throughput); ``recorded`` finds one;
- ``figures``: every figure of one model, spec and recorded, as ``Figure`` records (value, unit, what it
  measures, source), the form the tests compare the notebooks' text with;
- ``lookup``: the row of the GPU that ``torch.cuda.get_device_name()`` names, matched by model (an H100 PCIe
  is not an H100 SXM), or None; ``no_row_message``: the one line a cell prints for a GPU without a row;
  ``against_sheet``: the line comparing a measured FLOP/s with the sheet's peak, or that line.

A model whose figures could not be checked against a source has no row: the H100 NVL, H200 NVL, GH200, B200
(its sources disagree: 180 or 192 GB, 7.7 or 8 TB/s) and the MI300A. ``gpu_spec`` raises ``ValueError`` for a
name the table does not know, naming the ones it knows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Figure:
    """One figure: ``value`` in ``unit`` (TFLOP/s, GB/s, TB/s, GB, PFLOP/s, ...), what it ``measures`` (spec or
    measured; dense or sparse; one direction or both) and its ``source``."""

    value: float
    unit: str
    measures: str
    source: str


@dataclass(frozen=True)
class GPUSpec:
    """A GPU's spec sheet: dense peak FLOP/s for each dtype it accelerates, memory bandwidth in bytes/s, memory
    in GB, the sheet quoted (``source``); the model's full name, the names ``torch.cuda.get_device_name()``
    gives it (``device_names``), its GPU-to-GPU link in bytes/s per direction (0 when none is recorded), the
    PCIe generation of its x16 link to the host (0: not recorded), and the factor of the sheet's "with sparsity"
    Tensor Core figures (1 when the sheet has none)."""

    name: str
    peak: dict[str, float]
    bandwidth: float
    memory_gib: int
    source: str
    model: str = ""
    device_names: tuple[str, ...] = ()
    link: float = 0.0
    link_name: str = ""
    pcie: int = 0
    sparsity: int = 1


_A100_SHEET = ("NVIDIA A100 Tensor Core GPU datasheet: FP32 19.5, TF32 156, BF16/FP16 312 TFLOPS (dense; twice with "
               "sparsity), the same for SXM and PCIe; HBM 1,555 GB/s (40 GB), 1,935 GB/s (80 GB PCIe), 2,039 GB/s "
               "(80 GB SXM); NVLink 600 GB/s (300 each way); PCIe Gen4 64 GB/s")
_A100_PEAK = {"float32": 19.5e12, "tf32": 156e12, "float16": 312e12, "bfloat16": 312e12}
_H100_SHEET = ("NVIDIA H100 Tensor Core GPU datasheet, SXM5: FP32 67, TF32 989 and BF16/FP16 1,979 TFLOPS with "
               "sparsity (494.7 and 989.4 dense), HBM3 3.35 TB/s; NVLink 4 900 GB/s (450 each way), PCIe Gen5 128 GB/s")
_H100_PEAK = {"float32": 67e12, "tf32": 494.7e12, "float16": 989.4e12, "bfloat16": 989.4e12}

# Dense figures (a sheet's "with sparsity" figure is ``sparsity`` times these, for the Tensor Core dtypes). tf32 is
# float32 work on Tensor Cores (torch.backends.cuda.matmul.allow_tf32); the T4 (Turing) has neither tf32 nor
# bfloat16 Tensor Cores. The first four rows are the course's (chapter 10's table prints them; a review of
# 2026-11-29 checked them against the sheets); the others are variants a learner's machine may have.
SPECS = {
    "T4": GPUSpec("T4", {"float32": 8.1e12, "float16": 65e12}, 320e9, 16,
                  "NVIDIA T4 Tensor Core GPU datasheet (2018): FP32 8.1 TFLOPS, mixed-precision FP16/FP32 65 TFLOPS, "
                  "GDDR6 320 GB/s", model="Tesla T4 16 GB", device_names=("T4",)),
    "A100": GPUSpec("A100", dict(_A100_PEAK), 2039e9, 80,
                    "NVIDIA A100 Tensor Core GPU datasheet, SXM 80 GB: FP32 19.5, TF32 156, BF16/FP16 312 TFLOPS "
                    "(dense), HBM2e 2,039 GB/s; NVLink 3 600 GB/s (300 each way), PCIe Gen4 64 GB/s",
                    model="A100 SXM4 80 GB", device_names=("A100 SXM4 80GB",), link=300e9,
                    link_name="NVLink 3", pcie=4, sparsity=2),
    "H100": GPUSpec("H100", dict(_H100_PEAK), 3.35e12, 80, _H100_SHEET, model="H100 SXM5 80 GB",
                    device_names=("H100 80GB HBM3",), link=450e9, link_name="NVLink 4", pcie=5,
                    sparsity=2),
    "MI300X": GPUSpec("MI300X", {"float32": 163.4e12, "tf32": 653.7e12, "float16": 1307.4e12,
                                 "bfloat16": 1307.4e12}, 5.3e12, 192,
                      "AMD Instinct MI300X data sheet: FP32 matrix 163.4, TF32 653.7, FP16/BF16 1,307.4 TFLOPS "
                      "(dense), HBM3 5.3 TB/s", model="Instinct MI300X 192 GB", device_names=("MI300X",)),
    "A100 SXM 40GB": GPUSpec("A100 SXM 40GB", dict(_A100_PEAK), 1555e9, 40, _A100_SHEET, model="A100 SXM4 40 GB",
                             device_names=("A100 SXM4 40GB",), link=300e9, link_name="NVLink 3", pcie=4,
                             sparsity=2),
    "A100 PCIe 40GB": GPUSpec("A100 PCIe 40GB", dict(_A100_PEAK), 1555e9, 40, _A100_SHEET, model="A100 PCIe 40 GB",
                              device_names=("A100 PCIE 40GB",), pcie=4, sparsity=2),
    "A100 PCIe 80GB": GPUSpec("A100 PCIe 80GB", dict(_A100_PEAK), 1935e9, 80, _A100_SHEET, model="A100 PCIe 80 GB",
                              device_names=("A100 80GB PCIE",), pcie=4, sparsity=2),
    "H100 PCIe": GPUSpec("H100 PCIe", {"float32": 51e12, "tf32": 378e12, "float16": 756.5e12, "bfloat16": 756.5e12},
                         2.0e12, 80,
                         "NVIDIA H100 PCIe datasheet (as tabulated beside the SXM5's by a reseller, "
                         "archive-lib.hpctech.co.jp/gpuproduct/nvidia-h100.html): FP32 51, TF32 756 and BF16/FP16 "
                         "1,513 TFLOPS with sparsity (378 and 756.5 dense), HBM2e 2,000 GB/s, 80 GB; NVLink bridge "
                         "600 GB/s, PCIe Gen5 128 GB/s", model="H100 PCIe 80 GB", device_names=("H100 PCIE",),
                         link=300e9, link_name="NVLink 4 bridge", pcie=5, sparsity=2),
    "H200": GPUSpec("H200", dict(_H100_PEAK), 4.8e12, 141,
                    "NVIDIA H200 Tensor Core GPU datasheet, SXM: the H100 SXM5's Hopper die and peaks (BF16/FP16 "
                    "1,979 TFLOPS with sparsity), HBM3e 141 GB at 4.8 TB/s, NVLink 900 GB/s, PCIe Gen5 128 GB/s",
                    model="H200 SXM 141 GB", device_names=("H200",), link=450e9,
                    link_name="NVLink 4", pcie=5, sparsity=2),
}
GPUS = {name: SPECS[name] for name in ("T4", "A100", "H100", "MI300X")}


@dataclass(frozen=True)
class SMLimits:
    """What one streaming multiprocessor holds at once (chapter 12's occupancy): 32-bit registers, shared memory
    in bytes, warps and blocks; registers are given to a warp in units of ``register_unit``, and each block uses
    ``shared_reserved_per_block`` bytes of shared memory more than it asks for. ``sms``: SMs on the GPU."""

    registers: int
    register_unit: int
    shared: int
    shared_reserved_per_block: int
    max_warps: int
    max_blocks: int
    sms: int
    source: str


_CUDA_GUIDE = ("NVIDIA CUDA C++ Programming Guide, Compute Capabilities, table 'Technical Specifications per Compute "
               "Capability' (65,536 32-bit registers per SM, 64 warps and 32 blocks per SM; shared memory per SM "
               "228 KB on 9.0, 164 KB on 8.0) and its note that the driver reserves 1 KB of shared memory per block; "
               "the register allocation unit, 256 per warp, is the CUDA Occupancy Calculator's")
SM_LIMITS = {
    "H100": SMLimits(65536, 256, 228 * 1024, 1024, 64, 32, 132,
                     _CUDA_GUIDE + "; 132 SMs: NVIDIA H100 Tensor Core GPU Architecture whitepaper, H100 SXM5"),
    "A100": SMLimits(65536, 256, 164 * 1024, 1024, 64, 32, 108,
                     _CUDA_GUIDE + "; 108 SMs: NVIDIA A100 Tensor Core GPU Architecture whitepaper"),
}

_TENSOR_DTYPES = ("tf32", "float16", "bfloat16")
_NCCL = ("NVIDIA/nccl-tests#212 and NVIDIA/nccl#1442 (an NCCL maintainer): 450 GB/s is NVLink 4's line rate one "
         "way (900 both ways); NCCL reaches about 370 GB/s each way (busbw with NCCL_ALGO=RING), and all-reduce with "
         "NVLink SHARP a busbw of about 480 GB/s (algbw about 275) on 8 H100s")
_MAMF = ("Stas Bekman, Machine Learning Engineering, compute/accelerator/README.md, maximum achievable matmul "
         "FLOPS (MAMF) table, bf16, measured with mamf-finder.py (MI300X with PYTORCH_TUNABLEOP_ENABLED=1)")
_MEGATRON = ("Shoeybi et al. 2019, Megatron-LM: an 8.3-billion-parameter GPT-2 on 512 V100 GPUs (8-way tensor, 64-way "
             "data parallel) sustained 15.1 PFLOP/s, 76% scaling efficiency against one GPU (39 TFLOP/s)")
_BANDWIDTH_TEST = "CUDA sample bandwidthTest, 32 MB, quick mode"
_T4_V100 = f"{_BANDWIDTH_TEST}: GitHub router-gao/cuda-demo, cuda-samples/02-cuda-bandwidth.md"
_A100_HOSTS = f"{_BANDWIDTH_TEST}: GitHub gengwg/gpu, nvda_gpu_benchmark.md (a DGX A100 and a Dell server)"
_FLASH3 = ("Shah, Bikshandi, Zhang, Thakkar, Ramani, Dao 2024, FlashAttention-3: Fast and Accurate Attention with "
           "Asynchrony and Low-precision, abstract: 'FP16 reaching up to 740 TFLOPs/s (75% utilization)' on H100")
_PICOTRON = "huggingface/picotron README (the Ultra-Scale Playbook's training code)"
_GPT_FAST = ("pytorch-labs/gpt-fast README (commit 0f925b5), 'Tokens/Second' and 'Memory Bandwidth (GB/s)': "
             "Llama-2-7B, batch 1, a 5-token prompt, on an A100-80GB power-limited to 330 W")


def _copies(source: str, where: str, **gbps: float) -> tuple[Figure, ...]:
    """Host-device copy rates measured with bandwidthTest: h2d_pinned=9.7 etc., in GB/s."""
    return tuple(Figure(value, "GB/s", f"measured: {name.replace('_', ' ')} copy, {where}", source)
                 for name, value in gbps.items())


# Measured figures, by the row of the model they were measured on (V100: no row, only these). NVIDIA/nccl#1264's
# "783 of 900 GB/s" is a CUDA sample's peer-to-peer copy in both directions at once: the course compares busbw
# with one direction, so it keeps the same issue's one-direction figure (380 of 450) and not that one.
RECORDED: dict[str, tuple[Figure, ...]] = {
    "H100": (
        Figure(370, "GB/s", "measured: all-reduce busbw with rings (NCCL_ALGO=RING), 8 H100 SXM over NVLink 4", _NCCL),
        Figure(480, "GB/s", "measured: all-reduce busbw with NVLink SHARP (NVLS), 8 H100 SXM", _NCCL),
        Figure(380, "GB/s", "measured: peer-to-peer copy, one direction, of NVLink 4's 450, HGX H100",
               "NVIDIA/nccl#1264 (the CUDA sample p2pBandwidthLatencyTest)"),
        Figure(794.5, "TFLOP/s", "measured: largest bf16 matrix product reached (MAMF), H100 SXM", _MAMF),
        Figure(38, "%", "measured: MFU training LLaMA-2-7B on 64 H100s", _PICOTRON),
        Figure(50, "%", "measured: MFU (nearly) training SmolLM-1.7B on 8 H100s", _PICOTRON),
        Figure(740, "TFLOP/s", "measured: FlashAttention-3 forward in FP16, H100 SXM5 (75% of the peak)",
               _FLASH3),
    ),
    "A100": (Figure(271.2, "TFLOP/s", "measured: largest bf16 matrix product reached (MAMF), A100 SXM", _MAMF),
             Figure(104.9, "tokens/s", "measured: Llama-2-7B decode in bfloat16, batch 1, A100 80 GB at 330 W",
                    _GPT_FAST),
             Figure(1397.31, "GB/s", "measured: memory bandwidth that bfloat16 decode reached", _GPT_FAST),
             Figure(155.58, "tokens/s", "measured: Llama-2-7B decode with int8 weights, batch 1, A100 80 GB at "
                    "330 W", _GPT_FAST),
             Figure(1069.20, "GB/s", "measured: memory bandwidth that int8 decode reached", _GPT_FAST),
             *_copies(_A100_HOSTS, "A100-SXM4-80GB, DGX A100", h2d_pageable=10.0, h2d_pinned=25.7,
                      d2h_pageable=10.8, d2h_pinned=25.8)),
    "A100 PCIe 80GB": _copies(_A100_HOSTS, "A100 80GB PCIe, Dell server", h2d_pageable=3.3, h2d_pinned=17.3,
                              d2h_pageable=8.5, d2h_pinned=24.6),
    "MI300X": (Figure(668.4, "TFLOP/s", "measured: largest bf16 matrix product reached (MAMF), MI300X", _MAMF),),
    "T4": _copies(_T4_V100, "Tesla T4, PCIe 3.0 x16", h2d_pinned=9.7, d2h_pinned=11.1),
    "V100": (
        Figure(15.1, "PFLOP/s", "measured: Megatron-LM 8.3B sustained on 512 V100 GPUs", _MEGATRON),
        Figure(76, "%", "measured: that run's scaling efficiency against one GPU", _MEGATRON),
        Figure(512, "GPUs", "the cluster of that run", _MEGATRON),
        Figure(39, "TFLOP/s", "measured: Megatron-LM's baseline on one V100 (1.2B parameters)", _MEGATRON),
        *_copies(_T4_V100, "Tesla V100-SXM2-16GB", h2d_pinned=9.6, d2h_pinned=11.4),
    ),
}


def gpu_spec(gpu: str) -> GPUSpec:
    """The spec of ``gpu`` (a name in ``SPECS``: the course's four, then the variants)."""
    if gpu not in SPECS:
        raise ValueError(f"unknown GPU {gpu!r}: the table knows {', '.join(SPECS)}")
    return SPECS[gpu]


def spec_figures(spec: GPUSpec) -> list[Figure]:
    """The figures of one spec sheet as ``Figure`` records: dense peaks in TFLOP/s (and the sheet's sparse ones,
    ``sparsity`` times the dense, for the Tensor Core dtypes), memory in GB, its bandwidth in GB/s and TB/s, and
    the links (to other GPUs, to the host) in GB/s one way and both ways."""
    rows = []
    for dtype, flops in spec.peak.items():
        rows.append(Figure(flops / 1e12, "TFLOP/s", f"spec: dense {dtype} peak", spec.source))
        if spec.sparsity > 1 and dtype in _TENSOR_DTYPES:
            rows.append(Figure(spec.sparsity * flops / 1e12, "TFLOP/s", f"spec: {dtype} peak with sparsity",
                               spec.source))
    rows.append(Figure(spec.memory_gib, "GB", "spec: memory", spec.source))
    rows += [Figure(spec.bandwidth / scale, unit, "spec: memory bandwidth", spec.source)
             for scale, unit in ((1e9, "GB/s"), (1e12, "TB/s"))]
    if spec.link:
        rows.append(Figure(spec.link / 1e9, "GB/s", f"spec: {spec.link_name}, one direction", spec.source))
        rows.append(Figure(2 * spec.link / 1e9, "GB/s", f"spec: {spec.link_name}, both directions", spec.source))
    if spec.pcie:  # as the sheets round them: 32 GB/s each way for Gen4 x16 (31.5 by the PCIe spec), 64 for Gen5
        each_way = {4: 32, 5: 64}[spec.pcie]
        rows.append(Figure(each_way, "GB/s", f"spec: PCIe Gen{spec.pcie} x16 to the host, one direction", spec.source))
        rows.append(Figure(2 * each_way, "GB/s", f"spec: PCIe Gen{spec.pcie} x16 to the host, both directions",
                           spec.source))
    return rows


def figures(model: str) -> list[Figure]:
    """Every figure of ``model``: a row's key in ``SPECS``, or a model with only recorded figures ("V100").

    A family's short name ("A100", "H100") is the course's row; its variants are their own keys."""
    found = spec_figures(SPECS[model]) if model in SPECS else []
    found += list(RECORDED.get(model, ()))
    if not found:
        raise ValueError(f"no figure recorded for {model!r}: the table knows {', '.join([*SPECS, *RECORDED])}")
    return found


_VENDOR = re.compile(r"^(?:NVIDIA|AMD|TESLA|INSTINCT|RADEON|GEFORCE)\s+")


def _normal(device_name: str) -> str:
    """A device name in one form: upper case, the vendor's and brand's words dropped from the front, hyphens and
    runs of spaces as one space ("NVIDIA A100-SXM4-40GB" -> "A100 SXM4 40GB")."""
    name = re.sub(r"[\s_-]+", " ", device_name.strip().upper())
    while (shorter := _VENDOR.sub("", name)) != name:
        name = shorter
    return name


def lookup(device_name: str) -> GPUSpec | None:
    """The row of the GPU ``torch.cuda.get_device_name()`` calls ``device_name``, or None.

    Matched by model, the whole name: "NVIDIA H100 80GB HBM3" is the H100 SXM5; "NVIDIA H100 PCIe" is its own
    row; "NVIDIA H100 NVL", "NVIDIA GH200 480GB" or "NVIDIA B200" get None, never a row whose name they contain.
    """
    name = _normal(device_name)
    for spec in SPECS.values():
        if name in spec.device_names:
            return spec
    return None


def no_row_message(device_name: str) -> str:
    """The one line a cell prints for a GPU without a row: it names the GPU and says no recorded figure exists."""
    return f"{device_name}: no recorded figure for this GPU (d2l_ext.hardware has no row for this model)"


def recorded(model: str, what: str) -> Figure:
    """The recorded (measured) figure of ``model`` whose description contains ``what`` ("MAMF", "rings")."""
    found = [figure for figure in RECORDED.get(model, ()) if what in figure.measures]
    if len(found) != 1:
        raise ValueError(f"{len(found)} recorded figures of {model!r} say {what!r}: "
                         f"{[figure.measures for figure in RECORDED.get(model, ())]}")
    return found[0]


def against_sheet(device_name: str, dtype: str, flops: float) -> str:
    """One line comparing ``flops`` FLOP/s measured in ``dtype`` on ``device_name`` with its sheet's dense peak,
    or ``no_row_message`` when the table has no row for the model (or no peak for the dtype)."""
    spec = lookup(device_name)
    if spec is None:
        return no_row_message(device_name)
    if dtype not in spec.peak:
        return f"{device_name}: no recorded {dtype} peak for the {spec.model} (its sheet gives {', '.join(spec.peak)})"
    peak = spec.peak[dtype]
    return f"{device_name}: {flops / peak:.0%} of its spec sheet's {peak / 1e12:.0f} TFLOP/s ({spec.model}, dense)"
