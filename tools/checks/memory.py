"""Every notebook run as Binder runs it, in Binder's memory: ``make check-memory``.

Binder gives a learner 2 GiB for the Jupyter server, the kernel and every process the kernel starts. This tool
runs each notebook (chapters and solutions; the editions run the same code) the way a learner's Run All does: a
fresh kernel, driven by a notebook client, with no test runner in its memory. The kernel and every process it
starts run in a memory limit of 2 GiB less 200 MB, the 200 MB being left for the Jupyter server (the client here
stays outside the limit, in the server's share). Notebooks run one at a time.

The limit is the operating system's own where the machine lets us set one:
- a cgroup (version 1, or version 2 where the memory controller is delegated to us) made for each notebook;
- else ``systemd-run --user --scope -p MemoryMax=...`` (a desktop's systemd);
- else none: the tool says so in its first line, watches the kernel's process tree instead (the sum of each
  process's proportional set size, so that shared pages count once) and stops a notebook whose tree goes over.

Reported for each notebook, with the cell that brought each peak:
- the kernel's peak resident memory (``VmHWM``, shared library pages included), exact: it is reset before each
  cell through ``/proc/PID/clear_refs``; it must stay under 1.2 GB (issue 30);
- the peak of the kernel with every process it launched, sampled every 20 ms: their anonymous memory and the
  file pages they map (torch's libraries), each page counted once, as the cgroup counts them (without a
  cgroup: the tree's summed proportional set sizes). The file cache they only read or wrote is left out: the
  system drops it before the limit is reached. Where the tool may (as root), it drops the page cache before
  each notebook, so that the libraries a kernel loads are charged to it, as in a fresh Binder container; where
  it may not, pages cached before are charged elsewhere, and the figure is at least the kernel's own peak.

Each kernel starts with empty compile caches (TorchInductor's and Triton's, which ``torch.compile`` fills), as in
a fresh Binder container: with the caches a `make test` before had filled, chapter 7 measured 951 MiB; with empty
ones, 1,178 MiB, the compile workers it then starts included (2026-11-27).

It fails, naming the notebook and the cell, where a cell raises (cells tagged ``raises-exception`` excepted),
the kernel or a launched process is killed for memory, the tree goes over the limit, or the kernel over its
budget; and it names a notebook it could not run. ``--record`` writes the figures to
``d2l_ext/memory_peaks.json`` (which ``make doctor`` reads) and to the memory table of ``docs/chapters.md``.

Usage: python -m tools.checks.memory [NOTEBOOK or FOLDER ...] [--no-limit] [--record]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
from jupyter_client.manager import AsyncKernelManager
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

from tools import REPO
from tools.checks.limits import Limit, choose_limit, kill
from tools.deadline import not_run, past_deadline
from tools.outputs.run import MEMORY_CELL_TIMEOUT, notebook_client

BINDER = 2 * 2**30  # what Binder gives a learner's container: the server, the kernel and what it starts
SERVER_MARGIN = 200 * 10**6  # left for the Jupyter server
LIMIT = BINDER - SERVER_MARGIN  # the kernel and every process it starts
KERNEL_BUDGET = 1_200 * 10**6  # the kernel process alone (issue 30)
SAMPLE_S = 0.02
RECORD = REPO / "d2l_ext" / "memory_peaks.json"
README = REPO / "docs" / "chapters.md"  # the table of what each notebook needs
README_START, README_END = "<!-- memory: written by tools/checks/memory.py --record -->", "<!-- /memory -->"
MiB = 2**20
ANSI_CODE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # a traceback's colours


def mib(n: int | None) -> str:
    return "-" if n is None else f"{n / MiB:,.0f} MiB"


# ---------------------------------------------------------------------------------------------------- running


@dataclass
class Result:
    notebook: str
    limit: str = ""
    seconds: float = 0.0
    kernel_peak: int | None = None  # bytes
    kernel_cell: int | None = None
    tree_peak: int | None = None
    tree_cell: int | None = None
    problems: list[str] = field(default_factory=list)
    cells: dict[int | None, list[int]] = field(default_factory=dict)  # cell -> [kernel peak, tree peak]
    kept: dict[int | None, int] = field(default_factory=dict)  # cell -> the kernel's resident memory after it
    kernel_cell_name: str = "-"
    tree_cell_name: str = "-"

    @property
    def ok(self) -> bool:
        return not self.problems


class LimitedKernelManager(AsyncKernelManager):
    """A kernel manager whose kernel starts inside a limit."""

    limit_prefix: list[str] = []

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        return self.limit_prefix + super().format_kernel_cmd(extra_arguments)


def cell_name(notebook: nbformat.NotebookNode, index: int | None) -> str:
    if index is None:
        return "before the first cell"
    cell = notebook.cells[index]
    return f"cell {index} ({cell.get('id', '?')})"


def peak_cell(peaks: dict[int | None, list[int]], which: int) -> tuple[int | None, int | None]:
    """The cell that brought a peak (the first whose own peak is within 1% of it) and the peak in bytes.

    Memory a cell keeps shows in every later cell's peak too: the first cell that reached it is the one to read.
    """
    top = max(entry[which] for entry in peaks.values())
    if not top:
        return None, None
    first = next(cell for cell, entry in peaks.items() if entry[which] >= 0.99 * top)
    return first, top


def may_drop_page_cache() -> bool:
    return os.access("/proc/sys/vm/drop_caches", os.W_OK)


def drop_page_cache() -> None:
    """Empty the page cache (root only), so that what a kernel loads is charged to its limit, as on a fresh Binder."""
    if may_drop_page_cache():
        os.sync()
        try:
            Path("/proc/sys/vm/drop_caches").write_text("1")
        except OSError:
            pass


def reset_vmhwm(pid: int) -> bool:
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # 5: reset the peak resident set size to the current one
        return True
    except OSError:
        return False


def vmhwm(pid: int, field: str = "VmHWM") -> int | None:
    """The peak resident memory of a process (``field="VmRSS"``: its resident memory now)."""
    try:
        match = re.search(rf"^{field}:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    except OSError:
        return None
    return int(match[1]) * 1024 if match else None


def cold_caches(folder: str) -> dict[str, str]:
    """Environment variables that give a kernel (and what it starts) empty compile caches under ``folder``:
    TorchInductor's and Triton's, which ``torch.compile`` fills and reads, as a fresh Binder container has them."""
    return {"TORCHINDUCTOR_CACHE_DIR": os.path.join(folder, "inductor"),
            "TRITON_CACHE_DIR": os.path.join(folder, "triton")}


def problem(error: BaseException, where: str, killed: bool, over: bool, limit: int, timeout: int) -> str:
    """The line that says why a notebook's run failed: over the limit, killed for memory, dead, slow, or raised."""
    if over:
        return f"{where}: the kernel and its processes went over the limit ({mib(limit)}) and were stopped"
    if killed:
        return f"{where}: the system killed the kernel or a process it started for memory (the limit: {mib(limit)})"
    if isinstance(error, DeadKernelError):
        return f"{where}: the kernel died"
    if isinstance(error, CellTimeoutError):
        return f"{where}: no result in {timeout} s"
    last = [line for line in ANSI_CODE.sub("", str(error)).strip().splitlines() if line.strip()]
    return f"{where} raised: {last[-1] if last else type(error).__name__}"


def run_notebook(path: Path, make_limit: Callable[[int], Limit], limit: int = LIMIT,
                 kernel_budget: int = KERNEL_BUDGET, timeout: int = MEMORY_CELL_TIMEOUT,
                 drop_cache: bool = True) -> Result:
    """Run ``path`` top to bottom in a fresh kernel inside the limit; return its peaks and problems.

    ``drop_cache``: empty the page cache first where this process may (the tests do not, to spare the machine).
    """
    result = Result(notebook=str(path.relative_to(REPO) if path.is_relative_to(REPO) else path))
    try:
        notebook = nbformat.read(path, as_version=4)
    except Exception as error:  # a missing file, or not a notebook
        result.problems.append(f"could not run it: {type(error).__name__}: {error}")
        return result
    try:
        held = make_limit(limit)
    except OSError as error:
        result.problems.append(f"could not set the memory limit: {error}")
        return result
    result.limit = held.name
    if drop_cache:
        drop_page_cache()
    kernel = LimitedKernelManager(kernel_name="python3")
    kernel.limit_prefix = held.prefix()
    current: list[int | None] = [None]
    peaks = result.cells
    kept = result.kept
    stop = threading.Event()
    over: list[int | None] = []

    def sample() -> None:
        while not stop.wait(SAMPLE_S):
            now = held.usage()
            if now is None:
                continue
            cell = current[0]
            entry = peaks.setdefault(cell, [0, 0])
            entry[1] = max(entry[1], now)
            if not held.enforced and now > limit and not over:  # no limit of the system's: stop the tree here
                over.append(cell)
                kill(held.pids())

    def before(cell: nbformat.NotebookNode, cell_index: int, **_: object) -> None:
        if held.kernel_pid is None:  # the first code cell: the kernel runs, its process is known
            process = getattr(kernel.provisioner, "process", None)  # a local kernel's Popen
            held.started(process.pid if process is not None else 0)
            oom_before[0] = held.oom_kills()
            sampler.start()
        close_cell()
        current[0] = cell_index
        reset_vmhwm(held.kernel_pid)  # type: ignore[arg-type]

    def close_cell() -> None:
        if held.kernel_pid:
            entry = peaks.setdefault(current[0], [0, 0])
            entry[0] = max(entry[0], vmhwm(held.kernel_pid) or 0)
            kept[current[0]] = vmhwm(held.kernel_pid, "VmRSS") or 0
            # the tree holds the kernel: a lower charge means the kernel's pages were charged elsewhere
            entry[1] = max(entry[1], entry[0])

    caches = tempfile.TemporaryDirectory(prefix="d2l-check-memory-caches-")  # removed with the kernel
    start = time.perf_counter()
    oom_before = [0]
    sampler = threading.Thread(target=sample, daemon=True)
    kills = 0
    try:
        with notebook_client(notebook, path, kernel=kernel, timeout=timeout, record_timing=False,
                             allow_errors=False, on_cell_execute=before) as client:
            try:
                client.execute(env={**os.environ, **cold_caches(caches.name)})
                close_cell()
            except (CellExecutionError, CellTimeoutError, DeadKernelError, RuntimeError) as error:
                close_cell()
                result.problems.append(problem(error, cell_name(notebook, current[0]), held.oom_kills() >
                                               oom_before[0], bool(over), limit, timeout))
            finally:
                stop.set()
                if sampler.is_alive():
                    sampler.join()
                kills = held.oom_kills() - oom_before[0]
    finally:  # the kernel is shut down (notebook_client); then its limit goes
        held.close()
        caches.cleanup()
    result.seconds = time.perf_counter() - start
    if kills > 0 and not any("for memory" in p for p in result.problems):
        result.problems.append(f"the system killed {kills} process(es) for memory (the limit, {mib(limit)})")
    judge_peaks(result, notebook, kernel_budget)
    return result


def judge_peaks(result: Result, notebook: nbformat.NotebookNode, kernel_budget: int) -> None:
    """Name the cells that brought the kernel's and the tree's peaks, and fail a kernel over its budget
    (here and in tools/checks/memory_nbval.py, which measures in an nbval run)."""
    if result.cells:
        result.kernel_cell, result.kernel_peak = peak_cell(result.cells, 0)
        result.tree_cell, result.tree_peak = peak_cell(result.cells, 1)
    if result.kernel_peak is not None and result.kernel_peak > kernel_budget:
        result.problems.append(f"{cell_name(notebook, result.kernel_cell)}: the kernel holds "
                               f"{mib(result.kernel_peak)}, over its budget of {mib(kernel_budget)}")
    result.kernel_cell_name = cell_name(notebook, result.kernel_cell)
    result.tree_cell_name = cell_name(notebook, result.tree_cell)


# ---------------------------------------------------------------------------------------------------- report


def default_notebooks() -> list[Path]:
    folder = REPO / "notebooks"
    return sorted(folder.glob("*.ipynb")) + sorted((folder / "solutions").glob("*.ipynb"))


def expand(args: list[str]) -> list[Path]:
    found: list[Path] = []
    for arg in args:
        path = Path(arg).resolve()
        found += sorted(path.rglob("*.ipynb")) if path.is_dir() else [path]
    return [p for p in found if ".ipynb_checkpoints" not in p.parts]


def table(results: list[Result]) -> str:
    lines = ["| notebook | kernel peak | at | kernel + launched processes | at | seconds | result |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        verdict = "passes" if r.ok else "FAILS: " + "; ".join(r.problems)
        lines.append(f"| {r.notebook} | {mib(r.kernel_peak)} | {r.kernel_cell_name} | "
                     f"{mib(r.tree_peak)} | {r.tree_cell_name} | {r.seconds:.0f} | {verdict} |")
    return "\n".join(lines)


def record(results: list[Result], how: str) -> None:
    """Write the peaks to d2l_ext/memory_peaks.json and the memory table of docs/chapters.md."""
    data: dict[str, Any] = json.loads(RECORD.read_text()) if RECORD.exists() else {"notebooks": {}}
    data.update({"measured": datetime.date.today().isoformat(), "how": how, "limit_bytes": LIMIT,
                 "kernel_budget_bytes": KERNEL_BUDGET})
    for r in results:
        data["notebooks"][Path(r.notebook).name if "solutions" not in r.notebook else
                          "solutions/" + Path(r.notebook).name] = {
            "kernel_peak_bytes": r.kernel_peak, "tree_peak_bytes": r.tree_peak, "passes": r.ok}
    data["notebooks"] = dict(sorted(data["notebooks"].items()))
    RECORD.write_text(json.dumps(data, indent=1) + "\n")
    text = README.read_text(encoding="utf-8")
    if README_START in text:
        head, rest = text.split(README_START, 1)
        _, tail = rest.split(README_END, 1)
        README.write_text(head + README_START + "\n" + readme_table(data) + "\n" + README_END + tail,
                          encoding="utf-8")


def readme_table(data: dict) -> str:
    """The memory table of docs/chapters.md: each notebook's measured peaks."""
    lines = ["| Notebook | Kernel | Kernel and the processes it starts |", "|---|---|---|"]
    for name, entry in data["notebooks"].items():
        lines.append(f"| {name.removesuffix('.ipynb')} | {mib(entry['kernel_peak_bytes'])} | "
                     f"{mib(entry['tree_peak_bytes'])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", help="notebooks or folders (default: notebooks/ and solutions)")
    parser.add_argument("--limit", type=int, default=LIMIT, help="bytes for the kernel and what it starts")
    parser.add_argument("--kernel-budget", type=int, default=KERNEL_BUDGET, help="bytes for the kernel alone")
    parser.add_argument("--no-limit", action="store_true", help="watch the process tree instead of a limit")
    parser.add_argument("--record", action="store_true",
                        help="write the peaks to d2l_ext/memory_peaks.json and docs/chapters.md")
    parser.add_argument("--cells", action="store_true", help="print each cell's peaks too")
    parser.add_argument("--report", type=Path, default=REPO / "build" / "check-memory.md")
    args = parser.parse_args(argv)
    make_limit, how = choose_limit(args.no_limit)
    print(how, flush=True)
    print("the page cache is dropped before each notebook, so that what its kernel loads is charged to it"
          if may_drop_page_cache() else "the page cache cannot be dropped (not root): library pages cached "
          "before a notebook are not charged to it; its figure is at least its kernel's", flush=True)
    print(f"limit: {mib(args.limit)} for each kernel and the processes it starts (Binder's {mib(BINDER)} less "
          f"{SERVER_MARGIN // 10**6} MB for the Jupyter server); each kernel alone: {mib(args.kernel_budget)}",
          flush=True)
    paths = expand(args.notebooks) if args.notebooks else default_notebooks()

    def one(path: Path) -> Result:
        result = run_notebook(path, make_limit, args.limit, args.kernel_budget)
        state = "passes" if result.ok else "FAILS: " + "; ".join(result.problems)
        if args.cells:
            notebook = nbformat.read(path, as_version=4)
            for cell, (kernel_peak, tree_peak) in result.cells.items():
                print(f"  {cell_name(notebook, cell):<32} kernel {mib(kernel_peak):>10}, "
                      f"{mib(result.kept.get(cell)):>10} after it; "
                      f"with launched processes {mib(tree_peak):>10}")
        print(f"{result.notebook}: kernel {mib(result.kernel_peak)}, with launched processes "
              f"{mib(result.tree_peak)}, {result.seconds:.0f} s: {state}", flush=True)
        return result

    results, skipped = [], []
    for path in paths:
        if past_deadline():  # CI's budget is spent: the notebooks left are reported, neither passed nor failed
            skipped.append(path.name)
            continue
        results.append(one(path))
    left_out = not_run(", ".join(skipped)) if skipped else ""
    report = f"# make check-memory\n\n{how}\n\n{table(results)}\n" + (f"\n{left_out}\n" if skipped else "")
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(report, encoding="utf-8")
    print("\n" + table(results))
    failed = [r for r in results if not r.ok]
    if args.record:
        if failed:
            print("not recorded: a notebook failed")
        else:
            record(results, how)
            print(f"recorded in {RECORD.relative_to(REPO)} and {README.relative_to(REPO)}")
    if skipped:
        print(left_out)
    print(f"\n{len(results) - len(failed)} of {len(results)} notebooks pass ({args.report})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
