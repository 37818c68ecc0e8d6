"""Run All twice in one kernel: the second run must print the compared outputs that are stored.

A learner re-runs a notebook in the kernel they already have. A cell that prints random numbers without setting
its seed, or that depends on what a later cell left behind, prints something else the second time, and the stored
output no longer teaches what the prose says. nbval runs each notebook once in a fresh kernel; this runs every
notebook top to bottom twice in one kernel and compares the second run with the stored outputs, with the same
sanitizing and tolerance as the harness (cells tagged nbval-ignore-output are not compared, as in nbval).

Two notebooks run at once, each kernel with one thread (RUN_TWICE_WORKERS=1: one at a time, default threads).

Usage: python -m tools.outputs.twice [notebooks or folders ...]; exit status 1 if a compared output differs.
"""

from __future__ import annotations

import copy
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import nbformat
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient
from nbval.kernel import CURRENT_ENV_KERNEL_NAME, NbvalKernelspecManager

from tests.nbval_harness import (
    BUILD_METADATA_KEY,
    compared_cell,
    outputs_match,
    should_compare,
    tolerance_for,
    torch_build,
)
from tools.outputs.refresh import notebooks, sanitize


def run_differences(path: Path, environment: dict[str, str] | None = None,
                    compare_first: bool = False) -> list[tuple[int, int, str, str, str]]:
    """Run ``path`` twice in one kernel (its environment: this one plus ``environment``); return, for each compared
    cell whose output differs from the stored one in the second run (and, with ``compare_first``, in the first),
    (run, code cell index, its first line, the stored text, the fresh text), texts sanitized."""
    notebook = nbformat.read(path, as_version=4)
    stored = [copy.deepcopy(cell.get("outputs")) for cell in notebook.cells]
    kernel = KernelManager(kernel_name=CURRENT_ENV_KERNEL_NAME, kernel_spec_manager=NbvalKernelspecManager())
    client = NotebookClient(notebook, km=kernel, timeout=600, allow_errors=True,
                            resources={"metadata": {"path": str(path.parent)}})
    found = []
    # as the harness decides under nbval: device-dependent cells are not compared on a machine with a GPU, nor
    # build-dependent ones under another torch build than the one that made the stored outputs
    import d2l_ext

    has_accelerator = d2l_ext.num_gpus() > 0
    same_build = notebook.metadata.get(BUILD_METADATA_KEY, {}).get("torch_build") == torch_build()

    def compare(run: int) -> None:
        code_index = -1
        for cell, old in zip(notebook.cells, stored, strict=True):
            if cell.cell_type != "code":
                continue
            code_index += 1
            if cell.execution_count is None or not compared_cell(cell):
                continue
            if not should_compare(cell.metadata.get("tags", []), has_accelerator, same_build):
                continue
            if not outputs_match(cell.outputs, old or [], sanitize, tolerance_for(cell.metadata)):
                first_line = cell.source.strip().splitlines()[0][:70] if cell.source.strip() else ""
                found.append((run, code_index, first_line, _text(old or []), _text(cell.outputs)))

    try:
        with client.setup_kernel(env={**os.environ, **(environment or {})}):
            for run in (1, 2):
                for index, cell in enumerate(notebook.cells):
                    if cell.cell_type == "code":
                        client.execute_cell(cell, index)
                if run == 1 and compare_first:
                    compare(1)
            compare(2)
    finally:
        kernel.shutdown_kernel(now=True)
    return found


def second_run_differences(path: Path) -> list[str]:
    """Run ``path`` twice in one kernel; return a line for each compared cell whose second output differs."""
    return [f"{path} code cell {index}: {first_line}\n    stored:     {old[:240]!r}\n    second run: {new[:240]!r}"
            for _, index, first_line, old, new in run_differences(path)]


def _text(outputs: list) -> str:
    """Return the text of a cell's outputs, sanitized."""
    texts = [o.get("text") or o.get("evalue") or o.get("data", {}).get("text/plain", "") for o in outputs]
    return sanitize("".join(texts))


def _one_thread() -> None:
    """In a worker process: kernels started from here use one thread, so that parallel notebooks share the cores."""
    os.environ["OMP_NUM_THREADS"] = "1"


def main(args: list[str]) -> int:
    os.environ.setdefault("PYTHONHASHSEED", "0")
    workers = int(os.environ.get("RUN_TWICE_WORKERS", "2"))  # notebooks at once, as make test runs them
    paths = notebooks(args or ["notebooks"])
    found = []
    with ProcessPoolExecutor(workers, initializer=_one_thread if workers > 1 else None) as pool:
        for path, differences in zip(paths, pool.map(second_run_differences, paths), strict=True):
            print(f"{path}: {'same outputs the second time' if not differences else 'differs the second time'}",
                  flush=True)
            found += differences
    for line in found:
        print("  " + line)
    print(f"{len(found)} compared cell(s) print otherwise when run twice in one kernel")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
