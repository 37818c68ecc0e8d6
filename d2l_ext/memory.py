"""How much memory a device holds, as a table a learner can read.

On a GPU, PyTorch's caching allocator keeps four counters: bytes *allocated* to live tensors, bytes
*reserved* from the driver (live tensors plus the cache the allocator keeps for reuse), and the peak of
each since the last reset. The CPU has no such allocator (freed tensors go straight back to the C
library), so for the CPU the report gives the process's resident memory instead. Apple's MPS keeps no
peaks: its report holds the bytes allocated to tensors and the bytes the Metal driver holds for the process.
"""

from __future__ import annotations

from collections.abc import Callable

import psutil
import torch

from .devices import try_gpu

# device types whose allocator torch.accelerator's memory functions read; on MPS they raise an internal
# assert in some torch versions (pytorch#186430), so MPS is read through torch.mps instead
_ACCELERATOR_MEMORY_TYPES = ("cuda", "xpu")


def _memory_module(device: torch.device):
    """Return the module with the allocator's counters: torch.accelerator (torch >= 2.9) or torch.cuda/xpu."""
    accelerator = getattr(torch, "accelerator", None)
    if (device.type in _ACCELERATOR_MEMORY_TYPES and accelerator is not None
            and hasattr(accelerator, "memory_allocated")):
        return accelerator
    return torch.get_device_module(device)


def memory_report(device: torch.device | str | None = None) -> dict[str, int]:
    """Return the memory counters of ``device`` (default ``try_gpu()``) in bytes, by name."""
    device = torch.device(device) if device is not None else try_gpu()
    if device.type in ("cpu", "meta"):
        return {"process resident": psutil.Process().memory_info().rss}
    if device.type == "mps":
        return {"allocated": torch.mps.current_allocated_memory(), "reserved": torch.mps.driver_allocated_memory()}
    module = _memory_module(device)
    if device.index is not None:
        index = device.index
    elif module is torch.accelerator:
        index = module.current_device_index()
    else:
        index = module.current_device()  # torch.cuda and torch.xpu have no current_device_index()
    return {
        "allocated": module.memory_allocated(index),
        "reserved": module.memory_reserved(index),
        "peak allocated": module.max_memory_allocated(index),
        "peak reserved": module.max_memory_reserved(index),
    }


def memory_table(rows: list[tuple[str, dict[str, int]]], unit: int = 2**20) -> str:
    """Return ``(label, memory_report)`` rows as an aligned text table, in MiB by default."""
    columns = list(rows[0][1]) if rows else []
    unit_name = {2**20: "MiB", 2**30: "GiB", 1: "B"}.get(unit, f"x{unit} B")
    width = max([len("step")] + [len(label) for label, _ in rows])
    lines = [f"{'step':<{width}}" + "".join(f"{name + ' (' + unit_name + ')':>22}" for name in columns)]
    for label, report in rows:
        lines.append(f"{label:<{width}}" + "".join(f"{report[name] / unit:>22.1f}" for name in columns))
    return "\n".join(lines)


def allocator_step_peak(step: Callable[[], object], model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                        batch: torch.Tensor) -> tuple[int, int]:
    """Run ``step`` twice on a CUDA GPU and return the allocator's peak of the second run counted as
    ``estimate_training_memory`` counts a step, and the other bytes allocated between the two runs.

    The first run makes the optimizer's state and cuBLAS's workspaces. The peak counter is reset between the
    runs; what the second run adds on top of what was alive then, plus the model's parameters and buffers, the
    optimizer's state on the device and the batch, is the step's peak. Everything else alive between the runs
    (earlier cells' tensors, cuBLAS's workspaces) is the second number."""
    step()
    torch.cuda.synchronize()
    between = torch.cuda.memory_allocated()
    state = [t for values in optimizer.state.values() for t in values.values() if isinstance(t, torch.Tensor)]
    kept = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
            for t in (*model.parameters(), *model.buffers(), *state, batch) if t.device == batch.device}
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    kept_bytes = sum(kept.values())
    return torch.cuda.max_memory_allocated() - between + kept_bytes, between - kept_bytes
