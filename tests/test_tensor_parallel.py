"""Chapter 9's tensor-parallel script (issue 31, started before the chapter): tensor parallelism by hand and with
DTensor, sequence parallelism, and FSDP2 x TP on 4 processes. Launched here on 2 and 4 processes, and on 3 (which
does not divide the MLP), until the chapter's notebook runs it and stores its output."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from d2l_ext import launch, num_gpus
from tests.test_sharding import load_script

SCRIPT = Path(__file__).resolve().parent.parent / "notebooks" / "scripts" / "tensor_parallel.py"


def test_a_shard_is_an_equal_slice_and_an_uneven_split_is_refused():
    shard = load_script("tensor_parallel").shard
    full = torch.arange(24.0).reshape(6, 4)
    assert torch.equal(shard(full, 0, 1, 3), full[2:4]) and torch.equal(shard(full, 1, 1, 2), full[:, 2:])
    with pytest.raises(ValueError, match="degree 4 does not divide dimension 0 of size 6"):
        shard(full, 0, 0, 4)


def test_on_2_processes_it_matches_one_process_and_counts_each_collective_and_byte():
    output = launch.torchrun(SCRIPT, nproc=2, timeout=180, echo=False)
    if num_gpus() == 0:
        assert "2 processes, backend gloo, devices ['cpu', 'cpu']" in output
    # one all-reduce forward (g), one backward (f), none backward when the input needs no gradient
    assert "all-reduces: forward ['g forward'], backward ['f backward']; backward without an input gradient []" \
        in output
    sent = re.search(r"bytes sent per all-reduce, by rank: (.*); 2 \(n - 1\) / n x 512 B = 512 B", output)
    assert sent is not None and sent[1] == "[[512, 512], [512, 512]]"  # a batch of 8 x 16 float32, ring of 2
    assert output.count("same output as one process (within 1e-6): True") == 2  # by hand, and with DTensor
    assert "same gradients, input's included (within 1e-6): True" in output
    assert "DTensor: rank 0 holds the first weight's (32, 16) of (64, 16); collectives forward {'all_reduce': 1}" \
        in output
    # sequence parallelism: the all-reduce becomes an all-gather before the MLP and a reduce-scatter after it,
    # and LayerNorm saves half the activations per rank: its input (8 x 8 x 16 float32) and its means and
    # reciprocal standard deviations (8 x 8 each), all split by tokens
    assert "sequence parallel: collectives forward, TP {'all_reduce': 1}, TP+SP {'all_gather_into_tensor': 1, " \
           "'reduce_scatter_tensor': 1}" in output
    assert "LayerNorm's saved activations per rank: TP 4,608 B, TP+SP 2,304 B (1/2: True)" in output
    assert "same output as one process, each rank its tokens (within 1e-6): True" in output


def test_on_4_processes_fsdp2_times_tp_matches_one_process_with_the_formula_s_bytes_per_rank():
    output = launch.torchrun(SCRIPT, nproc=4, timeout=240, echo=False)
    # 2,112 elements split by both dimensions, the last bias (16) by "dp" only: (528 + 8) x 4 B
    assert "FSDP2 x TP on a (2, 2) mesh: parameters per rank [2144, 2144, 2144, 2144] B of 8,512 B; " \
           "Adam state per rank [4288, 4288, 4288, 4288] B" in output
    assert "formula: (2,112 split / 4 + 16 replicated / 2) x 4 B = 2,144 B per rank, Adam twice that" in output
    assert "same gradients as one process on the whole batch (within 1e-6): True" in output
    assert "LayerNorm's saved activations per rank: TP 4,608 B, TP+SP 1,152 B (1/4: True)" in output


def test_started_with_a_count_that_does_not_divide_the_mlp_it_says_how_to_start_it():
    with pytest.raises(launch.LaunchError) as failed:
        launch.torchrun(SCRIPT, nproc=3, timeout=180, echo=False)
    assert "start it with a number of processes that divides 64: torchrun --nproc-per-node=2 " \
           "scripts/tensor_parallel.py" in failed.value.stderr
