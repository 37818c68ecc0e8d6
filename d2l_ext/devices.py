"""Computing devices, with d2l's names and meanings, made vendor-neutral.

d2l's versions (``d2l.cpu``, ``d2l.gpu``, ``d2l.num_gpus``, ``d2l.try_gpu``, ``d2l.try_all_gpus``) know
only CUDA, and ``d2l.try_all_gpus()`` returns ``[]`` without a GPU although its docstring promises
``[cpu()]``. These keep the names and fix both: a "GPU" here is any accelerator PyTorch reports through
``torch.accelerator`` (NVIDIA CUDA, AMD ROCm, which PyTorch also calls ``cuda``, Apple MPS, Intel XPU),
with a fallback to ``torch.cuda`` and ``torch.backends.mps`` on releases older than 2.6.
"""

from __future__ import annotations

import torch


def accelerator_type() -> str | None:
    """Return the device type of the usable accelerator ('cuda', 'mps', 'xpu', ...), or None."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:  # torch >= 2.6
        if not accelerator.is_available():
            # a CUDA build on a machine without a GPU still names 'cuda' as its accelerator
            return None
        return accelerator.current_accelerator().type
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return None


def cpu() -> torch.device:
    """Return the CPU device: all cores and all of the host's memory."""
    return torch.device("cpu")


def gpu(i: int = 0) -> torch.device:
    """Return the name of GPU ``i`` (one card and its memory); like d2l, it does not check that it exists."""
    return torch.device(f"{accelerator_type() or 'cuda'}:{i}")


def num_gpus() -> int:
    """Return the number of usable GPUs (0 on a machine without one)."""
    kind = accelerator_type()
    if kind is None:
        return 0
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        return accelerator.device_count()
    return torch.cuda.device_count() if kind == "cuda" else 1


def try_gpu(i: int = 0) -> torch.device:
    """Return ``gpu(i)`` if it exists, otherwise ``cpu()``."""
    if num_gpus() >= i + 1:
        return gpu(i)
    return cpu()


def try_all_gpus() -> list[torch.device]:
    """Return all GPUs, or ``[cpu()]`` if there is none (d2l-en returns ``[]`` here despite its docstring)."""
    devices = [gpu(i) for i in range(num_gpus())]
    return devices if devices else [cpu()]
