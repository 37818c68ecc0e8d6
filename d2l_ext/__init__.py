"""Helpers shared by the GPUs-in-PyTorch notebooks; they extend ``from d2l import torch as d2l``."""

from .devices import accelerator_type, cpu, gpu, num_gpus, try_all_gpus, try_gpu
from .guard import needs_gpus
from .timing import measure

__all__ = ["accelerator_type", "cpu", "gpu", "measure", "needs_gpus", "num_gpus", "try_all_gpus", "try_gpu"]
