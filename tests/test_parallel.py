"""d2l_ext.parallel: equal to chapter 6's cell, and correct (equal to single-device training)."""

from __future__ import annotations

import ast
import copy
import inspect
from pathlib import Path

import nbformat
import pytest
import torch
from torch import nn
from torch.nn.utils import parameters_to_vector

from d2l_ext import parallel

CHAPTER = Path(__file__).resolve().parent.parent / "notebooks" / "06_multi_gpu.ipynb"
NAMES = ["split_batch", "allreduce", "train_step"]


def function_sources(source: str) -> dict[str, str]:
    tree = ast.parse(source)
    return {node.name: ast.unparse(node) for node in tree.body if isinstance(node, ast.FunctionDef)}


def test_the_chapter_defines_the_same_functions():
    cells = [c.source for c in nbformat.read(CHAPTER, as_version=4).cells if c.cell_type == "code"]
    in_chapter = {}
    for source in cells:
        if "def split_batch" in source:
            in_chapter = function_sources(source)
    saved = function_sources(inspect.getsource(parallel))
    assert [n for n in NAMES if n in in_chapter] == NAMES
    for name in NAMES:
        assert in_chapter[name] == saved[name], f"{name} differs between the chapter and d2l_ext/parallel.py"


def test_allreduce_sums_in_place():
    tensors = [torch.tensor([1.0, 2.0]), torch.tensor([10.0, 20.0]), torch.tensor([100.0, 200.0])]
    parallel.allreduce(tensors)
    assert all(torch.equal(t, torch.tensor([111.0, 222.0])) for t in tensors)


def train_both(single, workers, batches):
    """Train ``single`` on one device and copies of it on ``workers`` CPU workers; return (single, a replica)."""
    devices = [torch.device("cpu")] * workers
    replicas = [copy.deepcopy(single) for _ in devices]
    optimizers = [torch.optim.SGD(r.parameters(), lr=0.5) for r in replicas]
    optimizer = torch.optim.SGD(single.parameters(), lr=0.5)
    for Xb, yb in batches:
        parallel.train_step(replicas, optimizers, Xb, yb, devices)
        nn.functional.cross_entropy(single(Xb), yb).backward()
        optimizer.step()
        optimizer.zero_grad()
    return single, replicas[-1]


def assert_same_parameters(a, b):
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.allclose(p, q, atol=1e-6)


def test_three_workers_equal_one_device():
    torch.manual_seed(0)
    X, y = torch.randn(96, 5), torch.randint(0, 3, (96,))
    single = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    initial = copy.deepcopy(single)
    single, replica = train_both(single, 3, zip(X.split(24), y.split(24), strict=True))
    assert_same_parameters(replica, single)
    trained, untrained = (parameters_to_vector(net.parameters()) for net in (single, initial))
    assert not torch.allclose(trained, untrained)  # and it did train


def test_a_batch_smaller_than_the_workers_gives_empty_parts():
    X, y = torch.arange(4.0).reshape(2, 2), torch.tensor([0, 1])
    parts = parallel.split_batch(X, y, [torch.device("cpu")] * 3)
    assert [len(yi) for _, yi in parts] == [1, 1, 0]
    assert torch.equal(torch.cat([Xi for Xi, _ in parts]), X)


def test_uneven_batches_still_equal_one_device():
    torch.manual_seed(0)
    single = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
    # smaller than, not a multiple of, and close to the number of workers
    batches = [(torch.randn(size, 5), torch.randint(0, 3, (size,))) for size in (2, 7, 3)]
    single, replica = train_both(single, 4, batches)
    assert_same_parameters(replica, single)


def test_a_section_is_the_lines_under_its_title_up_to_the_next():
    output = "4 processes\n-- by hand --\na\nb\n-- DTensor --\nc\n-- empty --\n"
    assert parallel.section(output, "by hand") == "a\nb"
    assert parallel.section(output, "DTensor") == "c"
    assert parallel.section(output, "empty") == ""
    with pytest.raises(KeyError, match=r"no part 'block' in the output; its parts: \['by hand', 'DTensor', 'empty'\]"):
        parallel.section(output, "block")
