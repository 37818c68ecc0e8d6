"""Helpers shared by the GPUs-in-PyTorch notebooks; they extend ``from d2l import torch as d2l``."""

from .devices import accelerator_type, cpu, gpu, num_gpus, try_all_gpus, try_gpu
from .guard import needs_gpus
from .launch import LaunchError, device_and_backend, rank_device_and_backend, torchrun
from .memory import memory_report, memory_table
from .timing import bandwidth, measure, measure_copy, synchronize
from .training import synthetic_classification

__all__ = [
    "LaunchError",
    "accelerator_type",
    "bandwidth",
    "cpu",
    "device_and_backend",
    "gpu",
    "measure",
    "measure_copy",
    "memory_report",
    "memory_table",
    "needs_gpus",
    "num_gpus",
    "rank_device_and_backend",
    "synchronize",
    "synthetic_classification",
    "torchrun",
    "try_all_gpus",
    "try_gpu",
]
