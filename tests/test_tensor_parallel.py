"""Chapter 9's tensor-parallel script: tensor parallelism by hand and with DTensor, sequence parallelism, a
transformer block split by heads, the collectives of a step, and FSDP2 x TP on 4 processes with its bytes per rank
beside d2l_ext.estimate_parallel_memory's.

notebooks/09_model_parallel.ipynb runs it once (cell tp-run, on 4 processes where the memory allows, else 2) and
shows each part of what it printed in its own section (d2l_ext.parallel.section), where nbval compares it. So on a
machine without a GPU these checks read those cells' stored outputs (kernel-free), as tests/test_sharding.py does
for chapter 8; with GPUs, where the cells are not compared, the script is launched here. Only the refusal of 3
processes (which do not divide the heads) is launched in any case."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
import torch

from d2l_ext import estimate_parallel_memory, launch, num_gpus
from tests.helpers import load_script

SCRIPT = Path(__file__).resolve().parent.parent / "notebooks" / "scripts" / "tensor_parallel.py"
CHAPTER = SCRIPT.parent.parent / "09_model_parallel.ipynb"


def test_a_shard_is_an_equal_slice_and_an_uneven_split_is_refused():
    shard = load_script("tensor_parallel").shard
    full = torch.arange(24.0).reshape(6, 4)
    assert torch.equal(shard(full, 0, 1, 3), full[2:4]) and torch.equal(shard(full, 1, 1, 2), full[:, 2:])
    with pytest.raises(ValueError, match="degree 4 does not divide dimension 0 of size 6"):
        shard(full, 0, 0, 4)


def test_a_degree_that_does_not_divide_the_heads_the_ffn_or_the_width_is_named():
    check_degree = load_script("tensor_parallel").check_degree
    for degree in (1, 2, 4):
        check_degree(degree)  # divides the 4 heads, the 64 FFN features and the 16 hidden ones
    with pytest.raises(ValueError, match="degree 3 does not divide the 4 heads"):
        check_degree(3)
    with pytest.raises(ValueError, match="degree 8 does not divide the 4 heads"):
        check_degree(8)
    with pytest.raises(ValueError, match="degree 4 does not divide the 34 FFN features"):
        check_degree(4, heads=8, ffn=34)
    with pytest.raises(ValueError, match="degree 4 does not divide the 18 hidden features"):
        check_degree(4, heads=8, hidden=18)
    with pytest.raises(ValueError, match="at least 1, not 0"):
        check_degree(0)


def test_a_mesh_must_use_every_rank_once():
    mesh_shape = load_script("tensor_parallel").mesh_shape
    assert mesh_shape(4, 2, 2) == (2, 2) and mesh_shape(8, 4, 2) == (4, 2)
    with pytest.raises(ValueError, match=r"a \(2, 2\) mesh needs 4 processes, and the world size is 2"):
        mesh_shape(2, 2, 2)
    with pytest.raises(ValueError, match="at least 1, not dp=0"):
        mesh_shape(4, 0, 4)


def saved_per_rank(output: str, label: str) -> list[int]:
    """The list of bytes per rank printed after ``label``."""
    found = re.search(re.escape(label) + r" \[([\d, ]+)\] B", output)
    assert found is not None, label
    return [int(x) for x in found[1].split(", ")]


@pytest.fixture(scope="module")
def output() -> str:
    """What the script printed in chapter 9: on 4 processes where the machine allows it (model_parallel_processes),
    else on 2; stored in the notebook and compared by nbval where there is no GPU, launched here where there is."""
    nproc, _ = launch.model_parallel_processes(num_gpus(), launch.available_memory())
    if num_gpus() > 0:
        return launch.torchrun(SCRIPT, nproc=nproc, timeout=300, echo=False)
    cells = [c for c in nbformat.read(CHAPTER, as_version=4).cells if c.cell_type == "code"
             and ('torchrun("scripts/tensor_parallel.py"' in c.source or "section(output," in c.source)]
    assert len(cells) >= 5, "the launch and a cell for each part: by hand, DTensor, block, sequence parallel, 2-D"
    assert sum('torchrun("scripts/tensor_parallel.py"' in c.source for c in cells) == 1, "one launch"
    for cell in cells:
        assert "nbval-ignore-output" not in cell.metadata.get("tags", []), "its output must be compared"
    return "\n".join("".join(o.get("text", "") for o in c.outputs if o.get("name") == "stdout") for c in cells)


def processes(output: str) -> int:
    found = re.match(r"(\d+) processes, backend", output)
    assert found is not None, output[:200]
    return int(found[1])


@pytest.mark.launches
def test_it_matches_one_process_and_counts_each_collective_and_byte(output):
    n = processes(output)
    assert n in (2, 4)
    if num_gpus() == 0:
        assert f"{n} processes, backend gloo, devices {['cpu'] * n}" in output
    # one all-reduce forward (g), one backward (f), none backward when the input needs no gradient
    assert "all-reduces: forward ['g forward'], backward ['f backward']; backward without an input gradient []" \
        in output
    # a batch of 8 x 16 float32 (512 B) on a ring of n: each rank sends 2 (n - 1) / n of it, 512 B on 2, 768 B on 4
    ring = 2 * (n - 1) * 512 // n
    sent = re.search(rf"bytes sent per all-reduce, by rank: (.*); 2 \(n - 1\) / n x 512 B = {ring} B", output)
    assert sent is not None and sent[1] == str([[ring, ring]] * n)
    assert output.count("same output as one process (within 1e-6): True") == 2  # by hand, and with DTensor
    assert "same gradients, input's included (within 1e-6): True" in output
    assert f"by hand: rank 0 holds w1 ({64 // n}, 16) of (64, 16), w2 (16, {64 // n}) of (16, 64)" in output
    assert f"DTensor: rank 0 holds the first weight's ({64 // n}, 16) of (64, 16); collectives forward " \
           "{'all_reduce': 1}" in output
    # sequence parallelism: the all-reduce becomes an all-gather before the MLP and a reduce-scatter after it,
    # and LayerNorm saves 1/n of the activations per rank: its input (8 x 8 x 16 float32) and its means and
    # reciprocal standard deviations (8 x 8 each), all split by tokens: 4,608 B in all
    assert "sequence parallel: collectives forward, TP {'all_reduce': 1}, TP+SP {'all_gather_into_tensor': 1, " \
           "'reduce_scatter_tensor': 1}" in output
    assert f"LayerNorm's saved activations per rank: TP 4,608 B, TP+SP {4608 // n:,} B (1/{n}: True)" in output
    assert "same output as one process, each rank its tokens (within 1e-6): True" in output
    # the transformer block: 4 heads of 4 features, 4 / n per rank, so q's weight keeps 16 / n of its output rows
    assert f"transformer block: rank 0 computes {4 // n} of 4 heads, q's weight ({16 // n}, 16) of (16, 16)" in output
    # 16 parameters: two LayerNorms, q, k, v, the output projection and the MLP's two layers, weight and bias each
    assert "same output, input's gradient and 16 parameters' gradients as one process (within 1e-6): True" in output
    # in floats, for a batch of 8 sequences of 8 tokens (b x s = 64 rows), on tp ranks: outside the split region
    # every rank saves the whole of LayerNorm 1's input (64 x 16) with its means and reciprocal deviations (64
    # each), q's, k's and v's shared input (64 x 16), LayerNorm 2's (64 x 16 + 2 x 64) and the MLP's input
    # (64 x 16): 4,352 floats. Inside it, split by tp: attention's q, k, v and output (64 x 16 each, by heads)
    # and its log-sum-exp (64 x 4 heads), GELU's input and output (64 x 64 each): 12,544 floats. So
    # (4,352 + 12,544 / tp) x 4 B: 67,584 B on one process, 42,496 B at tp = 2, 29,952 B at tp = 4. (The CPU's
    # attention kernel; CUDA's save other tensors beside q, k, v and the output, so only over gloo)
    if "backend gloo" in output:
        block_bytes = (4352 + 12544 // n) * 4
        assert saved_per_rank(output, "block's saved activations per rank") == [block_bytes] * n
        assert "on one process 67,584 B" in output
        script = load_script("tensor_parallel")
        batch = torch.empty(script.BATCH, script.SEQUENCE, script.HIDDEN)
        block = script.full_block(torch.device("cpu"))
        estimate = estimate_parallel_memory(block, batch, script.BLOCK_PLAN, dp=1, tp=n)
        assert estimate["activations"] == block_bytes  # chapter 8's count on one rank's shapes: the same tensors
    # a step's collectives, the same for any n: forward, one all-reduce after each row-split layer (the MLP's last;
    # the block's output projection and MLP); backward, one after each column-split layer's input gradient (the
    # MLP's first; the block's q, k, v and MLP), none in the MLP when the input needs no gradient, all four in the
    # block, whose LayerNorms' weights need theirs
    assert "collectives per step (CommDebugMode): forward / backward / backward, the input needing no gradient\n" \
           "  MLP:   {'all_reduce': 1} / {'all_reduce': 1} / {}\n" \
           "  block: {'all_reduce': 2} / {'all_reduce': 4} / {'all_reduce': 4}\n" in output


@pytest.mark.launches
def test_on_4_processes_fsdp2_times_tp_matches_one_process_with_the_formula_s_bytes_per_rank(output):
    if processes(output) != 4:
        pytest.skip("the script ran on 2 processes on this machine (model_parallel_processes): no (2, 2) mesh")
    # 2,112 elements split by both dimensions, the last bias (16) by "dp" only: (528 + 8) x 4 B
    assert "FSDP2 x TP on a (2, 2) mesh: parameters per rank [2144, 2144, 2144, 2144] B of 8,512 B; " \
           "Adam state per rank [4288, 4288, 4288, 4288] B" in output
    assert "formula: (2,112 split / 4 + 16 replicated / 2) x 4 B = 2,144 B per rank, Adam twice that" in output
    assert "same gradients as one process on the whole batch (within 1e-6): True" in output
    assert "LayerNorm's saved activations per rank: TP 4,608 B, TP+SP 1,152 B (1/4: True)" in output
    assert "transformer block: rank 0 computes 1 of 4 heads, q's weight (4, 16) of (16, 16)" in output
    assert "same output, input's gradient and 16 parameters' gradients as one process (within 1e-6): True" in output
    if "backend gloo" in output:  # 4,352 + 12,544 / 4 floats, on the CPU
        assert saved_per_rank(output, "block's saved activations per rank") == [29952] * 4
    assert "  block: {'all_reduce': 2} / {'all_reduce': 4} / {'all_reduce': 4}\n" in output  # the same on 4
    # gradients are split as their parameters; saved activations, for this rank's 8 rows of the batch of 16: the
    # first layer's input (8 x 16, whole on each tp rank), GELU's input and output (8 x 64 / 2 each), x 4 B
    assert "gradients per rank [2144, 2144, 2144, 2144] B; saved activations per rank [2560, 2560, 2560, 2560] B" \
           in output
    assert "activations: the input 8 x 16 whole, GELU's input and output 8 x 32 each (FFN / 2), x 4 B = 2,560 B" \
           in output
    # the measured bytes per rank beside the estimate for the same MLP and batch, within 10%: the Adam state
    # printed is its two buffers; the estimate adds the 4 step counters (16 B), 0.4%
    script = load_script("tensor_parallel")
    batch = torch.empty(2 * script.BATCH, script.HIDDEN)
    estimate = estimate_parallel_memory(script.full_mlp(torch.device("cpu")), batch, script.MLP_PLAN, dp=2, tp=2)
    measured = {"parameters": saved_per_rank(output, "parameters per rank"),
                "gradients": saved_per_rank(output, "gradients per rank"),
                "optimizer state": saved_per_rank(output, "Adam state per rank"),
                "activations": saved_per_rank(output, "B; saved activations per rank")}
    for row, per_rank in measured.items():
        assert all(m == pytest.approx(estimate[row], rel=0.10) for m in per_rank), (row, per_rank, estimate[row])




@pytest.mark.launches
def test_started_with_a_count_that_does_not_divide_the_heads_it_says_how_to_start_it():
    with pytest.raises(launch.LaunchError) as failed:
        launch.torchrun(SCRIPT, nproc=3, timeout=180, echo=False)
    assert "the tensor-parallel degree 3 does not divide the 4 heads; start it with a number of processes that " \
           "divides 4: torchrun --nproc-per-node=2 scripts/tensor_parallel.py" in failed.value.stderr
