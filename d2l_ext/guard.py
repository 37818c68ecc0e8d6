"""The one way for a notebook cell to need GPUs.

    if d2l_ext.needs_gpus(2):
        ...  # runs only with two GPUs or more

With too few GPUs the cell prints one line (what it needs, what it found, how to get a GPU) and runs
nothing; with enough it runs, and an error inside it fails like any other. A plain ``if`` keeps the
guarded code visible to linters and behaves the same in JupyterLab, on Colab and under nbval.
Tag such a cell ``device-dependent`` so that nbval compares its output only on a machine without an
accelerator, where the stored outputs are made (see tests/conftest.py).
"""

from __future__ import annotations

import os
import shutil

import torch

from .devices import accelerator_type, num_gpus

# what each device type is called in the message
_VENDOR = {"cuda": "CUDA (NVIDIA, or AMD with ROCm)", "mps": "Apple MPS", "xpu": "Intel XPU"}


def unusable_driver() -> str | None:
    """Return the CUDA version torch is built for when an NVIDIA driver is installed (nvidia-smi) but torch finds
    no GPU and none is hidden on purpose (CUDA_VISIBLE_DEVICES): most often a driver older than that CUDA needs."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    hidden = visible is not None and visible.strip() in ("", "-1")  # every GPU hidden on purpose
    if torch.version.cuda and not hidden and shutil.which("nvidia-smi") and not torch.cuda.is_available():
        return torch.version.cuda
    return None


def skip_message(needed: int, found: int, found_type: str | None, kind: str | None = None,
                 driver_cuda: str | None = None) -> str:
    """Return the one-line message that a guarded cell prints when it skips (``driver_cuda``: see
    ``unusable_driver``)."""
    what = f"{needed} GPU" + ("s" if needed > 1 else "")
    if kind is not None:
        what += f" of type {_VENDOR.get(kind, kind)}"
    if found == 0 and driver_cuda:
        return (f"Skipped: this cell needs {what}; this machine has an NVIDIA driver (nvidia-smi runs), but PyTorch, "
                f"built for CUDA {driver_cuda}, cannot use it: the driver is most likely older than CUDA "
                f"{driver_cuda} needs. Update the driver, or install a PyTorch built for the CUDA version that "
                "nvidia-smi shows.")
    if found == 0:
        have = "no GPU"
    else:
        have = f"{found} {_VENDOR.get(found_type or '', found_type)} GPU" + ("s" if found > 1 else "")
    if needed == 1:
        how = "To get one on Colab: Runtime > Change runtime type > T4 GPU."
    else:
        how = f"Colab offers only one GPU: use a machine with {needed} (a multi-GPU cloud instance)."
    return f"Skipped: this cell needs {what}; this machine has {have}. {how}"


def gpus_available(n: int = 1, kind: str | None = None) -> bool:
    """Return True if ``n`` GPUs (of device type ``kind``, if given) are usable here."""
    usable = num_gpus() if kind is None or kind == accelerator_type() else 0
    return usable >= n


def needs_gpus(n: int = 1, kind: str | None = None) -> bool:
    """Return True if ``n`` GPUs (of device type ``kind``, if given) are usable; else print why not."""
    if gpus_available(n, kind):
        return True
    found = num_gpus()
    print(skip_message(n, found, accelerator_type(), kind, unusable_driver() if found == 0 else None))
    return False
