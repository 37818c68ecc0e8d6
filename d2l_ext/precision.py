"""Mixed precision on any device: which 16-bit type to autocast to, and whether it needs a GradScaler.

``torch.autocast`` takes the dtype from the caller and does not choose one. bfloat16 has float32's range,
so it trains without a ``GradScaler``, but only some hardware computes it natively: the CPU runs it
everywhere (emulated on CPUs without bfloat16 instructions), NVIDIA GPUs from Ampere (compute capability
8.0) on, AMD GPUs with ROCm, and Apple GPUs from macOS 14 on. Elsewhere float16 it is, with a scaler.
``saved_tensor_bytes`` measures what autocast saves in memory: the tensors autograd keeps for the backward
pass, in float32 or in 16 bits.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

# AMD architectures (gcnArchName prefixes) with bfloat16 matrix instructions: CDNA 1-4, RDNA 3-4
_AMD_BF16_ARCHS = ("gfx908", "gfx90a", "gfx94", "gfx95", "gfx11", "gfx12")


def autocast_dtype(device_type: str) -> torch.dtype:
    """Return the 16-bit dtype to autocast to on ``device_type``: bfloat16 where it runs natively, else float16."""
    if device_type == "cuda" and torch.version.hip:
        # ROCm answers is_bf16_supported() with True for every AMD GPU; bfloat16 matrix instructions exist from
        # CDNA 1 (gfx908, MI100) and RDNA 3 (gfx11) on, by AMD's ISA documents, not on gfx906 (MI50) or RDNA 2
        arch = torch.cuda.get_device_properties(torch.cuda.current_device()).gcnArchName
        return torch.bfloat16 if arch.startswith(_AMD_BF16_ARCHS) else torch.float16
    if device_type == "cuda":
        # without including_emulation=False a T4 (compute capability 7.5) answers True: it can store bfloat16,
        # but has no bfloat16 Tensor Cores, so float16 is the fast type there
        return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
    if device_type == "mps":
        # MPS runs bfloat16 from macOS 14 on; on older systems autocast would warn and switch itself off
        return torch.bfloat16 if torch.backends.mps.is_macos_or_newer(14, 0) else torch.float16
    return torch.bfloat16  # the CPU's autocast type; XPU and others support it too


# AMD architectures on which PyTorch uses TF32, where torch has no torch.cuda.is_tf32_supported: MI300 (gfx94x)
# and MI350 (gfx95x), the list torch 2.14's is_tf32_supported checks
_AMD_TF32_ARCHS = ("gfx94", "gfx95")


def _amd_has_tf32(index: int, arch: str) -> bool:
    """Whether AMD GPU ``index`` (architecture ``arch``) computes TF32: torch's own answer where it has one."""
    supported = getattr(torch.cuda, "is_tf32_supported", None)
    if supported is None or index != torch.cuda.current_device():  # it answers for the current device only
        return arch.startswith(_AMD_TF32_ARCHS)
    return bool(supported())


def tf32_missing(index: int = 0) -> str | None:
    """Return why float32 matrix products on CUDA GPU ``index`` will not use TF32 when asked to, or None."""
    if torch.version.hip:
        arch = torch.cuda.get_device_properties(index).gcnArchName
        if not _amd_has_tf32(index, arch):
            return (f"this AMD GPU ({arch.split(':')[0]}) has no TF32; PyTorch uses it on MI300 and MI350 "
                    "(gfx94x, gfx95x)")
        # An expectation, not verified on a GPU: older torch's source and tests set this variable for hipBLASLt to
        # compute TF32 on MI300; torch 2.14's test helpers no longer set it, so 2.14 may not need it (GPU review m4)
        if os.environ.get("HIPBLASLT_ALLOW_TF32") != "1":
            return "on ROCm, TF32 needs HIPBLASLT_ALLOW_TF32=1 in the environment before Python starts"
        return None
    major, minor = torch.cuda.get_device_capability(index)
    if major < 8:
        return f"compute capability {major}.{minor} has no TF32 units (they came with Ampere, 8.0)"
    return None


def needs_grad_scaler(dtype: torch.dtype | None) -> bool:
    """Return True if training under autocast to ``dtype`` needs a GradScaler (float16: small gradients vanish)."""
    return dtype == torch.float16


_VIEWS_AND_CASTS = {"TBackward0", "TransposeBackward0", "PermuteBackward0", "ViewBackward0", "ToCopyBackward0"}


def saved_tensor_bytes(forward: Callable[[], object]) -> dict[str, int]:
    """Return the bytes autograd saves for backward while ``forward()`` runs: activations, and parameters."""
    # Each storage counts once (ReLU's output is also the next layer's input). A parameter is a leaf that
    # requires grad; a transposed view of it, or its 16-bit copy under autocast, counts with it.
    saved: dict[int, tuple[str, int]] = {}

    def is_parameter(tensor: torch.Tensor) -> bool:
        grad_fn = tensor.grad_fn
        while grad_fn is not None and type(grad_fn).__name__ in _VIEWS_AND_CASTS:
            grad_fn = grad_fn.next_functions[0][0]
        if grad_fn is None:
            return tensor.is_leaf and tensor.requires_grad
        return type(grad_fn).__name__ == "AccumulateGrad"

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        # a view (a batch sliced from a larger tensor) counts its own bytes, not its whole storage's
        key, nbytes = tensor.untyped_storage().data_ptr(), tensor.numel() * tensor.element_size()
        kind = "parameters" if is_parameter(tensor) else "activations"
        saved[key] = (kind, max(nbytes, saved.get(key, (kind, 0))[1]))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        forward()
    totals = {"activations": 0, "parameters": 0}
    for kind, nbytes in saved.values():
        totals[kind] += nbytes
    return totals
