"""Helpers shared by the tests: a script of notebooks/scripts loaded by path, what a chapter's launch printed, torch
made to report an accelerator, a free port. (Fixtures every test gets are in conftest.py.)"""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

import nbformat
import torch

from d2l_ext import launch, num_gpus

SCRIPTS = Path(__file__).resolve().parent.parent / "notebooks" / "scripts"
CHAPTER = SCRIPTS.parent / "08_memory.ipynb"


def load_script(name: str):
    """Import notebooks/scripts/NAME.py by path (it runs nothing on import)."""
    spec = importlib.util.spec_from_file_location(f"sharding_{name}", SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def printed_by(script: str, chapter: Path = CHAPTER, nproc: int = 2) -> str:
    """Return what ``script`` prints on ``nproc`` processes: launched on a machine with GPUs (NCCL, one GPU per rank
    when there are enough), else the stored output of ``chapter``'s cell that launches it, which nbval compares."""
    if num_gpus() > 0:
        return launch.torchrun(SCRIPTS / script, nproc=nproc, timeout=300, echo=False)
    cells = [c for c in nbformat.read(chapter, as_version=4).cells
             if c.cell_type == "code" and f'torchrun("scripts/{script}"' in c.source]
    assert len(cells) == 1, f"{chapter.name} should launch {script} in one cell, found {len(cells)}"
    assert "nbval-ignore-output" not in cells[0].metadata.get("tags", []), "its output must be compared"
    return "".join(o.get("text", "") for o in cells[0].outputs if o.get("name") == "stdout")


def fake_accelerator(monkeypatch, kind: str | None, count: int) -> None:
    """Make torch.accelerator report ``count`` devices of type ``kind`` (None: no accelerator)."""
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: kind is not None)
    monkeypatch.setattr(torch.accelerator, "current_accelerator",
                        lambda check_available=False: torch.device(kind or "cuda"))
    monkeypatch.setattr(torch.accelerator, "device_count", lambda: count if kind else 0)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
