"""Helpers shared by the GPUs-in-PyTorch notebooks; they extend ``from d2l import torch as d2l``."""

from .devices import accelerator_type, cpu, gpu, num_gpus, try_all_gpus, try_gpu
from .guard import needs_gpus
from .memory import memory_report, memory_table
from .timing import measure

__all__ = [
    "accelerator_type",
    "cpu",
    "gpu",
    "measure",
    "memory_report",
    "memory_table",
    "needs_gpus",
    "num_gpus",
    "try_all_gpus",
    "try_gpu",
]
