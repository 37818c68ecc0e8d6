"""tools/checks/tags.py finds an untagged output that depends on the torch build, and spares a tagged one."""

from __future__ import annotations

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook, new_output

from tools.checks import tags

pytestmark = pytest.mark.launches  # most tests here start processes (Pythons, kernels, torchrun)


def test_an_untagged_build_dependent_output_is_listed(tmp_path):
    def printing_the_cuda_version(tags):
        cell = new_code_cell("import torch\nprint(torch.version.cuda)", execution_count=1,
                             outputs=[new_output("stream", name="stdout", text=f"{torch_cuda}\n")])
        cell.metadata["tags"] = tags
        return cell

    import torch

    torch_cuda = torch.version.cuda  # what this build prints; a CPU-only build prints None
    notebook = new_notebook(cells=[printing_the_cuda_version([]), printing_the_cuda_version(["build-dependent"])])
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, tmp_path / "cells.ipynb")  # one notebook, one kernel: the test stays fast
    listed = tags.untagged_changes("cpu-build", [str(tmp_path)], workers=1)
    assert len(listed) == 1 and "cells.ipynb code cell 0 (output changed)" in listed[0], listed
