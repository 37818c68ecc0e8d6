"""Helpers shared by the GPUs-in-PyTorch notebooks; they extend ``from d2l import torch as d2l``."""

from .devices import accelerator_type, cpu, gpu, num_gpus, try_all_gpus, try_gpu
from .guard import needs_gpus
from .launch import LaunchError, torchrun
from .memory import memory_report, memory_table
from .timing import bandwidth, measure, measure_copy, synchronize
from .training import synthetic_classification

__all__ = [
    "LaunchError",
    "accelerator_type",
    "bandwidth",
    "cpu",
    "gpu",
    "measure",
    "measure_copy",
    "memory_report",
    "memory_table",
    "needs_gpus",
    "num_gpus",
    "synchronize",
    "synthetic_classification",
    "torchrun",
    "try_all_gpus",
    "try_gpu",
]
