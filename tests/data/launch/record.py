"""Record what torchrun writes on stderr when a rank fails, for tests/test_launch.py's recorded cases.

Each case runs the same two-rank script under torchrun with one Python and one colour setting, and writes the
raw stderr (colour codes included) to tests/data/launch/<name>.txt. Python 3.13 colours tracebacks when
FORCE_COLOR or PYTHON_COLORS=1 is set (Colab sets FORCE_COLOR), which once hid the failing rank's error.
The launch itself turns colour off (PYTHON_COLORS=0); the recordings are made without that, so that the
reader is tested on the worst case.

Usage: python tests/data/launch/record.py NAME PYTHON [VAR=VALUE ...]
  e.g. python tests/data/launch/record.py py313-force-color /path/to/python3.13 FORCE_COLOR=1
(PYTHON must have torch installed.)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from d2l_ext.launch import free_port

REPO = Path(__file__).resolve().parents[3]

SCRIPT = """\
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
dist.barrier()
if rank == 1:
    raise RuntimeError(f"rank {rank} fails on purpose after epoch 1")
dist.barrier()
dist.destroy_process_group()
"""

COLOUR_VARIABLES = ("FORCE_COLOR", "NO_COLOR", "PYTHON_COLORS", "TERM")


def record(name: str, python: str, settings: list[str]) -> Path:
    environment = {k: v for k, v in os.environ.items() if k not in COLOUR_VARIABLES}
    environment.update(dict(setting.split("=", 1) for setting in settings))
    environment.update({"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "PYTHONUNBUFFERED": "1"})
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "ranks.py"
        script.write_text(SCRIPT)
        command = [python, "-m", "torch.distributed.run", "--nproc-per-node=2", "--nnodes=1",
                   "--master-addr=127.0.0.1", f"--master-port={free_port()}", "--max-restarts=0", str(script)]
        done = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=120)
    version = subprocess.run([python, "-c", "import sys, torch; print(sys.version.split()[0], torch.__version__)"],
                             capture_output=True, text=True, check=True).stdout.split()
    header = (f"# recorded by tests/data/launch/record.py: Python {version[0]}, torch {version[1]}, "
              f"{' '.join(settings) or 'no colour variable set'}, exit code {done.returncode}\n")
    target = REPO / "tests" / "data" / "launch" / f"{name}.txt"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(header + done.stderr.replace(folder, "/tmp/RECORDING"))
    return target


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    print(record(sys.argv[1], sys.argv[2], sys.argv[3:]))
