"""Chapter 12's GPU cell on Colab's T4 (sm_75), where no run of this course has been: its matmul, compiled for the
T4 by the same Triton on this CPU, fits the shared memory a T4 block gets (the one-GPU promise). Compiled as
d2l_ext.kernel_compile compiles, with sm_75 added to its targets in the child."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import nbformat
import pytest

from d2l_ext import kernel_gpu, kernels
from tools import REPO

# CUDA C++ Programming Guide, "Technical Specifications per Compute Capability": compute capability 7.5 gives a
# block at most 64 KB of shared memory, and 48 KB without opting in to more
T4_SHARED_DEFAULT = 48 * 1024

CHILD = """
import json, sys, tempfile
from pathlib import Path
from d2l_ext import kernel_compile
kernel_compile.TARGETS["sm_75"] = ("cuda", 75, 32)  # the T4: Turing, warps of 32
job = json.loads(sys.stdin.read())
with tempfile.TemporaryDirectory() as folder:
    sys.path.insert(0, folder)
    print(json.dumps(kernel_compile._compile_one(job, Path(folder), 0)))
"""


def cell_source(cell_id: str) -> str:
    """The kernel that a cell of chapter 12 defines (its source, without the lines that run it)."""
    notebook = nbformat.read(REPO / "notebooks" / "12_kernels.ipynb", as_version=4)
    source = next(cell.source for cell in notebook.cells if cell.get("id") == cell_id)
    return source.split("\n\n\nif ")[0] + "\n"


@pytest.mark.skipif(not kernels.triton_importable(), reason="Triton has Linux wheels only")
def test_the_gpu_cells_matmul_fits_a_t4_block():
    config = dict(kernel_gpu.MATMUL_CONFIG)
    job = {"source": cell_source("triton-matmul"),
           "signature": {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32",
                         "BM": "constexpr", "BN": "constexpr", "BK": "constexpr"},
           "constexprs": {name: config.pop(name) for name in ("BM", "BN", "BK")},
           "target": "sm_75", "aligned": [], **config}
    environment = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", CHILD], input=json.dumps(job), capture_output=True, text=True,
                          cwd=REPO, env=environment, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    facts = json.loads(done.stdout.splitlines()[-1])
    # Triton 3.8: 32,768 bytes (one 128 x 64 and one 64 x 128 float16 tile; Turing has no asynchronous copies to
    # pipeline), and no mma instruction listed: the T4's float16 products are not the A100's mma.sync
    assert 0 < facts["shared"] <= T4_SHARED_DEFAULT
    assert facts["registers"] <= 255  # what one thread may hold on any CUDA GPU
