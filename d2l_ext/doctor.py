"""What this machine can run: ``python -m d2l_ext.doctor`` (or ``make doctor``).

Prints the PyTorch build, the accelerators found (name, memory, compute capability), the driver and CUDA
versions where present, the host's memory, and, chapter by chapter, which sections will run here and which
will skip and why, and the memory it was measured to need (``make check-memory``). The chapter part reads the
notebooks beside this package: every cell guarded by ``d2l_ext.needs_gpus(n, kind=...)`` states what it needs,
so the report cannot drift from the chapters.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import psutil
import torch

from .compat import OLDEST_TORCH, torch_check
from .devices import accelerator_type, num_gpus
from .guard import _VENDOR, gpus_available

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
# each notebook's peak memory, measured by make check-memory (tools/checks/memory.py --record)
MEMORY_PEAKS = Path(__file__).resolve().parent / "memory_peaks.json"
NEEDS = re.compile(r"needs_gpus\(\s*(\d+)?\s*(?:,\s*kind\s*=\s*[\"'](\w+)[\"'])?\s*\)")


def build() -> str:
    """Return what the installed torch was built for: CUDA x.y, ROCm x.y, or the CPU only."""
    if torch.version.cuda:
        return f"CUDA {torch.version.cuda}"
    if getattr(torch.version, "hip", None):
        return f"ROCm {torch.version.hip}"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_built():
        return "Apple MPS"
    return "the CPU only"


def accelerators() -> list[str]:
    """Return one line per usable accelerator: name, memory and, for CUDA, compute capability."""
    kind = accelerator_type()
    if kind is None:
        return []
    lines = []
    for i in range(num_gpus()):
        if kind == "cuda":
            props = torch.cuda.get_device_properties(i)
            lines.append(f"cuda:{i} {props.name}, {props.total_memory / 2**30:.1f} GiB, "
                         f"compute capability {props.major}.{props.minor}, {props.multi_processor_count} SMs")
        else:
            lines.append(f"{kind}:{i} ({_VENDOR.get(kind, kind)})")
    return lines


def nvidia_driver() -> str | None:
    """Return the NVIDIA driver version that nvidia-smi reports, or None without nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None


def chapter_needs(path: Path) -> list[tuple[str, int, str | None]]:
    """Return (section heading, GPUs needed, device type or None) for each guarded cell of a notebook."""
    section, needs = path.stem, []
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            headings = [line[3:].strip() for line in source.splitlines() if line.startswith("## ")]
            section = headings[-1] if headings else section
        elif cell["cell_type"] == "code":
            for count, kind in NEEDS.findall(source):
                needs.append((section, int(count or 1), kind or None))
    return needs


def memory_line(name: str, peaks: dict, available: int) -> str | None:
    """Return a chapter's measured memory, and whether this machine has it available now, or None if unmeasured."""
    entry = peaks.get("notebooks", {}).get(name)
    if not entry or not entry.get("tree_peak_bytes"):
        return None
    kernel, tree = entry["kernel_peak_bytes"], entry["tree_peak_bytes"]
    line = f"    memory: kernel {kernel / 2**20:,.0f} MiB"
    line += f", {tree / 2**20:,.0f} MiB with the processes it starts" if tree > kernel * 1.05 else ""
    line += f" (make check-memory, {peaks.get('measured', '?')})"
    if tree > available:
        line += f"; only {available / 2**20:,.0f} MiB is available now: close other notebooks or programs first"
    return line


def chapter_lines(notebooks: Path = NOTEBOOKS, memory_peaks: Path = MEMORY_PEAKS) -> list[str]:
    """Return the per-chapter report: which guarded sections run here and which skip, and why, and the
    memory each chapter was measured to need."""
    # a chapter may go on in a second notebook: 05b_training_fast.ipynb
    chapters = sorted(notebooks.glob("[0-9][0-9]*_*.ipynb")) if notebooks.is_dir() else []
    if not chapters:
        return [f"  (no chapters found in {notebooks})"]
    try:
        peaks = json.loads(memory_peaks.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        peaks = {}
    available = psutil.virtual_memory().available
    lines = []
    for path in chapters:
        memory = memory_line(path.name, peaks, available)
        by_section: dict[str, list[tuple[int, str | None]]] = {}
        for section, count, kind in chapter_needs(path):
            by_section.setdefault(section, []).append((count, kind))
        skipping = {}
        for section, needs in by_section.items():
            missing = sorted({(count, kind) for count, kind in needs if not gpus_available(count, kind)},
                             key=lambda need: need[0])
            if missing:
                skipping[section] = ", ".join(
                    f"{count} {_VENDOR.get(kind, kind) + ' ' if kind else ''}GPU" + ("s" if count > 1 else "")
                    for count, kind in missing)
        if not skipping:
            lines.append(f"  {path.stem}: every section runs here")
        else:
            lines.append(f"  {path.stem}: runs, except {len(skipping)} section(s) with cells that skip:")
            lines += [f"    - {section}: needs {what}" for section, what in skipping.items()]
        lines += [memory] if memory else []
    return lines


def torch_line(notebooks: Path = NOTEBOOKS) -> str:
    """Return whether this torch is new enough: at least the oldest the course is tested with, and every torch
    API the chapters call present."""
    problem = torch_check(notebooks=notebooks)
    oldest = ".".join(map(str, OLDEST_TORCH))
    if problem:
        return f"torch check: {problem}"
    return f"torch check: torch {torch.__version__} is at least {oldest} (the oldest tested) and has every API " \
           "the chapters call"


def report(notebooks: Path = NOTEBOOKS) -> str:
    """Return the whole report as text."""
    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    memory = psutil.virtual_memory()
    found = accelerators()
    driver = nvidia_driver()
    lines = [
        "d2l_ext doctor: what this machine can run",
        f"Python {sys.version.split()[0]}; torch {torch.__version__}, built for {build()}; "
        f"torchvision {installed('torchvision')}; d2l {installed('d2l')}",
        "accelerators: " + ("none usable (every chapter runs on the CPU; GPU cells print why they skip)"
                            if not found else f"{len(found)}"),
        *[f"  {line}" for line in found],
        f"NVIDIA driver: {driver}" if driver else "NVIDIA driver: not found (no nvidia-smi)",
        f"host: {os.cpu_count()} CPU cores (PyTorch uses {torch.get_num_threads()} threads), "
        f"{memory.total / 2**30:.1f} GiB memory, {memory.available / 2**30:.1f} GiB available",
        torch_line(notebooks),
        "chapters:",
        *chapter_lines(notebooks),
    ]
    return "\n".join(lines)


def main() -> int:
    print(report())
    return 0


if __name__ == "__main__":
    sys.exit(main())
