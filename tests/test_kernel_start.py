"""tools/outputs/run.py starts a kernel again when it dies before it is ready (a port taken in between)."""

from __future__ import annotations

import contextlib

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from tools.outputs import run

pytestmark = pytest.mark.launches  # starts Jupyter kernels


def test_a_kernel_that_fails_to_start_is_started_again(tmp_path, monkeypatch):
    path = tmp_path / "one.ipynb"
    cell = new_code_cell("print(6 * 7)", outputs=[new_output("stream", name="stdout", text="42\n")])
    cell.execution_count = 1
    nbformat.write(new_notebook(cells=[cell]), path)
    real = run.NotebookClient.setup_kernel
    failures = iter([True])

    @contextlib.contextmanager
    def flaky(self, **kwargs):
        if next(failures, False):  # the first start fails, as a kernel whose port was taken does
            raise RuntimeError("Kernel died before replying to kernel_info")
        with real(self, **kwargs):
            yield

    monkeypatch.setattr(run.NotebookClient, "setup_kernel", flaky)
    assert run.run_differences(path, {}, compare_first=True) == []  # it ran, twice, and printed what is stored
    monkeypatch.setattr(run, "KERNEL_STARTS", 1)
    failures = iter([True])
    with pytest.raises(RuntimeError, match="Kernel died"):
        with run.started_kernel(nbformat.read(path, as_version=4), path, {}, starts=1):
            pass
