"""Run every notebook on a machine with a GPU and write what happened: `make check-gpu`.

CI has no GPU, so the course's GPU-only cells are checked there only statically. On a machine with a GPU (a
workstation, a cloud instance, Colab), this runs each notebook top to bottom in a fresh kernel, as nbval does,
and writes a markdown report to build/gpu-check.md:

- the GPU, its driver and the torch build;
- per notebook: seconds, and cells failed;
- per cell guarded by ``d2l_ext.needs_gpus``: ran, skipped (with the reason printed) or failed, and seconds,
  with the text it printed, so that prose predictions can be checked against a real run;
- compared outputs that differ from the stored ones although the cell is not tagged ``device-dependent``
  (those would fail `make test` on this machine: tag them, or print something device-neutral);
- the figures the prose relies on, measured here: host-to-device bandwidth from pageable and pinned memory
  against the link's peak, the chapter 4 ratio of a timing without and with synchronization, the speed-up
  of mixed precision on a matrix product.

Without a GPU it says so and exits 0. Exit status 1 if a cell failed.
Usage: python -m tools.envs.gpu [--report build/gpu-check.md] [notebooks ...]

Why this module: papermill or nbclient would run the notebooks (nbclient does, through tools/outputs/run.py);
classifying the guarded cells, the untagged outputs that differ on a GPU, and the report are ours.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

import d2l_ext
from d2l_ext import doctor
from tools import REPO
from tools.outputs.compare import DEVICE_DEPENDENT_TAG, compared_cell, outputs_match, tolerance_for
from tools.outputs.run import GPU_CELL_TIMEOUT, notebook_client, notebooks, outputs_text, sanitize

SKIP_PREFIX = "Skipped: this cell needs"
# peak of one direction of a PCIe link, GB/s, by generation, for x16 (after line coding)
PCIE_X16_PEAK_GBPS = {3: 15.8, 4: 31.5, 5: 63.0, 6: 121.0}


@dataclass
class CellResult:
    index: int  # code cell index, as nbval counts ("Cell N")
    guarded: bool
    status: str  # ran, skipped, failed
    seconds: float
    text: str = ""
    differs_untagged: bool = False


@dataclass
class NotebookResult:
    path: Path
    seconds: float = 0.0
    cells: list[CellResult] = field(default_factory=list)


def _seconds(cell) -> float:
    timing = cell.metadata.get("execution", {})
    try:
        start = datetime.datetime.fromisoformat(timing["iopub.execute_input"].replace("Z", "+00:00"))
        end = datetime.datetime.fromisoformat(timing["shell.execute_reply"].replace("Z", "+00:00"))
    except (KeyError, ValueError):
        return float("nan")
    return (end - start).total_seconds()


def run_notebook(path: Path) -> NotebookResult:
    """Execute ``path`` in a fresh kernel (not in place) and classify each code cell."""
    notebook = nbformat.read(path, as_version=4)
    stored = [copy.deepcopy(cell.get("outputs")) for cell in notebook.cells]
    start = time.perf_counter()
    with notebook_client(notebook, path, timeout=GPU_CELL_TIMEOUT, allow_errors=True, record_timing=True) as client:
        client.execute()
    result = NotebookResult(path, seconds=time.perf_counter() - start)
    code_index = -1
    for cell, old in zip(notebook.cells, stored, strict=True):
        if cell.cell_type != "code":
            continue
        code_index += 1
        tags = cell.metadata.get("tags", [])
        text = outputs_text(cell.outputs, sanitized=False)
        errored = any(o.get("output_type") == "error" for o in cell.outputs) and "raises-exception" not in tags
        guarded = "needs_gpus(" in cell.source
        status = "failed" if errored else "skipped" if guarded and text.startswith(SKIP_PREFIX) else "ran"
        differs = (DEVICE_DEPENDENT_TAG not in tags and compared_cell(cell) and bool(old)
                   and not outputs_match(cell.outputs, old, sanitize, tolerance_for(cell.metadata)))
        if guarded or errored or differs:
            result.cells.append(CellResult(code_index, guarded, status, _seconds(cell), text, differs))
    return result


def machine() -> list[str]:
    """Return report lines on the GPU, driver and torch build: make doctor's report, and cuDNN's version."""
    import torch

    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return [f"{datetime.date.today().isoformat()}, host {platform.node()}, cuDNN {cudnn}", "", "```",
            doctor.report(), "```"]


def pcie_peak() -> tuple[str, float | None]:
    """Return the current PCIe link of GPU 0 as nvidia-smi reports it and its peak GB/s in one direction."""
    if shutil.which("nvidia-smi") is None:
        return "unknown (no nvidia-smi)", None
    query = "pcie.link.gen.current,pcie.link.width.current"
    done = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits", "-i", "0"],
                          capture_output=True, text=True)
    try:
        generation, width = (int(x) for x in done.stdout.strip().split(","))
    except ValueError:
        return f"unknown ({done.stdout.strip() or done.stderr.strip()})", None
    peak = PCIE_X16_PEAK_GBPS.get(generation)
    return f"PCIe {generation}.0 x{width}", peak * width / 16 if peak else None


def figures() -> list[str]:
    """Measure the figures the chapters' prose relies on, on device 0."""
    import torch

    device = d2l_ext.try_gpu()
    lines = []
    nbytes = 256 * 2**20
    link, peak = pcie_peak()
    for pinned in (False, True):
        measured = d2l_ext.measure_copy(nbytes, "cpu", device, pinned=pinned, min_run_time=1.0)
        rate = d2l_ext.bandwidth(nbytes, measured) / 1e9
        share = f", {rate / peak:.0%} of the link's peak {peak:.1f} GB/s" if peak else ""
        memory = "pinned" if pinned else "pageable"
        lines.append(f"- host to device, {memory}, 256 MiB: {rate:.1f} GB/s ({link}{share})")

    x = torch.randn(4096, 4096, device=device)
    d2l_ext.synchronize(device)
    _ = x @ x  # warm-up: library set-up is not part of the measurement
    d2l_ext.synchronize(device)
    start = time.perf_counter()
    for _ in range(10):
        _ = x @ x
    returned = time.perf_counter() - start
    d2l_ext.synchronize(device)
    finished = time.perf_counter() - start
    lines.append(f"- chapter 4: ten 4096x4096 products return after {returned * 1e3:.2f} ms, finish after "
                 f"{finished * 1e3:.2f} ms (ratio {finished / returned:.0f}x: without a synchronize, a stopwatch "
                 "reads the first)")

    full = d2l_ext.measure(lambda: x @ x, min_run_time=1.0).median
    dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    with torch.autocast(device_type=device.type, dtype=dtype):
        mixed = d2l_ext.measure(lambda: x @ x, min_run_time=1.0).median
    lines.append(f"- mixed precision ({dtype}) on a 4096x4096 product: {full * 1e3:.2f} ms in float32, "
                 f"{mixed * 1e3:.2f} ms under autocast, speed-up {full / mixed:.1f}x")
    return lines


def report(results: list[NotebookResult], machine_lines: list[str], figure_lines: list[str]) -> str:
    lines = ["# make check-gpu", "", "## Machine", "", *machine_lines, "", "## Figures the prose relies on", "",
             *figure_lines, "", "## Notebooks", "",
             "| notebook | seconds | guarded cells ran | skipped | failed cells | untagged outputs that differ |",
             "|---|---|---|---|---|---|"]
    for r in results:
        guarded = [c for c in r.cells if c.guarded]
        lines.append(f"| {r.path} | {r.seconds:.0f} | {sum(c.status == 'ran' for c in guarded)} "
                     f"| {sum(c.status == 'skipped' for c in guarded)} | {sum(c.status == 'failed' for c in r.cells)} "
                     f"| {sum(c.differs_untagged for c in r.cells)} |")
    lines += ["", "## Cells", ""]
    for r in results:
        for c in r.cells:
            kind = "guarded" if c.guarded else "unguarded"
            extra = ", output differs from the stored one but the cell is not tagged device-dependent" \
                if c.differs_untagged else ""
            lines += [f"### {r.path} code cell {c.index}: {kind}, {c.status}, {c.seconds:.2f} s{extra}", "",
                      "```", c.text[-3000:] or "(no output)", "```", ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--report", default=str(REPO / "build" / "gpu-check.md"))
    parser.add_argument("targets", nargs="*", default=[str(REPO / "notebooks")])
    args = parser.parse_args(argv)
    if d2l_ext.num_gpus() == 0:
        print("make check-gpu: no GPU on this machine, nothing to check. Run it where torch sees a GPU "
              "(on Colab: Runtime > Change runtime type > T4 GPU; see the README).")
        return 0
    results = []
    for path in notebooks(args.targets):
        print(f"running {path} ...", flush=True)
        results.append(run_notebook(path))
        failed = [c.index for c in results[-1].cells if c.status == "failed"]
        print(f"  {results[-1].seconds:.0f} s" + (f", failed cells {failed}" if failed else ""), flush=True)
    text = report(results, machine(), figures())
    Path(args.report).parent.mkdir(parents=True, exist_ok=True)
    Path(args.report).write_text(text + "\n")
    print(f"report written to {args.report}")
    return 1 if any(c.status == "failed" for r in results for c in r.cells) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
