"""Re-execute notebooks in place so that their stored outputs are fresh: `make outputs`.

Each notebook runs top to bottom in a new kernel of this environment (as nbval runs it), in its own
folder, with a fixed hash seed and without timing metadata, so that a diff shows only real changes: a compared
cell whose fresh output matches the stored one within the harness's tolerance, as printed (durations
included), keeps the stored output (its numbers moved by round-off on this CPU, not by a change).
The torch build is recorded in the notebook's metadata, so that the harness compares ``build-dependent`` cells
only under that build.
Usage: python -m tools.outputs.refresh notebooks [more notebooks or folders ...]

Why this module: `jupyter nbconvert --execute --inplace` would run the notebooks (nbclient does, through
tools/outputs/run.py); keeping a stored output that still matches within the tolerance is ours.
"""

from __future__ import annotations

import copy
import os
import sys
import time
from pathlib import Path
from typing import Any

import nbformat

from tools import REPO
from tools.outputs.compare import (
    BUILD_METADATA_KEY,
    compared_cell,
    outputs_match,
    tolerance_for,
    torch_build,
)
from tools.outputs.run import notebook_client, notebooks


def refresh(path: Path) -> int | None:
    """Execute ``path`` in place and return the kernel's peak resident memory in bytes (Linux), or None.

    Raises if a cell fails, except cells tagged raises-exception.
    """
    notebook = nbformat.read(path, as_version=4)
    stored = [copy.deepcopy(cell.get("outputs")) for cell in notebook.cells]
    with notebook_client(notebook, path, record_timing=False) as client:
        client.execute()
        peak = _peak_memory(client.km)
    notebook.metadata.pop("widgets", None)
    _relative_paths_in_tracebacks(notebook, REPO)
    kept = _keep_stored_within_tolerance(notebook, stored)
    notebook.metadata[BUILD_METADATA_KEY] = {"torch_build": torch_build()}
    nbformat.write(notebook, path)
    if kept:
        print(f"  kept the stored output of {kept} compared cell(s) matching the fresh one", flush=True)
    return peak


def _keep_stored_within_tolerance(notebook: nbformat.NotebookNode, stored: list) -> int:
    """Put back the stored outputs of compared cells that the fresh run matches within the tolerance.

    A cell that draws a figure always takes the fresh one: nbval does not compare images, so a match of its
    texts says nothing about the picture. The texts are compared as printed, not sanitized: the harness treats
    any two durations as equal, so a cell that prints "24.2 ms" would otherwise keep an old run's time beside a
    fresh figure, or a label the code no longer prints ("100 ms" after the code changed to 200 ms).
    """
    kept = 0
    for cell, old in zip(notebook.cells, stored, strict=True):
        if cell.cell_type != "code" or not old or not compared_cell(cell) or cell.outputs == old:
            continue
        if any(mime.startswith("image/") for output in cell.outputs + old for mime in output.get("data", {})):
            continue
        if outputs_match(cell.outputs, old, lambda text: text, tolerance_for(cell.metadata)):
            cell.outputs = old
            kept += 1
    return kept


def _peak_memory(kernel: Any) -> int | None:
    """Return the kernel process's peak resident memory (VmHWM) in bytes, where /proc tells it."""
    try:
        process: Any = getattr(kernel.provisioner, "process", None)  # a local kernel's Popen (None: AttributeError)
        status = Path(f"/proc/{process.pid}/status").read_text()
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
