"""Chapter 12, on a GPU: time the chapter's Triton add and matmul for real, against torch, in a child process.

Why a child: the chapter imported triton with ``TRITON_INTERPRET=1``, and a kernel compiled in that process
fails (triton 3.8.0: ``'ir.value' object has no attribute 'dtype'``), whether or not the interpreter ran. The
child imports triton without the variable and decorates the same sources afresh (as ``kernel_compile`` does).

``time_on_gpu(add_source, matmul_source)`` returns the seconds of each (``triton.testing.do_bench``'s median)
and whether each result equals torch's. Only a GPU that Triton targets (NVIDIA, or AMD under ROCm) runs it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from .kernel_compile import child_environment, import_file

ADD_ELEMENTS = 1 << 26  # 256 MiB per float32 tensor: far larger than any L2 cache
MATMUL_SIZE = 4096
# the matmul's tiles and launch: 32 KiB of shared memory on a T4 (sm_75, Triton 3.8), within its 48 KiB a block
# gets without opting in; 64 KiB on an A100, 96 KiB on an H100 (tests/test_ch12_t4.py)
MATMUL_CONFIG = {"BM": 128, "BN": 128, "BK": 64, "num_warps": 8, "num_stages": 3}
TIMEOUT = 300


def _child() -> None:
    import torch
    import triton
    from triton.testing import do_bench as bench

    def do_bench(fn) -> float:  # milliseconds, the median of do_bench's runs
        found = bench(fn)
        assert isinstance(found, float), found
        return found

    sources = json.load(sys.stdin)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "chapter_kernels.py"
        path.write_text("import triton\nimport triton.language as tl\n\n\n" + sources["add"] + "\n\n"
                        + sources["matmul"])
        module = import_file(path)
        add, matmul = module.add_kernel, module.matmul_kernel
        n, device = ADD_ELEMENTS, "cuda"
        x, y, out = (torch.randn(n, device=device) for _ in range(3))

        def run_add():
            add[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)

        add_seconds = do_bench(run_add) / 1e3
        add_equal = bool(torch.equal(out, x + y))
        torch_add = do_bench(lambda: torch.add(x, y, out=out)) / 1e3
        size = MATMUL_SIZE
        a, b = (torch.randn(size, size, device=device, dtype=torch.float16) for _ in range(2))
        c = torch.empty(size, size, device=device)

        def run_matmul():
            grid = (size // MATMUL_CONFIG["BM"], size // MATMUL_CONFIG["BN"])
            matmul[grid](a, b, c, size, size, size, **MATMUL_CONFIG)

        matmul_seconds = do_bench(run_matmul) / 1e3
        matmul_close = bool(torch.allclose(c, a.float() @ b.float(), atol=1e-2, rtol=1e-2))
        torch_matmul = do_bench(lambda: a @ b) / 1e3
    print(json.dumps({"device": torch.cuda.get_device_name(), "add": [add_seconds, torch_add, add_equal],
                      "matmul": [matmul_seconds, torch_matmul, matmul_close]}))


def time_on_gpu(add_source: str, matmul_source: str) -> dict:
    """Return {"device": name, "add": [Triton s, torch s, equal], "matmul": [Triton s, torch s, close]}, from
    a child process that runs the chapter's add (2**26 floats) and float16 matmul (4096) on GPU 0."""
    done = subprocess.run([sys.executable, "-m", "d2l_ext.kernel_gpu"], capture_output=True, text=True,
                          input=json.dumps({"add": add_source, "matmul": matmul_source}),
                          env=child_environment(), timeout=TIMEOUT)
    if done.returncode != 0:
        raise RuntimeError(f"the GPU run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


if __name__ == "__main__":
    _child()
