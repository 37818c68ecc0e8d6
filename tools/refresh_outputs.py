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


def refresh(path: Path) -> None:
    """Execute ``path`` in place; raise if a cell fails (cells tagged raises-exception may)."""
    notebook = nbformat.read(path, as_version=4)
    kernel = KernelManager(kernel_name=CURRENT_ENV_KERNEL_NAME, kernel_spec_manager=NbvalKernelspecManager())
    client = NotebookClient(
        notebook, km=kernel, timeout=600, record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    notebook.metadata.pop("widgets", None)
    nbformat.write(notebook, path)


def main(args: list[str]) -> int:
    os.environ["PYTHONHASHSEED"] = "0"
    for path in notebooks(args or ["notebooks"]):
        start = time.perf_counter()
        print(f"running {path} ...", flush=True)
        refresh(path)
        print(f"  done in {time.perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
