"""Find compared outputs that depend on the torch build or on the device but carry no tag saying so.

The stored outputs are made on a CPU-only machine with the CUDA build of torch. A cell whose output would differ
under a CPU-only build (macOS, ``+cpu`` wheels) must be tagged ``build-dependent``; one whose output would differ
on a machine with a GPU must be tagged ``device-dependent``: otherwise `make test` fails there on a correct
checkout. This runs the notebook suite twice with torch made to report otherwise (tools/checks/pretend/sitecustomize.py)
and lists the untagged cells whose compared output changed:

- ``cpu-build``: every untagged compared cell that fails (a changed output, or an exception) is listed.
- ``gpu``: torch reports one CUDA GPU that is not there, so the first cell that really uses it raises, and
  what follows in that notebook would run on a broken state: it is skipped. Only cells before that first
  exception whose output changed are listed: this finds outputs that depend on what torch *reports* (device
  counts, names, which branch a cell takes). What a GPU *computes* differently is found only on a GPU: there
  `make test` compares every untagged cell (`make check-gpu` runs the notebooks there).

Exit status 1 if a cell is listed. Usage: python -m tools.checks.tags [--mode cpu-build|gpu] [notebooks ...]

Why this module: no library runs nbval with torch made to report another build; this is what keeps a CPU-only
CI honest about what a GPU machine would compare.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest  # this module is also a pytest plugin, loaded with -p by untagged_changes

from tools import REPO
from tools.checks import PRETEND
from tools.outputs.run import NBVAL_OPTIONS, TEST_ENVIRONMENT  # as make test runs the notebooks

TAG_FOR = {"cpu-build": "build-dependent", "gpu": "device-dependent"}
RESULTS_VARIABLE = "D2L_EXT_CHECK_TAGS_RESULTS"


# notebooks in which a cell raised, in this process (with --dist loadfile a notebook runs whole in one process)
_RAISED: set[str] = set()


def pytest_runtest_setup(item):
    """pytest hook: with torch reporting a GPU, skip what follows a notebook's first exception. Only the cells
    before it are listed (see above), and the rest would run on a broken state: running them costs minutes."""
    if os.environ.get("D2L_EXT_PRETEND") == "gpu" and str(item.path) in _RAISED:
        pytest.skip("after this notebook's first exception under a pretended GPU: not listed, not run")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """pytest hook, in the process that ran the cell: record each failed notebook cell and how it failed."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed or type(item).__name__ != "IPyNbCell":
        return
    text = str(report.longrepr)
    how = "output" if "Cell outputs differ" in text else "exception"
    if how == "exception":
        _RAISED.add(str(item.path))
    error = next((line.strip() for line in reversed(text.splitlines()) if "Error" in line), text.strip()[-200:])
    with open(os.environ[RESULTS_VARIABLE], "a", encoding="utf-8") as file:
        file.write(json.dumps({"notebook": str(item.path), "cell": item.cell_num, "how": how,
                               "error": error if how == "exception" else ""}) + "\n")




def code_cells(path: Path) -> list:
    return [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


def failed_cells(environment: dict[str, str], targets: list[str], workers: int = 2) -> dict[str, dict[int, dict]]:
    """Run strict nbval with the harness under ``environment`` (added to this one); return, for each notebook
    (its path as pytest gave it), the code cells that failed: {cell index: {"how": "output" or "exception", ...}}.
    """
    results = Path(tempfile.mkstemp(prefix="check-cells-", suffix=".jsonl")[1])
    environment = {**os.environ, **environment, RESULTS_VARIABLE: str(results),
                   "PYTHONPATH": os.pathsep.join([str(PRETEND), str(REPO)])}
    # the harness by name: conftest.py loads it only for notebooks under the repository, and tests plant some elsewhere
    command = [sys.executable, "-m", "pytest", *NBVAL_OPTIONS, "-p", "tests.nbval_harness", "-p", "tools.checks.tags",
               "-p", "no:cacheprovider",
               *(["-n", str(workers), "--dist", "loadfile"] if workers > 1 else ["-p", "no:xdist"]), "-q", *targets]
    subprocess.run(command, cwd=REPO, env=environment, capture_output=True, text=True)
    failures: dict[str, dict[int, dict]] = {}
    for line in results.read_text().splitlines():  # with xdist a report may arrive twice
        failure = json.loads(line)
        failures.setdefault(failure["notebook"], {})[failure["cell"]] = failure
    results.unlink()
    return failures


def shown(notebook: str) -> str:
    """Return a notebook's path relative to the repository when it is inside it."""
    path = Path(notebook).resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else notebook


def untagged_changes(mode: str, targets: list[str], workers: int = 2) -> list[str]:
    """Run nbval with torch reporting ``mode``; return 'notebook cell N: how' for each untagged changed cell."""
    failures = {notebook: {index: failure["how"] for index, failure in cells.items()}
                for notebook, cells in failed_cells({**TEST_ENVIRONMENT, "D2L_EXT_PRETEND": mode}, targets,
                                                    workers).items()}
    listed = []
    for notebook, cells in sorted(failures.items()):
        first_exception = min((i for i, how in cells.items() if how == "exception"), default=None)
        for index, how in sorted(cells.items()):
            cell = code_cells(Path(notebook))[index]
            tags = cell.metadata.get("tags", [])
            if TAG_FOR[mode] in tags or "nbval-ignore-output" in tags:
                continue
            if mode == "gpu" and (how != "output" or (first_exception is not None and index > first_exception)):
                continue
            first_line = cell.source.strip().splitlines()[0][:70]
            listed.append(f"{shown(notebook)} code cell {index} ({how} changed): {first_line}")
    return listed


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--mode", choices=sorted(TAG_FOR), action="append")
    parser.add_argument("targets", nargs="*", default=["notebooks"])
    args = parser.parse_args(argv)
    status = 0
    for mode in args.mode or sorted(TAG_FOR):
        listed = untagged_changes(mode, args.targets)
        print(f"torch reporting {mode}: {len(listed)} untagged compared cell(s) changed"
              + (f"; tag them {TAG_FOR[mode]!r}:" if listed else ""))
        for line in listed:
            print("  " + line)
        status |= bool(listed)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
