"""Helpers shared by the GPUs-in-PyTorch notebooks; they extend ``from d2l import torch as d2l``."""

from .devices import accelerator_type, cpu, gpu, num_gpus, try_all_gpus, try_gpu
from .estimate import (
    MemoryEstimate,
    MemoryRow,
    estimate_parallel_memory,
    estimate_training_memory,
    measure_training_memory,
    zero_bytes_per_gpu,
)
from .guard import needs_gpus
from .launch import LaunchError, torchrun
from .memory import allocator_step_peak, memory_report, memory_table
from .precision import autocast_dtype, needs_grad_scaler, saved_tensor_bytes, tf32_missing
from .ranks import device_and_backend, rank_device_and_backend
from .room import processes_to_start
from .simqueue import SimulatedDevice
from .simqueue import plot_timeline as plot_simulated_timeline
from .timing import bandwidth, device_covers_host, host_seconds_for, measure, measure_copy, synchronize
from .trace import (
    TraceEvent,
    busy_fraction,
    device_work,
    host_rows,
    lanes,
    plot_timeline,
    ranges,
    read_chrome_trace,
    without_device_ranges,
)
from .training import make_loader, make_net, synthetic_classification

__all__ = [
    "LaunchError",
    "MemoryEstimate",
    "MemoryRow",
    "SimulatedDevice",
    "TraceEvent",
    "accelerator_type",
    "allocator_step_peak",
    "autocast_dtype",
    "bandwidth",
    "busy_fraction",
    "cpu",
    "device_and_backend",
    "device_covers_host",
    "device_work",
    "estimate_parallel_memory",
    "estimate_training_memory",
    "gpu",
    "host_rows",
    "host_seconds_for",
    "lanes",
    "make_loader",
    "make_net",
    "measure",
    "measure_copy",
    "measure_training_memory",
    "memory_report",
    "memory_table",
    "needs_grad_scaler",
    "needs_gpus",
    "num_gpus",
    "plot_simulated_timeline",
    "plot_timeline",
    "processes_to_start",
    "ranges",
    "rank_device_and_backend",
    "read_chrome_trace",
    "saved_tensor_bytes",
    "synchronize",
    "synthetic_classification",
    "tf32_missing",
    "torchrun",
    "try_all_gpus",
    "try_gpu",
    "without_device_ranges",
    "zero_bytes_per_gpu",
]
