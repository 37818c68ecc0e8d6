"""d2l_ext.compat: the oldest torch, the torch APIs each chapter uses, and the line an old torch gets."""

from __future__ import annotations

import json

import pytest
import torch

from d2l_ext import compat, doctor


def write_notebook(folder, name, sources):
    notebook = {"cells": [{"cell_type": "code", "source": s, "metadata": {}, "outputs": []} for s in sources],
                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (folder / f"{name}.ipynb").write_text(json.dumps(notebook))


def test_names_follow_imports_and_aliases_across_cells():
    sources = ["import torch\nfrom torch import nn\nimport torch.distributed as dist\n%matplotlib inline",
               "!nvidia-smi\nlayer = nn.Linear(2, 2)\ndist.all_reduce(x)\n"
               "torch.cuda.get_device_properties(0).total_memory",
               "from torch.profiler import profile as p"]
    assert compat.used_names(sources) == {
        "torch", "torch.nn", "torch.distributed", "torch.nn.Linear", "torch.distributed.all_reduce",
        "torch.cuda", "torch.cuda.get_device_properties",  # .total_memory belongs to what the call returns
        "torch.profiler.profile"}


def test_every_api_the_chapters_call_exists_in_this_torch():
    apis = compat.chapter_apis()
    assert "torch.accelerator.current_accelerator" in apis["01_devices"]
    assert "torch.nn.parallel.DistributedDataParallel" in apis["scripts/ddp_train.py"]
    assert compat.missing_apis() == {}
    assert compat.torch_check() is None  # 2.14.1, with every API present


def test_an_api_missing_from_torch_names_the_chapters_that_use_it(monkeypatch, tmp_path):
    write_notebook(tmp_path, "01_devices", ["import torch\ntorch.accelerator.current_accelerator()"])
    write_notebook(tmp_path, "02_tensors", ["import torch\nx = torch.ones(2)"])
    monkeypatch.delattr(torch.accelerator, "current_accelerator")  # as in torch releases before it existed
    assert compat.missing_apis(tmp_path) == {"torch.accelerator.current_accelerator": ["01_devices"]}
    line = compat.torch_check("2.5.1", tmp_path)
    assert line is not None and "\n" not in line
    assert line.startswith("torch 2.5.1 is older than 2.11, the oldest this course is tested with; "
                           "it lacks torch.accelerator.current_accelerator, so these will fail: 01_devices.")
    assert "pip install --upgrade torch torchvision" in line
    assert "torch check: torch " in doctor.torch_line(tmp_path) and "01_devices" in doctor.torch_line(tmp_path)


def test_an_old_torch_with_every_api_is_told_it_is_untested(tmp_path):
    write_notebook(tmp_path, "02_tensors", ["import torch\nx = torch.ones(2)"])
    line = compat.torch_check("2.10.0+cu126", tmp_path)
    assert line is not None and "older than 2.11" in line and "untested" in line
    assert compat.torch_check("2.11.0+cu128", tmp_path) is None


@pytest.mark.parametrize(("text", "expected"), [("2.11.0+cu128", (2, 11)), ("2.6.0a0", (2, 6)), ("3.0", (3, 0))])
def test_versions(text, expected):
    assert compat.version_tuple(text) == expected
