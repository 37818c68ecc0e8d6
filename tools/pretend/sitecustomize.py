"""Make torch report another build or a GPU, or make time unreliable, for tools/check_tags.py and
tools/check_timing.py (never imported by the course itself).

Python imports this module at start-up when its folder is on PYTHONPATH. With D2L_EXT_PRETEND set it changes
what torch *reports*, not what it computes, or what the clocks report:

- ``cpu-build``: a CPU-only wheel (macOS, or ``+cpu``): no CUDA version, and CUDA calls raise AssertionError.
- ``gpu``: one CUDA GPU is reported; anything that really touches it still fails, as there is none.
- ``slow-clock``: as on a busy machine, every interval between two clock readings is reported stretched by a
  random factor, drawn for each interval between ``D2L_EXT_SLOW_CLOCK_RANGE`` (default ``1,3``) with the seed
  ``D2L_EXT_SLOW_CLOCK_SEED`` (default 0). ``time.perf_counter``, ``time.monotonic`` and ``time.time`` (and their
  ``_ns`` forms) share one stretched timeline; ``time.sleep`` sleeps as asked, and the clocks report its interval
  stretched like any other. torch is not imported.
"""

from __future__ import annotations

import os

MODE = os.environ.get("D2L_EXT_PRETEND", "")


def install_slow_clock(seed: int, low: float, high: float) -> None:
    """Replace the clocks of ``time`` with ones that report each interval stretched by a factor in [low, high]."""
    import random
    import threading
    import time

    real = time.perf_counter
    rng = random.Random(seed)
    lock = threading.Lock()
    state = {"real": real(), "stretched": 0.0}  # the last real reading, and the stretched time elapsed since start
    bases = {"perf_counter": real(), "monotonic": time.monotonic(), "time": time.time()}

    def elapsed() -> float:
        with lock:
            now = real()
            state["stretched"] += (now - state["real"]) * rng.uniform(low, high)
            state["real"] = now
            return state["stretched"]

    def clock(name: str):
        base = bases[name]
        return lambda: base + elapsed()

    def clock_ns(name: str):
        base = bases[name]
        return lambda: round((base + elapsed()) * 1e9)

    for name in bases:
        setattr(time, name, clock(name))
        setattr(time, f"{name}_ns", clock_ns(name))
    time.real_perf_counter = real  # pyright: ignore[reportAttributeAccessIssue]  # a new attribute, for tests


if MODE == "slow-clock":
    low, high = (float(x) for x in os.environ.get("D2L_EXT_SLOW_CLOCK_RANGE", "1,3").split(","))
    if not 1 <= low <= high:
        raise SystemExit(f"D2L_EXT_SLOW_CLOCK_RANGE: expected 'low,high' with 1 <= low <= high, not {low},{high}")
    install_slow_clock(int(os.environ.get("D2L_EXT_SLOW_CLOCK_SEED", "0")), low, high)
elif MODE:
    import torch
    from torch.torch_version import TorchVersion

    if MODE == "cpu-build":

        def _not_compiled(*args, **kwargs):
            raise AssertionError("Torch not compiled with CUDA enabled")

        torch.__version__ = TorchVersion(torch.__version__.split("+")[0] + "+cpu")
        torch.version.cuda = None
        torch.backends.cuda.is_built = lambda: False
        torch.cuda._lazy_init = _not_compiled
        torch.accelerator.current_accelerator = lambda check_available=False: None
    elif MODE == "gpu":
        torch.cuda.is_available = lambda: True
        torch.cuda.device_count = lambda: 1
        torch.accelerator.is_available = lambda: True
        torch.accelerator.device_count = lambda: 1
        torch.accelerator.current_accelerator = lambda check_available=False: torch.device("cuda")
        torch.accelerator.current_device_index = lambda: 0
    else:
        raise SystemExit(f"D2L_EXT_PRETEND={MODE!r}: expected 'cpu-build', 'gpu' or 'slow-clock'")
