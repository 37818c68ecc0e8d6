"""tests/envs/colab.txt (Colab's stack for make test-colab), the tool that writes it, and the Python it needs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tools.envs import colab
from tools.envs.colab import COLAB_PACKAGES, TARGET, TEST_TOOLS, colab_python, colab_requirements, pins

REPO = Path(__file__).resolve().parent.parent

# the lines of Colab's pip-freeze.gpu.txt (googlecolab/backend-info, commit a724079 of 2026-08-19) that matter,
# with some of the 700 others around them, in the file's own spellings
FREEZE = """\
absl-py==1.4.0
ipykernel==6.17.1
ipython==7.34.0
ipywidgets==7.7.1
jupyter_client==7.4.9
jupyter_kernel_gateway @ git+https://github.com/googlecolab/kernel_gateway@b134e9945df25c2dcb98ade9129399be10788671
matplotlib==3.10.0
matplotlib-inline==0.2.2
numba==0.61.2
numba-cuda==0.22.2
numpy==2.1.3
pandas==2.2.3
pillow==11.3.0
psutil==5.9.5
requests==2.32.4
scipy==1.16.3
torch==2.11.0+cu128
torchvision==0.26.0+cu128
"""


def test_the_tool_keeps_colabs_versions_and_our_test_tools():
    requirements = (REPO / "requirements-dev.txt").read_text()
    text = colab_requirements(FREEZE, requirements, "commit a724079 of 2026-08-19", "3.13.15")
    written = pins(text)
    assert written["torch"] == "2.11.0" and written["torchvision"] == "0.26.0"  # +cu128 dropped: PyPI's wheel
    assert written["jupyter-client"] == "7.4.9" and written["ipywidgets"] == "7.7.1"
    assert written["numba"] == "0.61.2" and written["numba-cuda"] == "0.22.2"  # chapter 12's simulator
    assert all(written[tool] == pins(requirements)[tool] for tool in TEST_TOOLS)
    assert colab_python(text) == "3.13"
    assert len(written) == len(COLAB_PACKAGES) + len(TEST_TOOLS)


def test_a_list_without_torch_is_refused():
    with pytest.raises(ValueError, match="no torch"):
        colab_requirements(FREEZE.replace("torch==2.11.0+cu128\n", ""), "", "x", "3.13.15")


def test_the_committed_list_is_what_the_tool_writes():
    committed = TARGET.read_text()
    assert committed.startswith("# Colab's GPU runtime")
    written = pins(committed)
    requirements = pins((REPO / "requirements-dev.txt").read_text())
    # the test tools follow requirements-dev.txt: bump them together
    # (python -m tools.envs.colab freeze rewrites the list)
    assert {tool: written[tool] for tool in TEST_TOOLS} == {tool: requirements[tool] for tool in TEST_TOOLS}
    assert sorted(written) == sorted([*map(str.lower, COLAB_PACKAGES), *TEST_TOOLS])


def test_another_python_is_refused_with_one_line(capsys):
    with pytest.raises(SystemExit) as stop:
        colab.interpreter(sys.executable, "2.7")
    message = str(stop.value)
    assert "needs Colab's Python 2.7" in message and "make test-colab PYTHON=python2.7" in message
    assert "\n" not in message
    with pytest.raises(SystemExit, match="python9.9 was not found"):
        colab.interpreter("python9.9", "9.9")
    assert colab.interpreter(sys.executable, f"{sys.version_info[0]}.{sys.version_info[1]}") == sys.executable
