"""d2l_ext.roofline: FLOPs in closed form equal FlopCounterMode's counts exactly; the spec table's arithmetic."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from d2l_ext import roofline


def counted(step) -> tuple[int, int]:
    """(forward FLOPs, backward FLOPs) that FlopCounterMode counts for ``step``, which returns a loss."""
    with FlopCounterMode(display=False) as forward_mode:
        loss = step()
    with FlopCounterMode(display=False) as backward_mode:
        loss.backward()
    return forward_mode.get_total_flops(), backward_mode.get_total_flops()


def test_an_mlp_step_is_counted_exactly_and_six_p_b_overcounts_the_first_layers_input_gradient():
    torch.manual_seed(0)
    sizes, batch = [64, 256, 32], 16
    net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 32))
    x = torch.randn(batch, 64)
    forward, backward = counted(lambda: net(x).sum())
    closed = roofline.mlp_step_flops(batch, sizes)
    assert (forward, backward) == (closed["forward"], closed["backward"])
    weights = sum(a * b for a, b in zip(sizes, sizes[1:], strict=False))
    assert 6 * weights * batch - closed["total"] == 2 * batch * 64 * 256  # the first layer's input gradient


def test_the_measured_mlp_of_the_notes_has_its_count():
    # ../shared/notes/anchors-2026-11-27.md: FlopCounterMode counted 10.74 GFLOP for 1024-4096-1024 at batch 256
    assert round(roofline.mlp_step_flops(256, [1024, 4096, 1024])["total"] / 1e9, 2) == 10.74


@pytest.mark.parametrize("input_grad", [True, False])
def test_a_conv_layer_is_counted_exactly(input_grad):
    conv = nn.Conv2d(3, 8, kernel_size=3, padding=1)
    x = torch.randn(2, 3, 10, 12, requires_grad=input_grad)
    forward, backward = counted(lambda: conv(x).sum())
    closed = roofline.conv2d_flops(2, 3, 8, 3, 10, 12, input_grad=input_grad)
    assert (forward, backward) == (closed["forward"], closed["backward"])


class Block(nn.Module):
    """A pre-LayerNorm transformer block, as chapter 9 splits it."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.q, self.k, self.v, self.out = (nn.Linear(hidden, hidden) for _ in range(4))
        self.up, self.down = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        b, s, h = x.shape
        y = self.norm1(x)
        q, k, v = (layer(y).view(b, s, self.heads, h // self.heads).transpose(1, 2)
                   for layer in (self.q, self.k, self.v))
        # written out, as d2l does: FlopCounterMode has no formula for the CPU kernel of
        # F.scaled_dot_product_attention (torch 2.14 counts nothing for it)
        weights = torch.softmax(q @ k.transpose(-2, -1) / (h // self.heads) ** 0.5, dim=-1)
        attention = (weights @ v).transpose(1, 2).reshape(b, s, h)
        x = x + self.out(attention)
        return x + self.down(F.gelu(self.up(self.norm2(x))))


@pytest.mark.parametrize("input_grad", [True, False])
def test_a_transformer_block_is_counted_exactly_with_or_without_an_input_gradient(input_grad):
    torch.manual_seed(0)
    block = Block(hidden=32, heads=4)
    x = torch.randn(2, 10, 32, requires_grad=input_grad)
    forward, backward = counted(lambda: block(x).sum())
    closed = roofline.transformer_block_flops(2, 10, 32)
    assert (forward, backward) == (closed["forward"], closed["backward"])


def test_ridge_points_follow_from_the_table():
    assert round(roofline.ridge_point("H100", "bfloat16")) == 295  # 989.4e12 / 3.35e12
    assert round(roofline.ridge_point("A100", "bfloat16")) == 153  # 312e12 / 2.039e12
    assert round(roofline.ridge_point("T4", "float16")) == 203  # 65e12 / 320e9
    assert all(spec.source for spec in roofline.GPUS.values())


def test_the_roofline_is_the_slower_of_two_limits_and_bends_at_the_ridge():
    peak, bandwidth = 100.0, 10.0  # ridge at 10 FLOP/byte
    assert roofline.attainable(1.0, peak, bandwidth) == 10.0
    assert roofline.attainable(10.0, peak, bandwidth) == 100.0
    assert roofline.attainable(50.0, peak, bandwidth) == 100.0
    assert roofline.roofline_seconds(100.0, 100.0, peak, bandwidth) == 10.0  # memory: 100 B at 10 B/s
    assert roofline.roofline_seconds(1000.0, 1.0, peak, bandwidth) == 10.0  # compute: 1000 FLOP at 100 FLOP/s
    assert [roofline.bound(i, 10.0) for i in (9.99, 10.0)] == ["memory-bound", "compute-bound"]


def test_an_operation_is_on_one_side_only_when_it_is_on_that_side_of_every_ridge():
    ridges = [1.5, 4.5, 6.3]
    assert [roofline.side_of_every(i, ridges) for i in (1.0, 1.5, 5.0, 6.3, 10.7)] == [
        "memory-bound", "either side", "either side", "either side", "compute-bound"]
    assert roofline.side_of_every(5.0, [4.5]) == roofline.bound(5.0, 4.5)  # one ridge: the roofline's own answer


def test_the_recorded_cpu_ridges_put_the_course_operations_on_the_sides_chapter_10_teaches():
    sides = {op.name: roofline.side_of_every(op.intensity, roofline.CPU_RIDGES.values())
             for op in roofline.course_operations()}
    assert [name for name, side in sides.items() if side == "memory-bound"] == ["add", "softmax", "LayerNorm"]
    assert "either side" not in sides.values()


def test_a_matmul_grows_more_intense_with_its_size():
    intensities = [2 * n**3 / roofline.matmul_bytes(n, n, n) for n in (64, 256, 1024)]
    assert intensities == sorted(intensities)
    assert math.isclose(intensities[-1], 1024 / 6)  # 2n^3 / (3 n^2 x 4 bytes)


def test_mfu_is_model_flops_over_what_the_peak_does_in_the_step():
    assert roofline.model_flops_utilization(50e12, 0.5, 200e12) == 0.5


@pytest.mark.parametrize("call, message", [
    (lambda: roofline.peak_flops("V100", "float16"), "T4, A100, H100, MI300X"),
    (lambda: roofline.peak_flops("T4", "bfloat16"), "float32, float16"),
    (lambda: roofline.linear_flops(0, 4, 4), "batch must be positive"),
    (lambda: roofline.roofline_seconds(1.0, -1.0, 1.0, 1.0), "nbytes must be positive"),
    (lambda: roofline.mlp_step_flops(4, [8]), "at least two sizes"),
    (lambda: roofline.side_of_every(1.0, []), "no ridge given"),
    (lambda: roofline.side_of_every(1.0, [2.0, 0.0]), "ridge 1 must be positive"),
    (lambda: roofline.side_of_every(0.0, [2.0]), "intensity must be positive"),
])
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_the_batch_that_makes_an_h100_matmul_compute_bound():
    batch = roofline.compute_bound_batch("H100", "bfloat16", 8192, 8192)
    assert batch == 319  # by hand: 295.34 x 2 x 8192² / (2 x 8192² - 295.34 x 2 x 16384) = 318.3
    intensity = lambda b: 2 * b * 8192 * 8192 / roofline.matmul_bytes(b, 8192, 8192, 2)  # noqa: E731
    ridge = roofline.ridge_point("H100", "bfloat16")
    assert intensity(batch - 1) < ridge <= intensity(batch)
    assert roofline.compute_bound_batch("H100", "bfloat16", 256, 256) is None  # 2·256²/(2·512) = 128 < 295


def test_data_parallelism_hides_its_all_reduce_above_a_number_of_tokens_that_does_not_depend_on_the_model():
    tokens = roofline.dp_hiding_tokens("H100", "bfloat16", 450e9, gpus=8)
    assert round(tokens) == round(7 / 8 * 989.4e12 / 450e9)  # 1,924 tokens per GPU over NVLink
    assert roofline.dp_hiding_tokens("H100", "bfloat16", 50e9, gpus=8) == pytest.approx(9 * tokens)


def test_tensor_parallelism_turns_communication_bound_at_a_degree_that_grows_with_the_ffn():
    degree = roofline.tp_comm_bound_degree("H100", "bfloat16", 450e9, ffn=28672)
    assert degree == pytest.approx(1 + 2 * 28672 / (2 * 989.4e12 / 450e9))
    assert 14 < degree < 15  # Llama 3 70B's MLP (ffn 28,672) stays compute-bound up to 14 GPUs over NVLink


def test_a_training_run_and_a_decode_speed_from_the_table():
    # 8e9 parameters on 1e6 tokens, 8 H100s at 40%: 4.8e16 FLOPs / 3.166e15 FLOP/s
    assert roofline.training_seconds(8e9, 1e6, 8, "H100", "bfloat16", 0.4) == pytest.approx(15.16, abs=0.01)
    assert roofline.decode_tokens_per_second(7e9, "bfloat16", "H100") == pytest.approx(3.35e12 / 14e9)
    assert roofline.decode_tokens_per_second(7e9, "float16", "T4") == pytest.approx(320e9 / 14e9)  # about 23


def test_measuring_the_machine_waits_for_the_device_in_every_run(monkeypatch):
    from d2l_ext import timing

    waits = []
    monkeypatch.setattr(timing, "synchronize", lambda device: waits.append(torch.device(device)))
    peak, bandwidth = roofline.measure_machine("cpu", size=32, numel=1024)
    assert peak > 0 and bandwidth > 0
    assert len(waits) >= 4 and set(waits) == {torch.device("cpu")}  # warm-up and timed runs, matmul and add


def test_the_kv_cache_of_llama_3_70b_and_what_it_costs_decode():
    kv = roofline.kv_cache_bytes_per_token(80, 8, 128, "bfloat16")
    assert kv == 320 * 1024  # 80 layers x (key + value) x 8 heads x 128 x 2 bytes
    weights_only = roofline.decode_tokens_per_second(70e9, "bfloat16", "H100", batch=295)
    assert weights_only == pytest.approx(295 * 3.35e12 / 140e9)  # still (just) under the ridge: memory sets it
    # 295 sequences of 4,096 tokens read 396 GB of cache per step beside 140 GB of weights (teaching review M7)
    long = roofline.decode_tokens_per_second(70e9, "bfloat16", "H100", 295, 4096, kv)
    short = roofline.decode_tokens_per_second(70e9, "bfloat16", "H100", 295, 1024, kv)
    assert (round(long), round(short)) == (1844, 4135)
    # far above the ridge and without a cache, compute sets the pace: 2P FLOPs a token at the peak
    assert roofline.decode_tokens_per_second(70e9, "bfloat16", "H100", batch=10_000) == pytest.approx(
        989.4e12 / 140e9)


def test_the_tensor_parallel_threshold_is_the_scaling_books_plus_the_rings_one():
    # SB writes F/2200 in a node (C/W = 989.4e12 / 450e9) and F/2475 across nodes (400 GB/s); the exact ring's
    # (t - 1)/t adds 1
    in_node = roofline.tp_comm_bound_degree("H100", "bfloat16", 450e9, ffn=28672)
    across = roofline.tp_comm_bound_degree("H100", "bfloat16", 400e9, ffn=28672)
    assert in_node - 1 == pytest.approx(28672 / (989.4e12 / 450e9))
    assert (round(in_node - 1, 1), round(across - 1, 1)) == (13.0, 11.6)


def test_the_recorded_ridges_are_the_settings_ci_runs_with(tmp_path):
    """d2l_ext/cpu_ridges.json (make measure-ridges --record) names every setting tools/envs/ridges.py measures: the
    matrix's numeric settings, make test's pins, and those pins with one core busy; and --record writes that file."""
    from tools.envs import ridges

    expected = {*ridges.settings(), "make test's pins, one core busy"}
    assert set(roofline.CPU_RIDGES) == expected
    assert all(value > 0 for value in roofline.CPU_RIDGES.values())
    path = tmp_path / "cpu_ridges.json"
    path.write_text('{"about": "kept", "measured": "x", "ridges": {}}')
    ridges.record({"a": 1.5}, path, today="2026-11-29")
    import json

    assert json.loads(path.read_text()) == {"about": "kept", "measured": "2026-11-29", "ridges": {"a": 1.5}}
