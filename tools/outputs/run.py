"""Run a notebook in a kernel of this environment, as nbval does, and say what differs from its stored outputs.

The one kernel runner of the tools: make outputs (refresh.py), check-timing --twice (checks/timing.py) and
make gpu-check (envs/gpu.py) start their kernels here. It also reads make test's settings (settings.mk: the
numeric pins, the thread rule, nbval's options) for the tools that run the notebooks another way.

nbclient runs the cells; what it does not do is ours: the kernel nbval would start (this environment's), the
sanitizing of tests/sanitize.cfg, and running a notebook twice in one kernel with each run compared within the
harness's tolerance (a learner re-running a notebook; a cell without its seed prints otherwise the second time).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import os
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
from jupyter_client.manager import KernelManager
from jupyter_core.utils import run_sync
from nbclient import NotebookClient
from nbval.kernel import CURRENT_ENV_KERNEL_NAME, NbvalKernelspecManager
from nbval.plugin import get_sanitize_patterns

from tools import REPO
from tools.outputs.compare import (
    BUILD_METADATA_KEY,
    compared_cell,
    outputs_match,
    should_compare,
    tolerance_for,
    torch_build,
)

SANITIZE_RULES = get_sanitize_patterns((REPO / "tests" / "sanitize.cfg").read_text(encoding="utf-8"))


def read_settings(path: Path = REPO / "tools" / "outputs" / "settings.mk") -> dict[str, str]:
    """Return settings.mk's variables, {NAME: VALUE}, as make reads its ``NAME ?= VALUE`` lines."""
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        match = re.match(r"^([A-Z_]+)\s*\?=\s*(.*)$", line)
        if match:
            found[match[1]] = match[2].strip()
    return found


SETTINGS = read_settings()
# make test's environment for the notebooks: the numeric pins and one thread a kernel
TEST_ENVIRONMENT = dict(item.split("=", 1) for item in shlex.split(SETTINGS["NUMERIC_ENV"] + " " +
                                                                     SETTINGS["TEST_THREADS"]))
NBVAL_OPTIONS = shlex.split(SETTINGS["NBVAL_OPTS"])
# The time limits of a notebook's cells and launches, in one place, each with its reason (a test checks every
# launch in the notebooks against LAUNCH_LIMIT: tests/test_notebooks.py):
# - CELL_TIMEOUT: a cell under make test, nbval, check-timing, check-tags and make outputs (settings.mk's
#   --nbval-cell-timeout, read here): a cell that hangs fails in that time instead of holding a run;
CELL_TIMEOUT = int(NBVAL_OPTIONS[NBVAL_OPTIONS.index("--nbval-cell-timeout") + 1])
# - LAUNCH_LIMIT: what the launches of one cell (d2l_ext.torchrun, torchrun_nodes, run_script, subprocess.run) may
#   wait in all, their timeout= summed: a minute below CELL_TIMEOUT, for the cell's own work, so that a launch that
#   hangs stops first and its own message (which node or rank stopped where, what each printed last) reaches the
#   reader and the test log, rather than the harness's "cell timed out";
LAUNCH_LIMIT = CELL_TIMEOUT - 60
# - MEMORY_CELL_TIMEOUT: a cell under make check-memory, which runs each notebook alone under Binder's memory
#   limit; twice CELL_TIMEOUT, as a cell near that limit runs slower (the system drops file cache that the
#   kernel then reads again) and a slow cell there is no memory failure;
MEMORY_CELL_TIMEOUT = 2 * CELL_TIMEOUT
# - GPU_CELL_TIMEOUT: a cell under make check-gpu, on a learner's GPU machine: three times CELL_TIMEOUT, as the first
#   run of a GPU cell there may compile or search kernels for minutes (cuDNN's benchmark, ROCm's MIOpen, Triton).
GPU_CELL_TIMEOUT = 3 * CELL_TIMEOUT


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


def sanitize(text: str) -> str:
    """Return ``text`` after tests/sanitize.cfg's rules, in order, as nbval applies them."""
    for regex, replace in SANITIZE_RULES:
        text = re.sub(regex, replace, text)
    return text


def outputs_text(outputs: list, sanitized: bool = True) -> str:
    """Return the text of a cell's outputs (streams, errors as ``Name: value``, plain-text results), stripped and,
    unless told otherwise, sanitized as nbval compares it."""
    parts = []
    for output in outputs:
        if output.get("output_type") == "stream":
            parts.append(output.get("text", ""))
        elif output.get("output_type") == "error":
            parts.append(f"{output.get('ename')}: {output.get('evalue')}")
        else:
            parts.append(output.get("data", {}).get("text/plain", ""))
    text = "".join(parts).strip()
    return sanitize(text) if sanitized else text


@contextlib.contextmanager
def notebook_client(notebook: nbformat.NotebookNode, path: Path, kernel: Any = None,
                    **options: Any) -> Iterator[NotebookClient]:
    """Yield an nbclient client for ``notebook`` (read from ``path``) on the kernel nbval would start (or on
    ``kernel``, a kernel manager of the caller's: check-memory's starts it inside a memory limit), in the notebook's
    folder; the kernel is shut down on the way out. ``options`` go to NotebookClient (timeout: make test's
    CELL_TIMEOUT). The one kernel runner of the tools: refresh, check-timing, check-gpu and check-memory use it."""
    if kernel is None:
        kernel = KernelManager(kernel_name=CURRENT_ENV_KERNEL_NAME, kernel_spec_manager=NbvalKernelspecManager())
    client = NotebookClient(notebook, km=kernel, **{"timeout": CELL_TIMEOUT, **options},
                            resources={"metadata": {"path": str(path.parent)}})
    try:
        yield client
    finally:
        if client.kc is not None:
            client.kc.stop_channels()
        if kernel.has_kernel:
            shutdown = kernel.shutdown_kernel
            (run_sync(shutdown) if inspect.iscoroutinefunction(shutdown) else shutdown)(now=True)


# how many times a kernel is started before its start-up failure is an error
KERNEL_STARTS = 3


@contextlib.contextmanager
def started_kernel(notebook: nbformat.NotebookNode, path: Path, env: dict[str, str],
                   starts: int = KERNEL_STARTS) -> Iterator[NotebookClient]:
    """Yield a client whose kernel (``notebook_client``, errors allowed) has started with ``env``. A kernel that dies
    before it is ready is started again, ``starts`` times in all: jupyter_client picks free ports, and the kernel
    binds them a moment later, so a process started in between may take one ("ZMQError: Address already in use",
    seen once in CI's matrix, where torchrun's processes take ports beside two kernels)."""
    for attempt in range(1, starts + 1):
        with contextlib.ExitStack() as stack:
            client = stack.enter_context(notebook_client(notebook, path, allow_errors=True))
            try:
                stack.enter_context(client.setup_kernel(env=env))
            except Exception:
                if attempt == starts:
                    raise
                continue  # the stack shuts that kernel down; a new one gets new ports
            yield client
            return


def run_differences(path: Path, environment: dict[str, str] | None = None,
                    compare_first: bool = False) -> list[tuple[int, int, str, str, str]]:
    """Run ``path`` twice in one kernel (its environment: this one plus ``environment``); return, for each compared
    cell whose output differs from the stored one in the second run (and, with ``compare_first``, in the first),
    (run, code cell index, its first line, the stored text, the fresh text), texts sanitized."""
    notebook = nbformat.read(path, as_version=4)
    stored = [copy.deepcopy(cell.get("outputs")) for cell in notebook.cells]
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
                found.append((run, code_index, first_line, outputs_text(old or []), outputs_text(cell.outputs)))

    with started_kernel(notebook, path, {**os.environ, **(environment or {})}) as client:
        for run in (1, 2):
            for index, cell in enumerate(notebook.cells):
                if cell.cell_type == "code":
                    client.execute_cell(cell, index)
            if run == 1 and compare_first:
                compare(1)
        compare(2)
    return found
