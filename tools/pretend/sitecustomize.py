"""Make torch report another build or a GPU, for tools/check_tags.py (never imported by the course itself).

Python imports this module at start-up when its folder is on PYTHONPATH. With D2L_EXT_PRETEND set it imports
torch and changes what torch *reports*, not what it computes:

- ``cpu-build``: a CPU-only wheel (macOS, or ``+cpu``): no CUDA version, and CUDA calls raise AssertionError.
- ``gpu``: one CUDA GPU is reported; anything that really touches it still fails, as there is none.
"""

from __future__ import annotations

import os

MODE = os.environ.get("D2L_EXT_PRETEND", "")

if MODE:
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
        raise SystemExit(f"D2L_EXT_PRETEND={MODE!r}: expected 'cpu-build' or 'gpu'")
