"""Re-execute notebooks in place so that their stored outputs are fresh: `make outputs`.

Each notebook runs top to bottom in a new kernel of this environment (as nbval runs it), in its own
folder, with a fixed hash seed and without timing metadata, so that a diff shows only real changes.
Usage: python tools/refresh_outputs.py notebooks [more notebooks or folders ...]
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import nbformat
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from nbval.kernel import CURRENT_ENV_KERNEL_NAME, NbvalKernelspecManager

REPO = Path(__file__).resolve().parent.parent


def notebooks(args: list[str]) -> list[Path]:
    """Return the notebooks named by ``args`` (files, or folders searched recursively)."""
    found: list[Path] = []
    for arg in args:
        path = Path(arg)
        if path.is_dir():
            found += sorted(p for p in path.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
        else:
            found.append(path)
    return found


def refresh(path: Path) -> int | None:
    """Execute ``path`` in place and return the kernel's peak resident memory in bytes (Linux), or None.

    Raises if a cell fails, except cells tagged raises-exception.
    """
    notebook = nbformat.read(path, as_version=4)
    kernel = KernelManager(kernel_name=CURRENT_ENV_KERNEL_NAME, kernel_spec_manager=NbvalKernelspecManager())
    client = NotebookClient(
        notebook, km=kernel, timeout=600, record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    try:
        client.execute()
        peak = _peak_memory(kernel)
    finally:
        if client.kc is not None:
            client.kc.stop_channels()
        kernel.shutdown_kernel(now=True)
    notebook.metadata.pop("widgets", None)
    _relative_paths_in_tracebacks(notebook, REPO)
    nbformat.write(notebook, path)
    return peak


def _peak_memory(kernel: KernelManager) -> int | None:
    """Return the kernel process's peak resident memory (VmHWM) in bytes, where /proc tells it."""
    try:
        status = Path(f"/proc/{kernel.provisioner.process.pid}/status").read_text()
    except (AttributeError, OSError):
        return None
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return None


def _relative_paths_in_tracebacks(notebook: nbformat.NotebookNode, root: Path) -> None:
    """Write paths inside the repository relative to it in stored tracebacks (cells tagged raises-exception)."""
    prefix = str(root.resolve()) + "/"
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                output["traceback"] = [line.replace(prefix, "") for line in output["traceback"]]


def main(args: list[str]) -> int:
    os.environ["PYTHONHASHSEED"] = "0"
    for path in notebooks(args or ["notebooks"]):
        start = time.perf_counter()
        print(f"running {path} ...", flush=True)
        peak = refresh(path)
        memory = f", kernel peak memory {peak / 2**20:.0f} MiB" if peak else ""
        print(f"  done in {time.perf_counter() - start:.1f} s{memory}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
