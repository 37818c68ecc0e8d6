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
import subprocess
from typing import NamedTuple

import torch

from .devices import accelerator_type, num_gpus

# what each device type is called in the message
_VENDOR = {"cuda": "CUDA (NVIDIA, or AMD with ROCm)", "mps": "Apple MPS", "xpu": "Intel XPU"}


# nvidia-smi -L answers in well under a second where a driver is loaded; a hung one must not stall a cell
NVIDIA_SMI_TIMEOUT_S = 5


class UnusableDriver(NamedTuple):
    """A GPU that nvidia-smi lists but PyTorch cannot use, and the CUDA version PyTorch is built for."""

    listed_gpu: str  # nvidia-smi -L's first line without the UUID, e.g. "GPU 0: Tesla T4"
    torch_cuda: str


def _listed_gpu() -> str | None:
    """Return the first GPU that ``nvidia-smi -L`` lists ("GPU 0: Tesla T4"), or None if nvidia-smi is absent,
    fails, times out or lists no GPU."""
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        return None
    try:
        done = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:  # e.g. "couldn't communicate with the NVIDIA driver", "No devices were found"
        return None
    gpus = [line.split(" (UUID:")[0].strip() for line in done.stdout.splitlines() if line.startswith("GPU ")]
    return gpus[0] if gpus else None


def unusable_driver() -> UnusableDriver | None:
    """Return the GPU that nvidia-smi lists when PyTorch, built for CUDA, finds none and none is hidden on purpose
    (CUDA_VISIBLE_DEVICES): most often a driver older than that CUDA needs. Else None."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    hidden = visible is not None and visible.strip() in ("", "-1")  # every GPU hidden on purpose
    if not torch.version.cuda or hidden or torch.cuda.is_available():
        return None
    gpu = _listed_gpu()  # only a GPU that nvidia-smi really lists puts the blame on the driver
    return UnusableDriver(gpu, torch.version.cuda) if gpu is not None else None


def skip_message(needed: int, found: int, found_type: str | None, kind: str | None = None,
                 unusable: UnusableDriver | None = None) -> str:
    """Return the one-line message that a guarded cell prints when it skips (``unusable``: see
    ``unusable_driver``)."""
    what = f"{needed} GPU" + ("s" if needed > 1 else "")
    if kind is not None:
        what += f" of type {_VENDOR.get(kind, kind)}"
    if found == 0 and unusable is not None:
        cuda = unusable.torch_cuda
        return (f"Skipped: this cell needs {what}; nvidia-smi lists a GPU ({unusable.listed_gpu}), but PyTorch, "
                f"built for CUDA {cuda}, cannot use it: the NVIDIA driver is most likely older than CUDA {cuda} "
                "needs. Update the driver, or install a PyTorch built for the CUDA version that nvidia-smi shows.")
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
