"""Timing that a learner can trust, built on ``torch.utils.benchmark``.

``torch.utils.benchmark.Timer`` already does the hard parts: it synchronizes the accelerator around each
measurement (so asynchronous GPU work is counted; d2l's ``Timer`` and ``Benchmark`` do not), sets the
thread count, and repeats until the estimate is stable. ``measure`` adds a warm-up call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

# Importing torch.utils.benchmark imports cpp_extension, which logs "No CUDA runtime is found" on a
# machine that has a CUDA toolkit but no GPU: noise on stderr that would change a notebook's output.
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
from torch.utils import benchmark  # noqa: E402


def measure(
    fn: Callable[[], object], *, num_threads: int | None = None, min_run_time: float = 0.2, label: str = ""
) -> benchmark.Measurement:
    """Return the measured time of ``fn()`` (``.median`` and ``.iqr`` in seconds), after one warm-up call."""
    fn()  # warm-up: first-call costs (allocation, kernel selection, lazy initialisation) are not measured
    timer = benchmark.Timer(
        stmt="fn()", globals={"fn": fn}, num_threads=num_threads or torch.get_num_threads(), label=label
    )
    return timer.blocked_autorange(min_run_time=min_run_time)
