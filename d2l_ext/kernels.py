"""Chapter 12: writing GPU kernels on a laptop.

- ``load_simulator`` / ``needs_simulator``: Numba's CUDA simulator (threads, blocks, shared memory on a CPU);
- ``use_interpreter`` / ``needs_triton``: Triton in its interpreter (``TRITON_INTERPRET=1``), set before triton
  is imported; where Triton has no wheels (macOS, native Windows) ``d2l_ext.no_triton`` and
  ``no_triton_language`` stand in, so that the kernels can be defined, and the cells that run them print one line;
- ``launch``: runs a kernel after checking its inputs (``ValueError`` naming the problem), in the interpreter
  with every load and store checked against the tensors passed (``OutOfBounds`` names the kernel, the buffer
  and the offset before anything is written), and counts the bytes the kernel moved (atomics and tensor
  descriptors, which the chapter does not use, are neither checked nor counted);
- ``gpu_backend``, ``gpu_target``, ``needs_triton_gpu``: the device decisions of the cell that runs kernels for
  real (``d2l_ext.kernel_gpu``);
- ``occupancy``, ``unfused_softmax_bytes``: the arithmetic of the chapter's tables.

Compiling for GPUs this machine lacks is ``d2l_ext.kernel_compile``.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import math
import os
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import torch

from .hardware import SMLimits

TRITON_SKIP = ("Skipped: Triton has no wheels for macOS or native Windows; this cell runs on Linux (Colab, "
               "Binder, WSL). The simulator's sections run here.")
SIMULATOR_SKIP = "Skipped: numba is not installed here (pip install numba); the Triton sections still run."


def triton_importable() -> bool:
    """Return whether the triton package is installed (Linux wheels only)."""
    return importlib.util.find_spec("triton") is not None


def numba_importable() -> bool:
    """Return whether numba is installed."""
    return importlib.util.find_spec("numba") is not None


def needs_triton() -> bool:
    """Return True if Triton is installed; else print one line saying why the cell skips."""
    if triton_importable():
        return True
    print(TRITON_SKIP)
    return False


def needs_simulator() -> bool:
    """Return True if numba is installed; else print one line saying why the cell skips."""
    if numba_importable():
        return True
    print(SIMULATOR_SKIP)
    return False


def _stand_in(name: str) -> SimpleNamespace:
    """A namespace whose decorator returns the function unchanged: simulator kernels can be defined, not run."""
    def identity(fn=None, **_):
        return fn if fn is not None else (lambda f: f)
    return SimpleNamespace(__name__=name, jit=identity, float32="float32")


def use_interpreter() -> None:
    """Set TRITON_INTERPRET=1, before triton is imported: every ``@triton.jit`` after it runs in Triton's
    interpreter. In a notebook the variable stays in its kernel's process (and the children it starts, which
    ``d2l_ext.kernel_compile`` and ``kernel_gpu`` start without it)."""
    os.environ["TRITON_INTERPRET"] = "1"


def load_simulator():
    """Return (numba.cuda, numba) with NUMBA_ENABLE_CUDASIM=1 set before numba is imported; stand-ins where
    numba is not installed. Raises RuntimeError if numba was imported without the simulator."""
    if not numba_importable():
        return _stand_in("numba.cuda"), _stand_in("numba")
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    numba = importlib.import_module("numba")
    if not numba.config.ENABLE_CUDASIM:
        raise RuntimeError("numba was imported before NUMBA_ENABLE_CUDASIM=1 was set: restart the kernel")
    return importlib.import_module("numba.cuda"), numba


# ---- inputs a kernel cannot take ----

def check_block(name: str, value: int) -> None:
    """Raise ValueError unless ``value`` is a positive power of two (tl.arange's rule for a block)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value & (value - 1):
        raise ValueError(f"block size {name}={value!r} is not a power of two (tl.arange needs one: 16, 32, 64...)")


def check_tensor(name: str, tensor: torch.Tensor, device_type: str, interpreted: bool) -> None:
    """Raise ValueError if ``tensor`` is on another device type, not contiguous, or bf16 in the interpreter."""
    if tensor.device.type != device_type:
        raise ValueError(f"{name} is on {tensor.device.type}, the kernel runs on {device_type}: "
                         f"move it with .to({device_type!r})")
    if not tensor.is_contiguous():
        raise ValueError(f"{name} is not contiguous (strides {tuple(tensor.stride())}): the kernel's offsets "
                         "assume rows one after another; pass .contiguous()")
    if interpreted and tensor.dtype == torch.bfloat16:
        raise ValueError(f"{name} is bfloat16, which Triton's interpreter computes wrongly (triton 3.8: arithmetic "
                         "fails, tl.dot returns garbage): use float32 or float16 here, bfloat16 on a GPU")


# ---- the bounds checker ----

class OutOfBounds(IndexError):
    """A load or store that would touch memory outside every tensor passed to the kernel."""


@dataclass
class _Buffer:
    name: str
    start: int
    nbytes: int
    element_size: int
    dtype: torch.dtype


@dataclass
class Traffic:
    """Bytes a kernel read and wrote, counted lane by lane over the unmasked lanes of every program."""

    read: int = 0
    written: int = 0
    counted: bool = True  # False on a GPU, where nothing is counted

    @property
    def total(self) -> int:
        """Return bytes read plus bytes written."""
        return self.read + self.written


def _outside(buffers: list[_Buffer], addresses: np.ndarray, size: int) -> tuple[int, _Buffer | None]:
    """Return (first address outside every buffer, the buffer it belongs to most likely), or (-1, None)."""
    inside = np.zeros(addresses.shape, dtype=bool)
    for b in buffers:
        inside |= (addresses >= b.start) & (addresses + size <= b.start + b.nbytes)
    if inside.all():
        return -1, None
    address = int(addresses[~inside][0])
    below = [b for b in buffers if b.start <= address]  # the buffer it ran past, else the nearest above
    owner = max(below, key=lambda b: b.start) if below else min(buffers, key=lambda b: b.start)
    return address, owner


def _message(kernel: str, what: str, address: int, owner: _Buffer, size: int, program) -> str:
    offset = (address - owner.start) // size
    count = owner.nbytes // owner.element_size
    return (f"{kernel}: {what} out of bounds of {owner.name} ({count} elements of "
            f"{str(owner.dtype).removeprefix('torch.')}) at element offset {offset}, in program "
            f"{tuple(int(i) for i in program)}; nothing was {what.replace('load', 'read').replace('store', 'written')}"
            ": mask the lanes past the end (mask=offsets < n)")


@contextlib.contextmanager
def _checked(kernel: str, buffers: list[_Buffer], traffic: Traffic):
    """Check and count every masked load and store of Triton's interpreter while inside."""
    from triton.runtime import interpreter

    builder = interpreter.interpreter_builder
    load, store = builder.create_masked_load, builder.create_masked_store

    def active(ptrs, mask):
        addresses = ptrs.data.astype(np.int64)
        mask_data = np.broadcast_to(mask.data, addresses.shape)
        size = ptrs.get_element_ty().primitive_bitwidth // 8
        return addresses[mask_data], size

    def checked(what: str, ptrs, mask) -> int:
        """Raise OutOfBounds if an active lane of ``ptrs`` lies outside every buffer; return the bytes it moves."""
        addresses, size = active(ptrs, mask)
        address, owner = _outside(buffers, addresses, size)
        if owner is not None:
            raise OutOfBounds(_message(kernel, what, address, owner, size, builder.grid_idx))
        return addresses.size * size

    def checked_load(ptrs, mask, other, *rest):
        traffic.read += checked("load", ptrs, mask)
        return load(ptrs, mask, other, *rest)

    def checked_store(ptrs, value, mask, *rest):
        traffic.written += checked("store", ptrs, mask)
        return store(ptrs, value, mask, *rest)

    setattr(builder, "create_masked_load", checked_load)  # noqa: B010 (a method replaced while inside)
    setattr(builder, "create_masked_store", checked_store)  # noqa: B010
    try:
        yield
    finally:
        setattr(builder, "create_masked_load", load)  # noqa: B010
        setattr(builder, "create_masked_store", store)  # noqa: B010


def _interpreted(kernel) -> bool:
    return type(kernel).__name__ == "InterpretedFunction"


def launch(kernel, grid: tuple[int, ...], *args, **constexprs) -> Traffic:
    """Run ``kernel[grid](*args, **constexprs)`` after checking its inputs; in the interpreter, check every load
    and store against the tensors passed (raising OutOfBounds first) and return the bytes moved (on a GPU:
    ``Traffic(counted=False)``)."""
    interpreted = _interpreted(kernel)
    names = list(inspect.signature(kernel.fn).parameters)
    for name, value in constexprs.items():
        if isinstance(value, int) and not isinstance(value, bool):
            check_block(name, value)  # every integer constexpr of the chapter's kernels is a block size
    device_type = "cpu" if interpreted else gpu_device_type()
    tensors = [(n, a) for n, a in zip(names, args, strict=False) if isinstance(a, torch.Tensor)]
    for name, tensor in tensors:
        check_tensor(name, tensor, device_type, interpreted)
    if not interpreted:
        kernel[grid](*args, **constexprs)
        return Traffic(counted=False)
    from triton.runtime.errors import InterpreterError

    buffers = [_Buffer(n, t.data_ptr(), t.numel() * t.element_size(), t.element_size(), t.dtype) for n, t in tensors]
    traffic = Traffic()
    with _checked(kernel.fn.__name__, buffers, traffic):
        try:
            kernel[grid](*args, **constexprs)
        except InterpreterError as error:
            if isinstance(error.__cause__, OutOfBounds):
                raise OutOfBounds(str(error.__cause__)) from None
            raise
    return traffic


# ---- device decisions ----

def gpu_backend() -> str | None:
    """Return "cuda" (NVIDIA) or "hip" (AMD, ROCm) if torch sees a GPU that Triton can target, else None."""
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return None
    return "hip" if getattr(torch.version, "hip", None) else "cuda"


def gpu_device_type() -> str:
    """Return the device type a Triton kernel's tensors must be on for a real GPU run ("cuda" on ROCm too)."""
    return "cuda"


def gpu_target() -> str | None:
    """Return the compile target of GPU 0, such as "sm_90" or "gfx942", or None without a GPU."""
    backend = gpu_backend()
    if backend is None:
        return None
    if backend == "hip":
        return torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
    major, minor = torch.cuda.get_device_capability(0)
    return f"sm_{major}{minor}"


def needs_triton_gpu() -> bool:
    """Return True if a GPU Triton can target (NVIDIA or AMD) is here and Triton is installed; else print one
    line saying why the cell skips."""
    from .guard import needs_gpus

    if not needs_gpus(1) or not needs_triton():
        return False
    if gpu_backend() is None:
        print("Skipped: Triton runs on NVIDIA (CUDA) and AMD (ROCm) GPUs; this machine's GPU is neither.")
        return False
    return True


# ---- the chapter's arithmetic ----

def unfused_softmax_bytes(rows: int, cols: int, element_size: int = 4) -> dict[str, int]:
    """Return the bytes moved by softmax as three kernels (row max; exp and row sum; divide) and fused."""
    n, r = rows * cols, rows
    three = {"max": (n + r), "exp and sum": (n + r) + (n + r), "divide": (n + r) + n}
    out = {name: elements * element_size for name, elements in three.items()}
    return out | {"unfused": sum(out.values()), "fused": 2 * n * element_size}


@dataclass(frozen=True)
class Occupancy:
    """Blocks of one kernel that fit on one SM at once, the warps they bring, and what limits them."""

    blocks: int
    warps: int
    limit: str
    share: float


def occupancy(registers: int, shared: int, warps_per_block: int, sm: SMLimits) -> Occupancy:
    """Return how many blocks of a kernel fit on one SM of ``sm`` at once, by registers, shared memory, warps
    and blocks, and the share of the SM's warp slots they fill."""
    warp_registers = math.ceil(registers * 32 / sm.register_unit) * sm.register_unit
    by = {"warps": sm.max_warps // warps_per_block,  # on a tie, the SM's own limits are named first
          "blocks": sm.max_blocks,
          "registers": sm.registers // (warp_registers * warps_per_block) if registers else sm.max_blocks,
          "shared memory": (sm.shared // (shared + sm.shared_reserved_per_block)) if shared else sm.max_blocks}
    limit = min(by, key=lambda name: by[name])
    blocks = by[limit]
    return Occupancy(blocks, blocks * warps_per_block, limit, blocks * warps_per_block / sm.max_warps)
