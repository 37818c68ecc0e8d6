"""Chapter 9's pipeline-parallel script, notebooks/scripts/pipelines.py (issue 31): five schedules of
torch.distributed.pipelining on 2 processes, each checked against one process, their orders against
d2l_ext.pipeline's simulator, and rank 0's saved activations in GPipe and 1F1B.

notebooks/09_model_parallel.ipynb runs it on 2 processes (cell pp-run) and nbval compares every line it prints, so
without a GPU these checks read that cell's stored output (kernel-free), as tests/test_sharding.py does; with GPUs
the script is launched here. The refusal of 3 processes is launched in any case; the helpers are tested without
processes."""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn

from d2l_ext import launch, num_gpus
from d2l_ext.pipeline import Op
from tests.helpers import SCRIPTS, load_script, printed_by

SCRIPT = SCRIPTS / "pipelines.py"
CHAPTER = SCRIPTS.parent / "09_model_parallel.ipynb"


@pytest.fixture(scope="module")
def output() -> str:
    return printed_by("pipelines.py", CHAPTER, 2)


@pytest.fixture(scope="module")
def script():
    return load_script("pipelines")


@pytest.mark.launches
def test_every_schedule_gives_the_gradients_and_loss_of_one_process(output):
    if num_gpus() == 0:
        assert "2 processes, backend gloo, devices ['cpu', 'cpu']" in output
    assert "model: 8 blocks of Linear(16, 16) + Tanh, MSE loss; a batch of 8 in 4 micro-batches of 2" in output
    # one stage per rank, or two, looping (rank r: r and r + 2)
    for line in ["GPipe on stages [[0], [1]]", "1F1B on stages [[0], [1]]",
                 "Interleaved1F1B on stages [[0, 2], [1, 3]]", "ZB-H1 (InterleavedZeroBubble) on stages [[0], [1]]",
                 "InterleavedZeroBubble on stages [[0, 2], [1, 3]]"]:
        assert f"{line}: same gradients and loss as one process (within 1e-6): True\n" in output, line
    assert "False" not in output


@pytest.mark.launches
def test_each_rank_runs_the_order_the_simulator_gives(output):
    assert "rank 0's order as run (F, B, W of a micro-batch, ' on its second stage); True: every rank's as " \
           "simulated" in output
    # GPipe: every forward, then every backward; 1F1B: rank 0 runs p - 1 = 1 forward ahead, then alternates
    assert "  gpipe: F0 F1 F2 F3 B0 B1 B2 B3: True\n" in output
    assert "  1f1b: F0 F1 B0 F2 B1 F3 B2 B3: True\n" in output
    # interleaved: p = 2 micro-batches at a time through each of the rank's stages (' = stage 2), 4 forwards ahead
    assert "  interleaved: F0 F1 F0' F1' F2 B0' F3 B1' F2' B0 F3' B1 B2' B3' B2 B3: True\n" in output
    # ZB-H1: rank 0 runs each W at once; the last rank (r = 1) one step late, as the simulator's zb-h1
    assert "  zb-h1: F0 F1 B0 W0 F2 B1 W1 F3 B2 W2 B3 W3: True\n" in output


@pytest.mark.launches
def test_gpipe_holds_every_micro_batch_on_rank_0_and_1f1b_two(output):
    # a stage of k blocks saves its input and each Tanh's output (the next Linear saves the same tensor): k + 1
    # tensors of 2 x 16 float32 per micro-batch, 5 x 128 B = 640 B for 4 blocks, 3 x 128 B = 384 B for 2
    assert "one micro-batch saves 640 B through 4 blocks, 384 B through 2 blocks; (blocks + 1) x 2 x 16 x 4 B: " \
           "640 B, 384 B\n" in output
    # GPipe: the m = 4 micro-batches before the first backward; 1F1B: min(p - r, m) = 2 on rank 0
    assert "saved activations on rank 0 at the peak: GPipe 4 x 640 B, 1F1B 2 x 640 B (ratio 2)\n" in output
    # interleaved: 4 forwards ahead (through 2 stages), then the 5th before the first backward; ZB-H1 holds a
    # micro-batch until its W, which rank 0 runs right after its B: 2, as 1F1B
    assert "rank 0's peak in micro-batches per stage: gpipe 4, 1f1b 2, interleaved 5, zb-h1 2; simulated in " \
           "flight: 4, 2, 5, 2\n" in output


@pytest.mark.launches
def test_its_lines_are_short(output):
    assert max(len(line) for line in output.splitlines()) <= 115


@pytest.mark.launches
def test_started_on_3_processes_it_says_how_to_start_it():
    with pytest.raises(launch.LaunchError) as failed:
        launch.torchrun(SCRIPT, nproc=3, timeout=180, echo=False)
    assert "start it on 2 processes: torchrun --nproc-per-node=2 scripts/pipelines.py" in failed.value.stderr
    assert failed.value.stdout == ""


def test_the_blocks_split_into_equal_stages_or_not_at_all(script):
    assert script.split_blocks(8, 4) == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    assert script.split_blocks(8, 1) == [range(0, 8)]
    for stages in (3, 0, 16):
        with pytest.raises(ValueError, match=f"8 blocks do not split into {stages} stages of equal size"):
            script.split_blocks(8, stages)


def test_stages_loop_over_the_ranks(script):
    assert [script.stages_of(rank, 2, 2) for rank in range(2)] == [[0, 2], [1, 3]]
    assert [script.stages_of(rank, 4, 3) for rank in range(4)] == [[0, 4, 8], [1, 5, 9], [2, 6, 10], [3, 7, 11]]
    with pytest.raises(ValueError, match=r"rank 2 is not in 0..1"):
        script.stages_of(2, 2, 1)
    with pytest.raises(ValueError, match="at least one stage, not 0"):
        script.stages_of(0, 2, 0)


def test_micro_batches_are_refused_where_torch_refuses_them(script):
    # measured on 2 processes, m = 1..8 (torch 2.14): each schedule's class raised ValueError exactly where this
    # does, and every other m gave one process's gradients
    plans = {plan.name: plan for plan in script.PLANS}
    assert script.check_microbatches(plans["GPipe"], 8, 4, 2) == 2  # the size of a micro-batch
    with pytest.raises(ValueError, match="a batch of 8 does not split into 3 equal micro-batches"):
        script.check_microbatches(plans["GPipe"], 8, 3, 2)
    with pytest.raises(ValueError, match="1F1B needs at least as many micro-batches as stages: 1 < 2"):
        script.check_microbatches(plans["1F1B"], 8, 1, 2)
    # the interleaved schedules run in rounds of m // p micro-batches: 5 on 2 ranks is 2 rounds, unequal
    with pytest.raises(ValueError, match=r"Interleaved1F1B needs micro-batches in a multiple of its rounds, "
                                         r"max\(1, m // p\) = 2: not 5"):
        script.check_microbatches(plans["Interleaved1F1B"], 10, 5, 2)
    with pytest.raises(ValueError, match="InterleavedZeroBubble needs micro-batches in a multiple"):
        script.check_microbatches(plans["InterleavedZeroBubble"], 14, 7, 2)
    # fewer micro-batches than stages: torch's interleaved 1F1B takes them (one round)
    assert script.check_microbatches(plans["Interleaved1F1B"], 3, 3, 2) == 1


def blocks(k: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(k)))


def test_saved_bytes_count_each_tensor_once_and_release_it_after_backward(script):
    model = blocks(3)
    counter = script.SavedBytes(list(model.parameters()))
    x = torch.randn(4, 16)
    with counter.hooks():
        first, second = model(x[:2]), model(x[2:])  # two micro-batches, views of one batch
    assert counter.now == counter.peak == 2 * (3 + 1) * 2 * 16 * 4  # parameters left out, shared tensors once
    first.sum().backward()
    assert counter.now == (3 + 1) * 2 * 16 * 4  # the first micro-batch's were released
    second.sum().backward()
    assert counter.now == 0 and counter.peak == 2 * 4 * 128
    assert all(p.grad is not None for p in model.parameters())  # the hooks gave autograd back its tensors


def test_a_saved_output_is_released_even_where_the_graph_was_retained(script):
    # the zero-bubble schedules compute the input's gradient with retain_graph=True: Tanh's saved output must not
    # keep itself alive through its own node once the graph is dropped
    model = blocks(1)
    counter = script.SavedBytes(list(model.parameters()))
    x = torch.randn(2, 16, requires_grad=True)
    with counter.hooks():
        y = model(x)
    torch.autograd.grad(y.sum(), x, retain_graph=True)
    assert counter.now == 2 * 128  # kept for the weights' gradient
    del y
    assert counter.now == 0


def test_a_stage_records_what_it_is_asked_to_run(script):
    calls = []
    stage = types.SimpleNamespace(forward_one_chunk=lambda i, *args, **kwargs: calls.append(("f", i)) or "out",
                                  backward_one_chunk=lambda i, *args, **kwargs: calls.append(("b", i)),
                                  backward_weight_one_chunk=lambda i, *args, **kwargs: calls.append(("w", i)))
    ran: list[Op] = []
    script.record(stage, 1, ran)
    assert stage.forward_one_chunk(3, (torch.zeros(1),), {}) == "out"
    stage.backward_one_chunk(3, full_backward=False)
    stage.backward_weight_one_chunk(3)
    assert ran == [Op("F", 3, 1), Op("B", 3, 1), Op("W", 3, 1)] and calls == [("f", 3), ("b", 3), ("w", 3)]
    assert script.notation([Op("F", 0), Op("F", 0, 1), Op("W", 2)]) == "F0 F0' W2"
