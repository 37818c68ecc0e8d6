"""tools/checks/memory_nbval.py: check-memory's figures and verdicts in an nbval run that compares the outputs
(CI's matrix makes its first run so). Planted notebooks with stored outputs, run by pytest in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tools.checks import limits as lim

pytestmark = pytest.mark.launches  # each test starts pytest and a kernel

REPO = Path(__file__).resolve().parents[1]
MB = 10**6
ALLOCATE = "x = bytearray(60 * 10**6); x[::4096] = b'1' * len(x[::4096])"
CHILD = ("import subprocess, sys\n"
         "_ = subprocess.run([sys.executable, '-c', 'b = bytearray(150 * 10**6); b[::4096] = b\"1\" * len(b[::4096]); "
         "import time; time.sleep(0.5)'], check=True)")
OVER = "y = bytearray(500 * 10**6); y[::4096] = b'1' * len(y[::4096])"


def planted(path: Path, *cells: tuple[str, str]) -> Path:
    """A notebook whose code cells (source, stored stdout) hold their outputs, as a refreshed chapter does."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("a tiny notebook")]
    for source, printed in cells:
        cell = nbformat.v4.new_code_cell(source, execution_count=len(nb.cells))
        if printed:
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=printed)]
        nb.cells.append(cell)
    for index, cell in enumerate(nb.cells):
        cell.id = f"c{index}"
    nbformat.write(nb, path)
    return path


def nbval(tmp_path: Path, *arguments: str, timeout: int = 60, **environment: str
          ) -> tuple[subprocess.CompletedProcess, str]:
    """pytest --nbval with the plugin; ``timeout``: nbval's cell timeout, which a killed kernel's cell waits out."""
    report = tmp_path / "memory.md"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env", "-p", "tools.checks.memory_nbval",
         "-p", "no:cacheprovider", "-q", "--nbval-cell-timeout", str(timeout), "--memory-report", str(report),
         *arguments],
        cwd=tmp_path, capture_output=True, text=True, timeout=240,
        env={**os.environ, "PYTHONPATH": str(REPO), **environment})
    return done, report.read_text() if report.exists() else ""


@pytest.fixture
def fits(tmp_path):
    return planted(tmp_path / "fits.ipynb", (ALLOCATE, ""), (CHILD, ""), ("print('done')", "done\n"))


def test_a_notebook_within_binders_memory_passes_its_outputs_compared_and_its_peaks_named(tmp_path, fits):
    done, report = nbval(tmp_path, "-p", "no:xdist", "--memory-limit", str(400 * MB), str(fits))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "3 passed" in done.stdout
    row = next(line for line in report.splitlines() if "fits.ipynb" in line)
    cells = row.split(" | ")
    assert cells[2] == "cell 1 (c1)" and cells[4] == "cell 2 (c2)", row  # the 60 MB kept, the child's 150 MB
    kernel, tree = (int(cells[i].removesuffix(" MiB").replace(",", "")) for i in (1, 3))
    assert 60 < kernel < 400 and tree > kernel + 100, row
    assert row.endswith("| passes |")
    assert "1 of 1 notebooks within Binder's memory" in done.stdout


def test_a_kernel_over_its_budget_fails_the_run_though_every_output_matched(tmp_path, fits):
    done, report = nbval(tmp_path, "-p", "no:xdist", "--memory-budget", str(50 * MB), str(fits))
    assert done.returncode == 1
    assert "3 passed" in done.stdout and "failed" not in done.stdout.splitlines()[-1]
    assert "FAILED memory: " in done.stdout and "cell 1 (c1): the kernel holds" in done.stdout
    assert "over its budget of 48 MiB" in report


@pytest.mark.parametrize("no_limit", [True, False] if lim.choose_limit()[0] is not lim.Limit else [True])
def test_a_notebook_over_the_limit_fails_naming_its_cell(tmp_path, no_limit):
    over = planted(tmp_path / "over.ipynb", ("print('small')", "small\n"), (OVER, ""), ("print('never')", "never\n"))
    done, report = nbval(tmp_path, "-p", "no:xdist", "--memory-limit", str(400 * MB),
                         *(["--memory-no-limit"] if no_limit else []), str(over), timeout=5)
    assert done.returncode == 1
    line = next(line for line in done.stdout.splitlines() if line.startswith("FAILED memory: "))
    assert ("cell 2 (c2): the kernel and its processes went over the limit" in line) if no_limit \
        else ("killed" in line and "for memory" in line), line


def test_two_notebooks_at_once_are_refused(tmp_path, fits):
    done, _ = nbval(tmp_path, "-n", "2", str(fits))
    assert done.returncode != 0
    assert "runs one notebook at a time: add -p no:xdist" in done.stderr + done.stdout


def test_past_cis_deadline_a_notebook_is_named_not_run(tmp_path, fits):
    done, report = nbval(tmp_path, "-p", "no:xdist", str(fits), D2L_EXT_CI_DEADLINE="1")
    assert done.returncode == 0, done.stdout[-3000:]
    assert "3 skipped" in done.stdout
    assert "NOT RUN: fits.ipynb" in report or f"NOT RUN: {fits}" in report, report


def test_a_memory_dependent_cell_is_compared_except_in_binders_memory(tmp_path):
    """A cell tagged memory-dependent (chapter 9 starts 2 processes in Binder's 2 GB, not the stored 4) is not
    compared under the plugin's limit; without it, the harness compares it as any cell."""
    path = planted(tmp_path / "mem.ipynb", ("print('2 processes')", "4 processes\n"))
    nb = nbformat.read(path, as_version=4)
    nb.cells[1].metadata["tags"] = ["memory-dependent"]
    nbformat.write(nb, path)
    done, _ = nbval(tmp_path, "-p", "no:xdist", "-p", "tests.nbval_harness", str(path))
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-2000:]
    plain = subprocess.run([sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env", "-p",
                            "tests.nbval_harness", "-p", "no:cacheprovider", "-q", str(path)], cwd=tmp_path,
                           capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert plain.returncode == 1 and "1 failed" in plain.stdout, plain.stdout[-2000:]
