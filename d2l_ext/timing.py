"""Timing that a learner can trust, built on ``torch.utils.benchmark``.

``torch.utils.benchmark.Timer`` already does the hard parts: it synchronizes the accelerator around each
measurement (so asynchronous GPU work is counted; d2l's ``Timer`` and ``Benchmark`` do not), sets the
thread count, and repeats the statement in blocks for at least ``min_run_time`` seconds
(``blocked_autorange``; ``adaptive_autorange`` is the variant that runs until the estimate is stable).
``measure`` adds a warm-up call;
``measure_copy`` times a copy between two devices and ``bandwidth`` turns a time into bytes per second.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from torch.utils import benchmark

# Importing torch.utils.benchmark (here, or by torch.compile) imports cpp_extension, which logs "No CUDA runtime
# is found" on a machine that has a CUDA toolkit but no GPU: noise on stderr that would change a notebook's output.
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)


def _benchmark():
    """Import torch.utils.benchmark on first use: it costs about 0.6 s (setuptools), which every process that
    imports d2l_ext would otherwise pay, the distributed scripts' workers included."""
    from torch.utils import benchmark

    return benchmark


def measure(
    fn: Callable[[], object], *, num_threads: int | None = None, min_run_time: float = 0.2, label: str = ""
) -> benchmark.Measurement:
    """Return the measured time of ``fn()`` (``.median`` and ``.iqr`` in seconds), after one warm-up call."""
    fn()  # warm-up: first-call costs (allocation, kernel selection, lazy initialisation) are not measured
    timer = _benchmark().Timer(
        stmt="fn()", globals={"fn": fn}, num_threads=num_threads or torch.get_num_threads(), label=label
    )
    return timer.blocked_autorange(min_run_time=min_run_time)


def bandwidth(nbytes: int, measurement: benchmark.Measurement) -> float:
    """Return the bytes per second reached when one run of ``measurement`` moves ``nbytes`` (from the median)."""
    return nbytes / measurement.median


def measure_copy(
    nbytes: int,
    source: torch.device | str,
    destination: torch.device | str,
    *,
    pinned: bool = False,
    non_blocking: bool = False,
    num_threads: int | None = None,
    min_run_time: float = 0.2,
) -> benchmark.Measurement:
    """Return the measured time of ``dst.copy_(src)`` for ``nbytes`` bytes; buffers are allocated once."""
    source, destination = torch.device(source), torch.device(destination)
    if pinned and "cpu" not in (source.type, destination.type):
        raise ValueError("pinned=True pins the host side of a copy; neither side is the CPU")
    # pinned (page-locked) host memory needs an accelerator runtime: without a GPU, allocating it raises
    src = torch.ones(nbytes, dtype=torch.uint8, device=source, pin_memory=pinned and source.type == "cpu")
    dst = torch.empty(nbytes, dtype=torch.uint8, device=destination, pin_memory=pinned and destination.type == "cpu")
    return measure(
        lambda: dst.copy_(src, non_blocking=non_blocking),
        num_threads=num_threads,
        min_run_time=min_run_time,
        label=f"copy {nbytes} bytes {source} -> {destination}",
    )


def synchronize(device: torch.device | str) -> None:
    """Wait until all work queued on ``device`` is done; the CPU runs each operation at once: no-op."""
    device = torch.device(device)
    if device.type != "cpu":
        torch.accelerator.synchronize(device)


def host_seconds_for(device: torch.device | str, launch_seconds: float, minimum: float = 0.0005) -> float:
    """Return the host work per step for a demo of host-device overlap: ``minimum``, or on an asynchronous
    device (a GPU) twice the host's time to launch a step if that is longer, so that the host work, not the
    launches, is what the device's time is compared with."""
    return minimum if torch.device(device).type == "cpu" else max(minimum, 2 * launch_seconds)


def device_covers_host(device: torch.device | str, issued: float, done: float, host_seconds: float) -> bool:
    """Return whether the device's own time per step is at least ``host_seconds`` of host work.

    ``issued`` is the time per step until the host has launched the step, ``done`` until the device has
    finished it. On a GPU the host launches (L) while the device computes (D), so ``done - issued`` is D - L,
    and the device sets the pace of a loop with host work H once D >= H + L. On the CPU, host and device at
    once, ``issued`` equals ``done`` and the whole step is the device's work.
    """
    own = done if torch.device(device).type == "cpu" else done - issued
    return own >= host_seconds
