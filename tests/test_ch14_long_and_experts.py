"""Chapter 14 (long sequences and many experts): ring attention, zig-zag balance, Ulysses and expert parallelism,
each checked against one process and against closed forms (issue 48)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import pytest
import torch

from d2l_ext import context, diagrams_context, experts, launch
from d2l_ext.ranks import device_and_backend
from tests.helpers import load_script

matplotlib.use("Agg")
NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
SCRIPT = NOTEBOOKS / "scripts" / "long_and_experts.py"


def qkv(*shape: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g, dtype=torch.float64) for _ in range(3)]


def test_an_uneven_sequence_or_an_unknown_layout_is_named():
    with pytest.raises(ValueError, match="a sequence of 60 does not split evenly into 8 chunks"):
        context.positions(60, 4, 0, "zigzag")
    with pytest.raises(ValueError, match="a sequence of 10 does not split evenly into 4 chunks"):
        context.attention_work_per_rank(10, 4, "contiguous")
    with pytest.raises(ValueError, match="layout must be one of"):
        context.chunk_size(64, 2, "striped")
    assert context.chunk_size(60, 4) == 15  # 4 contiguous chunks do split 60


def test_zigzag_ranks_hold_an_early_and_a_late_chunk():
    assert context.positions(8, 2, 0, "zigzag").tolist() == [0, 1, 6, 7]
    assert context.positions(8, 2, 1, "zigzag").tolist() == [2, 3, 4, 5]
    held = torch.cat([context.positions(48, 3, r, "zigzag") for r in range(3)])
    assert sorted(held.tolist()) == list(range(48))


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 8])
def test_causal_work_per_rank_equals_the_closed_forms(ranks):
    seq_len = 2 * ranks * 6
    contiguous = context.attention_work_per_rank(seq_len, ranks, "contiguous")
    assert contiguous == context.contiguous_work(seq_len, ranks)
    c = seq_len // ranks
    assert contiguous == [r * c * c + c * (c + 1) // 2 for r in range(ranks)]
    zigzag = context.attention_work_per_rank(seq_len, ranks, "zigzag")
    assert zigzag == [seq_len * (seq_len + 1) // 2 // ranks] * ranks
    assert sum(contiguous) == sum(zigzag) == seq_len * (seq_len + 1) // 2


def test_the_measured_counts_of_the_issue():
    assert context.attention_work_per_rank(64, 2, "contiguous") == [528, 1552]
    assert context.attention_work_per_rank(64, 2, "zigzag") == [1040, 1040]


def test_the_log_sum_exp_merge_of_two_blocks_is_full_attention():
    q, k, v = qkv(2, 16, 8)
    merged, lse = context.merge(*context.block_attention(q, k[:, :5], v[:, :5]),
                                *context.block_attention(q, k[:, 5:], v[:, 5:]))
    assert (merged - context.full_attention(q, k, v)).abs().max() <= 1e-12
    assert torch.allclose(lse, torch.logsumexp(q @ k.transpose(1, 2) / math.sqrt(8), -1))


@pytest.mark.parametrize("causal, layout", [(False, "contiguous"), (True, "contiguous"), (True, "zigzag")])
@pytest.mark.parametrize("ranks", [2, 4])
def test_simulated_ring_attention_equals_one_process(causal, layout, ranks):
    q, k, v = qkv(2, 64, 16)
    out = context.simulated_ring(q, k, v, ranks, causal, layout)
    assert (out - context.full_attention(q, k, v, causal)).abs().max() <= 1e-12


def test_a_fully_masked_block_gives_nan_without_the_guard():
    q, k, v = qkv(1, 8, 4)
    mask = torch.zeros(8, 8, dtype=torch.bool)
    out, lse = context.block_attention(q, k, v, mask, guard=False)
    assert out.isnan().all() and torch.isneginf(lse).all()
    out, lse = context.block_attention(q, k, v, mask)
    assert torch.equal(out, torch.zeros_like(out))
    q, k, v = qkv(2, 64, 16)
    bad = context.simulated_ring(q, k, v, 2, causal=True, layout="zigzag", guard=False)
    assert int(bad.isnan().any(-1).sum()) == 32  # rank 0's first chunk, 16 rows, in each of 2 sequences


def test_ring_bytes_follow_the_formula():
    assert context.ring_bytes(2, 64, 16, 2, 8) == 16_384  # (n-1)·2·B·(S/n)·D·8, measured in the issue
    assert context.ring_bytes(2, 64, 16, 2, 8, backward=True) == 49_152
    assert context.ring_bytes(2, 64, 16, 4, 4) == 3 * 2 * 2 * 16 * 16 * 4


def test_the_ring_overlaps_each_transfer_with_a_block():
    assert context.ring_schedule(4, 1e-3, 0.8e-3).now() == pytest.approx(4e-3)
    assert context.ring_schedule(4, 1e-3, 0.8e-3, overlap=False).now() == pytest.approx(6.4e-3)
    assert context.ring_schedule(4, 1e-3, 2e-3).now() == pytest.approx(1e-3 + 3 * 2e-3)  # transfers show


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_simulated_ulysses_equals_one_process(ranks):
    q, k, v = qkv(2, 32, 4, 8)
    reference = context.full_attention(*(t.transpose(1, 2) for t in (q, k, v)), causal=True).transpose(1, 2)
    assert (context.simulated_ulysses(q, k, v, ranks, causal=True) - reference).abs().max() <= 1e-12


def test_ulysses_refuses_heads_that_do_not_split_and_counts_its_bytes():
    with pytest.raises(ValueError, match="6 heads do not split over 4 ranks"):
        context.check_heads(6, 4)
    with pytest.raises(ValueError, match="heads do not split"):
        q, k, v = qkv(1, 8, 6, 4)
        context.simulated_ulysses(q, k, v, 4)
    assert context.ulysses_bytes(2, 64, 4, 16, 2, 8) == context.multihead_ring_bytes(2, 64, 4, 16, 2, 8) == 65_536
    assert context.ulysses_bytes(2, 64, 4, 16, 4, 8) < context.multihead_ring_bytes(2, 64, 4, 16, 4, 8)


def test_activations_have_a_quadratic_term_that_the_fused_kernel_removes():
    torch.manual_seed(0)
    written = [context.activation_bytes(context.Block(64, 4), 2, s) for s in (64, 128, 256)]
    fused = [context.activation_bytes(context.Block(64, 4, flash=True), 2, s) for s in (64, 128, 256)]
    assert [7712 * s + 33 * s * s for s in (64, 128, 256)] == written  # 4·b·a = 32 B per score, + the mask
    assert fused == [6720 * s for s in (64, 128, 256)]


def test_moe_helpers_name_bad_input():
    with pytest.raises(ValueError, match="top-k must be between 1 and the 4 experts, not 5"):
        experts.MoE(8, 16, 4, top_k=5)
    with pytest.raises(ValueError, match="capacity factor must be above 0, not 0"):
        experts.capacity(10, 4, 2, 0)
    with pytest.raises(ValueError, match="6 experts do not split over 4 ranks"):
        experts.check_moe(6, 2, 1.0, ranks=4)


def test_routing_counts_equal_bincount_and_drops_equal_the_excess():
    torch.manual_seed(0)
    logits = torch.randn(48, 4)
    for factor in (0.5, 1.0, 1.25, 2.0):
        routing = experts.route(logits, 2, factor)
        chosen = torch.bincount(routing.experts.flatten(), minlength=4)
        assert routing.capacity == math.ceil(factor * 48 * 2 / 4)
        assert torch.equal(routing.tokens_per_expert(4), chosen.clamp(max=routing.capacity))
        assert routing.dropped() == int((chosen - routing.capacity).clamp(min=0).sum())
    assert torch.allclose(routing.weights.sum(-1), torch.ones(48))


def test_load_balancing_loss_is_one_when_even_and_more_when_skewed():
    even = experts.route(torch.zeros(8, 4) + torch.eye(4).repeat(2, 1), 1, 1.0)
    assert experts.load_balancing_loss(even).item() == pytest.approx(1.0)
    skewed = experts.route(torch.tensor([[4.0, 1.0, 0.0, 0.0]]).repeat(48, 1), 2, 1.0)
    assert experts.load_balancing_loss(skewed).item() > 1.5 and skewed.dropped() == 48


def test_expert_parallel_forward_on_one_rank_is_the_moe():
    torch.manual_seed(0)
    moe = experts.MoE(8, 16, 4, top_k=2).double()
    x = torch.randn(20, 8, dtype=torch.float64)
    expected, _ = moe(x)
    out, routing = experts.expert_parallel_forward(moe, x, 0, 1, lambda t, out_splits, in_splits: t,
                                                   lambda counts: counts)
    assert (out - expected).abs().max() <= 1e-12
    assert experts.all_to_all_bytes(routing.tokens_per_expert(4)[None], 0, 8, 8) == 0


def test_all_to_all_bytes_count_rows_sent_and_sent_back():
    counts = torch.tensor([[12, 9, 12, 12], [12, 8, 12, 12]])  # per source rank, 2 experts per rank
    # rank 0 sends 24 rows to rank 1's experts and returns 20 rows that rank 1 sent to its experts
    assert experts.all_to_all_bytes(counts, 0, 16, 8) == (24 + 20) * 16 * 8 == 5_632
    assert experts.expert_parallel_bytes(4096, 2, 4096, 8, 2) < experts.expert_gather_bytes(8, 4096, 14336, 8, 2, 3)


def test_the_pictures_draw():
    for draw in (diagrams_context.draw_ring, diagrams_context.draw_zigzag, diagrams_context.draw_ulysses,
                 diagrams_context.draw_routing):
        figure = draw()
        assert figure.axes
        plt.close(figure)


@pytest.mark.parametrize("gpus, expected", [(2, ("cuda", "nccl")), (1, ("cpu", "gloo")), (0, ("cpu", "gloo"))])
def test_the_script_takes_a_gpu_per_rank_only_when_there_are_enough(gpus, expected):
    device, backend = device_and_backend(1 if gpus else 0, 2, gpus, nccl_available=True)
    assert (device.type, backend) == expected
    source = SCRIPT.read_text()
    assert "join()" in source and "join(cpu=True)" not in source  # the tested decisions, not a fixed CPU


@pytest.mark.launches
def test_started_with_the_wrong_number_of_processes_it_says_how_to_start_it(tmp_path):
    with pytest.raises(launch.LaunchError) as failed:
        launch.torchrun(SCRIPT, 1, [str(tmp_path / "out.json")], timeout=120, echo=False)
    assert load_script("long_and_experts").USAGE in failed.value.stderr


@pytest.mark.launches
@pytest.mark.skipif(not launch.four_cpu_ranks_fit(), reason="4 CPU processes do not fit in this machine's memory")
def test_on_4_processes_everything_equals_one_process(tmp_path):
    found = tmp_path / "results.json"
    launch.torchrun(SCRIPT, 4, [str(found)], timeout=150, echo=False)
    results = json.loads(found.read_text())
    assert results["processes"] == 4
    for row in results["ring"]:
        bounds = (1e-6, 1e-5) if row["dtype"] == "float32" else (1e-12, 1e-12)
        assert row["output_error"] <= bounds[0] and row["gradient_error"] <= bounds[1], row
        assert (row["forward_bytes"], row["backward_bytes"]) == (row["forward_formula"], row["backward_formula"])
    assert results["ulysses"]["output_error"] <= 1e-12
    assert results["ulysses"]["bytes"] == results["ulysses"]["formula"] == 49_152
    moe = results["moe"]
    assert max(moe["output_error"], moe["expert_gradient_error"], moe["input_gradient_error"]) <= 1e-12
    assert moe["dropped"] == moe["dropped_formula"] and moe["bytes"] == moe["bytes_formula"]
    assert all(max(counts) <= moe["capacity"] for counts in moe["tokens_per_expert"])
    if results["backend"] == "gloo":  # pytorch/pytorch#192920, torch 2.14.1
        assert results["all_gather"]["deprecated"] > 0.1 and results["all_gather"]["functional"] <= 1e-12
        assert results["context_parallel"]["works"] is False
