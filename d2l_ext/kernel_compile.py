"""Chapter 12: compile Triton kernels for GPUs this machine does not have, and read facts off the output.

``compile_facts(jobs)`` compiles each job (a kernel's source, its argument types, a target such as ``"sm_90"``) in
one child process and returns what the compiler made of it: loads and stores by width, registers, shared memory,
Tensor Core instructions, the layout's elements per thread. Triton ships the tools it needs (``ptxas``,
``cuobjdump``), so no GPU, driver or CUDA toolkit is needed.

Why a child process: the chapter runs its kernels in Triton's interpreter (``TRITON_INTERPRET=1``). A function
decorated under the interpreter cannot be compiled, and after the interpreter has run, compiling in the same
process fails (triton 3.8.0: ``'ir.value' object has no attribute 'dtype'``). The child decorates the same source
afresh, without the variable. Its numbers are facts of the installed Triton: tag the cells that print them
``build-dependent``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

# the targets the chapter compiles for: GPUTarget(backend, arch, warp size)
TARGETS = {"sm_80": ("cuda", 80, 32), "sm_90": ("cuda", 90, 32), "gfx942": ("hip", "gfx942", 64)}
TARGET_NAMES = {"sm_80": "A100 (Ampere)", "sm_90": "H100 (Hopper)", "gfx942": "MI300X (CDNA 3)"}
COMPILE_TIMEOUT = 300  # seconds for one child; about 0.5 s a kernel here, plus 3 s to import triton

# an instruction, after its predicate (@%p1) if any
_MEMORY = re.compile(r"^\s*(?:@!?%\w+\s+)?(ld\.global[\w.]*|st\.global[\w.]*|global_load\w*|global_store\w*"
                     r"|buffer_load\w*|buffer_store\w*)", re.M)
_MMA = re.compile(r"\b(wgmma\.mma_async[\w.]*|mma\.sync[\w.]*|v_mfma\w*)")


@dataclass
class CompileJob:
    """One kernel to compile: its source (a ``@triton.jit`` function), argument types in Triton's notation
    (``"*fp32"``, ``"i32"``, ``"constexpr"``), constexpr values, the arguments declared divisible by 16."""

    source: str
    signature: dict[str, str]
    constexprs: dict[str, int]
    target: str = "sm_90"
    aligned: tuple[str, ...] = ()
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self):
        if self.target not in TARGETS:
            raise ValueError(f"unknown GPU target {self.target!r}: the chapter knows {', '.join(TARGETS)}")
        unknown = [name for name in self.aligned if name not in self.signature]
        if unknown:
            raise ValueError(f"aligned names {unknown} are not arguments of the kernel: {list(self.signature)}")


@dataclass
class Facts:
    """What the compiler made of one job: memory instructions and their counts, registers per thread,
    shared memory in bytes, matrix instructions, elements per thread of the first blocked layout."""

    target: str
    memory: dict[str, int] = field(default_factory=dict)
    registers: int = 0
    shared: int = 0
    mma: list[str] = field(default_factory=list)
    size_per_thread: list[int] = field(default_factory=list)

    def loads(self) -> dict[str, int]:
        """Return the load instructions and their counts."""
        return {k: v for k, v in self.memory.items() if "ld." in k or "load" in k}

    def mma_family(self) -> str:
        """Return the matrix instruction's family: "wgmma" (Hopper), "mma.sync" (Ampere), "MFMA" (AMD) or "none"."""
        names = " ".join(self.mma)
        for prefix, family in (("wgmma", "wgmma"), ("mma.sync", "mma.sync"), ("v_mfma", "MFMA")):
            if prefix in names:
                return family
        return "none"

    def stores(self) -> dict[str, int]:
        """Return the store instructions and their counts."""
        return {k: v for k, v in self.memory.items() if "st." in k or "store" in k}


def import_file(path: Path) -> ModuleType:
    """Return the module that the Python file ``path`` defines (triton reads a kernel's source from its file)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _found(pattern: str, text: str) -> str:
    """Return the first group of ``pattern`` in ``text``; raise ValueError naming it if it is not there."""
    match = re.search(pattern, text)
    if match is None:
        raise ValueError(f"the compiler's output has no {pattern!r}: another Triton version?")
    return match[1]


def _registers(asm: dict) -> int:
    """Registers per thread: cuobjdump's REG for a cubin, the VGPR count for AMD."""
    if "cubin" in asm:
        import triton

        tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        with tempfile.TemporaryDirectory() as folder:
            cubin = Path(folder) / "kernel.cubin"
            cubin.write_bytes(asm["cubin"])
            out = subprocess.run([str(tool), "-res-usage", str(cubin)], capture_output=True, text=True,
                                 check=True, timeout=60).stdout
        return int(_found(r"REG:(\d+)", out))
    return int(_found(r"\.vgpr_count:\s+(\d+)", asm["amdgcn"]))


def _compile_one(job: dict, folder: Path, index: int) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    path = folder / f"kernel_{index}.py"
    path.write_text("import triton\nimport triton.language as tl\n\n\n" + job["source"])
    kernel = getattr(import_file(path), _found(r"def (\w+)\(", job["source"]))
    names = list(job["signature"])
    attrs = {(names.index(arg),): [["tt.divisibility", 16]] for arg in job["aligned"]}
    source = ASTSource(kernel, job["signature"], job["constexprs"], attrs)
    compiled = triton.compile(source, target=GPUTarget(*TARGETS[job["target"]]),
                              options={"num_warps": job["num_warps"], "num_stages": job["num_stages"]})
    asm = compiled.asm
    text = asm.get("ptx") or asm["amdgcn"]
    layout = re.search(r"sizePerThread = \[([\d, ]+)\]", asm["ttgir"])
    return {"target": job["target"], "memory": dict(Counter(_MEMORY.findall(text))),
            "registers": _registers(asm), "shared": compiled.metadata.shared,
            "mma": sorted(set(_MMA.findall(text))),
            "size_per_thread": [int(n) for n in layout[1].split(",")] if layout else []}


def _child() -> None:
    jobs = json.load(sys.stdin)
    with tempfile.TemporaryDirectory() as folder:
        sys.path.insert(0, folder)
        facts = [_compile_one(job, Path(folder), i) for i, job in enumerate(jobs)]
    print(json.dumps(facts))  # the last line: anything the compiler printed comes before it


def source_of(kernel) -> str:
    """Return the source of a kernel (a ``@triton.jit`` function, interpreted or not, or a plain function)."""
    import inspect
    import textwrap

    return textwrap.dedent(inspect.getsource(getattr(kernel, "fn", kernel)))


def child_environment() -> dict[str, str]:
    """Return this process's environment without TRITON_INTERPRET, which would make the child interpret."""
    return {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


def compile_facts(jobs: list[CompileJob]) -> list[Facts]:
    """Return the compiler's facts for each job, compiled in one child process without the interpreter."""
    payload = json.dumps([job.__dict__ | {"aligned": list(job.aligned)} for job in jobs])
    done = subprocess.run([sys.executable, "-m", "d2l_ext.kernel_compile"], input=payload, capture_output=True,
                          text=True, env=child_environment(), timeout=COMPILE_TIMEOUT)
    if done.returncode != 0:
        raise RuntimeError(f"compiling failed:\n{done.stderr[-3000:]}")
    return [Facts(**facts) for facts in json.loads(done.stdout.splitlines()[-1])]


if __name__ == "__main__":
    _child()
