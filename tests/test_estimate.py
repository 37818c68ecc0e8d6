"""d2l_ext.estimate: the estimate against one real step's tensors and against the peak of a real step (measured by
PyTorch's MemTracker), on four kinds of model, and its bad input; the per-rank estimate under FSDP2 x TP (measured
against a real 4-process run in tests/test_tensor_parallel.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker

from d2l_ext import (
    estimate_parallel_memory,
    estimate_training_memory,
    measure_training_memory,
    zero_bytes_per_gpu,
)

READS_NOTEBOOKS = False  # no notebook, edition or markdown file: tools/result_cache.py keys it on code only

ROWS = ("parameters", "gradients", "optimizer state", "activations", "sum of rows")


class TiedLanguageModel(nn.Module):
    """A tiny language model whose output layer shares the embedding's weight (as GPT-2's does)."""

    def __init__(self, vocab: int = 100, width: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.body = nn.Linear(width, width)
        self.out = nn.Linear(width, vocab, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.body(self.embed(tokens))))


def lenet() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 6, 5, padding=2), nn.Sigmoid(), nn.AvgPool2d(2, 2), nn.Conv2d(6, 16, 5), nn.Sigmoid(),
        nn.AvgPool2d(2, 2), nn.Flatten(), nn.Linear(400, 120), nn.Sigmoid(), nn.Linear(120, 84), nn.Sigmoid(),
        nn.Linear(84, 10))


def models() -> dict[str, tuple[nn.Module, torch.Tensor]]:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True)
    return {
        "mlp": (nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)), torch.randn(64, 256)),
        "lenet": (lenet(), torch.randn(32, 1, 28, 28)),
        "transformer": (nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), torch.randn(8, 20, 64)),
        "tied": (TiedLanguageModel(), torch.randint(0, 100, (16, 12))),
    }


def measured_peak(model: nn.Module, batch: torch.Tensor, optimizer: str, amp: torch.dtype | None,
                  foreach: bool) -> dict[str, int]:
    """MemTracker's peak of a steady-state step: a second step, after the first made the optimizer's state,
    with the gradients set to None between steps; by kind of tensor, and "Total". The batch is counted."""
    model = copy.deepcopy(model)
    parameters = list(model.parameters())
    opt = {"sgd": lambda: torch.optim.SGD(parameters, lr=0.01, foreach=foreach),
           "momentum": lambda: torch.optim.SGD(parameters, lr=0.01, momentum=0.9, foreach=foreach),
           "adam": lambda: torch.optim.Adam(parameters, foreach=foreach),
           "adamw": lambda: torch.optim.AdamW(parameters, foreach=foreach)}[optimizer]()

    def step() -> None:
        with torch.autocast("cpu", dtype=amp or torch.bfloat16, enabled=amp is not None):
            output = model(batch)
        output.float().sum().backward()
        opt.step()
        opt.zero_grad()

    step()
    tracker = MemTracker()
    tracker.track_external(model, opt, batch)
    with tracker:
        step()
    peak = tracker.get_tracker_snapshot("peak")[batch.device]
    return {str(getattr(kind, "value", kind)): n for kind, n in peak.items()}


def small_and_large(name: str) -> dict[str, torch.Tensor]:
    """One example, where Adam's step holds the peak (but for the tied model, whose shared weight gets two gradients
    in the backward pass), and a batch where the backward pass holds it (the MLP needs 1024)."""
    _, batch = models()[name]
    return {"small": batch[:1], "large": torch.cat([batch] * 16) if name == "mlp" else batch}


@pytest.mark.parametrize("amp", [None, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize(("optimizer", "foreach"), [("sgd", False), ("adam", False), ("adam", True)])
@pytest.mark.parametrize("size", ["small", "large"])
@pytest.mark.parametrize("name", ["mlp", "lenet", "transformer", "tied"])
def test_the_peak_is_within_ten_percent_of_memtrackers_peak_of_a_steady_state_step(name, size, optimizer,
                                                                                   foreach, amp):
    model, _ = models()[name]
    batch = small_and_large(name)[size]
    estimate = estimate_training_memory(model, batch, optimizer=optimizer, amp=amp, foreach=foreach)
    measured = measured_peak(model, batch, optimizer, amp, foreach)
    assert estimate.peak_bytes == pytest.approx(measured["Total"], rel=0.10)


@pytest.mark.parametrize("name", ["mlp", "lenet", "transformer"])
def test_the_peak_is_in_the_step_at_a_small_batch_and_in_the_backward_pass_at_a_large_one(name):
    model, _ = models()[name]
    for size, phase in (("small", "optimizer.step()"), ("large", "backward pass")):
        for foreach in (False, True):
            batch = small_and_large(name)[size]
            estimate = estimate_training_memory(model, batch, foreach=foreach)
            assert estimate.peak_phase == phase, (size, foreach, estimate.table(phases=True))
            measured = measured_peak(model, batch, "adam", None, foreach)
            in_the_step = measured["Optstate"] > estimate["optimizer state"]  # temporaries beside the state
            assert in_the_step == (phase == "optimizer.step()"), (size, foreach, measured)
            assert (measured["Temp"] > 0) == (phase == "backward pass"), (size, foreach, measured)


def test_the_sum_of_the_rows_is_not_a_bound():
    # the chapter's MLP at a batch of 4096: activation gradients sit beside the saved activations (chapter 8.2)
    model = nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 10))
    estimate = estimate_training_memory(model, torch.empty(4096, 1024, device="meta"), device="cpu")
    assert estimate.peak_phase == "backward pass"
    assert estimate.peak_bytes > 1.2 * estimate.sum_bytes
    assert estimate["backward pass"] == estimate.peak_bytes == estimate["peak"]


def test_foreach_adam_holds_one_parameter_sized_temporary_and_per_tensor_adam_two_of_the_largest():
    model, _ = models()["mlp"]
    batch = small_and_large("mlp")["small"]
    rows = {foreach: estimate_training_memory(model, batch, foreach=foreach) for foreach in (False, True)}
    sizes = [p.numel() * 4 for p in model.parameters()]
    without = rows[True]["optimizer.step()"] - sum(sizes)
    assert rows[False]["optimizer.step()"] - without == 2 * max(sizes)
    assert "foreach" in rows[True].peak.formula and "per-tensor" in rows[False].peak.formula
    sgd = estimate_training_memory(model, batch, optimizer="sgd", foreach=True)
    assert sgd["optimizer.step()"] == without - rows[True]["optimizer state"]  # SGD: no state, no temporaries


def test_foreach_follows_pytorchs_default_for_the_device():
    model, _ = models()["mlp"]
    batch = small_and_large("mlp")["small"]
    for device, kind in (("cpu", "per-tensor"), ("meta", "per-tensor"), ("cuda", "foreach")):
        step = next(p for p in estimate_training_memory(model, batch, device=device).phases
                    if p.name == "optimizer.step()")
        assert kind in step.formula, device


@pytest.mark.parametrize("amp", [None, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam", "adamw"])
@pytest.mark.parametrize("name", ["mlp", "lenet", "transformer", "tied"])
def test_the_rows_are_within_ten_percent_of_one_real_step(name, optimizer, amp):
    model, batch = models()[name]
    estimate = estimate_training_memory(model, batch, optimizer=optimizer, amp=amp)
    measured = measure_training_memory(model, batch, optimizer=optimizer, amp=amp)
    for row in ROWS:
        assert estimate[row] == pytest.approx(measured[row], rel=0.10), row
    assert estimate["activations"] > 0 and measured["optimizer state"] == estimate["optimizer state"]


def test_the_rows_follow_the_formulas():
    model, batch = models()["mlp"]
    count = sum(p.numel() for p in model.parameters())
    adam = estimate_training_memory(model, batch, optimizer="adam")
    assert [row.name for row in adam.rows] == list(ROWS[:4])
    assert adam["parameters"] == adam["gradients"] == 4 * count
    assert adam["optimizer state"] == 8 * count + 4 * len(list(model.parameters()))  # + a step counter each
    assert estimate_training_memory(model, batch, optimizer="momentum")["optimizer state"] == 4 * count
    assert estimate_training_memory(model, batch, optimizer="sgd")["optimizer state"] == 0
    assert adam.sum_bytes == sum(row.bytes for row in adam.rows) == adam["sum of rows"]
    assert adam.peak_bytes == max(phase.bytes for phase in adam.phases) == adam["peak"]
    assert [phase.name for phase in adam.phases] == ["forward pass", "backward pass", "optimizer.step()"]
    assert f"P = {count:,}" in adam.rows[0].formula
    lines = adam.table().splitlines()
    assert [line.split("  ")[0] for line in lines[-2:]] == ["sum of rows", "peak"]
    assert lines[-1].split(" MB   ")[1].startswith(adam.peak_phase + ":")
    assert len(adam.table(phases=True).splitlines()) == len(lines) + 3


def test_a_shared_weight_counts_once():
    model, batch = models()["tied"]
    unique = sum(p.numel() for p in model.parameters())
    assert unique < sum(p.numel() for module in model.children() for p in module.parameters())
    assert estimate_training_memory(model, batch, optimizer="sgd")["parameters"] == 4 * unique


def test_activations_grow_with_the_batch_and_bfloat16_about_halves_them():
    model, _ = models()["transformer"]
    small = estimate_training_memory(model, torch.randn(8, 20, 64))["activations"]
    large = estimate_training_memory(model, torch.randn(32, 20, 64))["activations"]
    assert large == pytest.approx(4 * small, rel=0.01)
    for name, (model, batch) in models().items():
        ratio = (estimate_training_memory(model, batch, amp=torch.bfloat16)["activations"]
                 / estimate_training_memory(model, batch)["activations"])
        assert 0.4 <= ratio <= 0.75, name


def test_a_model_larger_than_this_machine_is_estimated_on_the_meta_device():
    model = nn.Linear(100_000, 10_000, device="meta")  # a billion parameters, no memory
    estimate = estimate_training_memory(model, torch.empty(8, 100_000, device="meta"))
    assert estimate["sum of rows"] == pytest.approx(16e9, rel=0.001)  # 4 + 4 + 8 bytes per parameter
    assert estimate.peak_phase == "optimizer.step()"  # the rows, and two temporaries the size of the weight
    assert estimate["peak"] == pytest.approx(16e9 + 8e9, rel=0.001)


def test_the_callers_model_is_left_as_it_was():
    model, batch = models()["mlp"]
    before = [p.detach().clone() for p in model.parameters()]
    estimate_training_memory(model, batch)
    measure_training_memory(model, batch)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert all(p.grad is None for p in model.parameters())


def test_bad_input_is_named():
    model, batch = models()["mlp"]
    with pytest.raises(ValueError, match="no parameters"):
        estimate_training_memory(nn.ReLU(), batch)
    with pytest.raises(ValueError, match="rejects this batch") as caught:
        estimate_training_memory(model, torch.randn(64, 3))
    assert caught.value.__cause__ is not None  # the model's own error is kept
    with pytest.raises(ValueError, match="unknown optimizer 'lion'"):
        estimate_training_memory(model, batch, optimizer="lion")
    with pytest.raises(ValueError, match="amp must be"):
        estimate_training_memory(model, batch, amp=torch.float64)


def test_bfloat16_is_refused_on_a_gpu_that_cannot_compute_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    model, batch = models()["mlp"]
    with pytest.raises(ValueError, match="use torch.float16"):
        estimate_training_memory(model, batch, amp=torch.bfloat16, device="cuda")


def test_zero_matches_the_papers_figure_1():
    # Rajbhandari et al., "ZeRO", SC 2020, Figure 1: 7.5B parameters, 64 GPUs, K = 12
    per_gpu = [zero_bytes_per_gpu(7.5e9, 64, stage) / 1e9 for stage in range(4)]
    assert [round(x, 1) for x in per_gpu] == [120.0, 31.4, 16.6, 1.9]
    assert zero_bytes_per_gpu(1e9, 1, 3) == zero_bytes_per_gpu(1e9, 1, 0)  # one GPU: nothing to shard
    with pytest.raises(ValueError):
        zero_bytes_per_gpu(1e9, 2, 4)
    with pytest.raises(ValueError):
        zero_bytes_per_gpu(1e9, 0, 1)


@pytest.mark.parametrize(("device", "available", "expected"), [
    ("cuda", True, "cuda"), ("cuda", False, "cpu"), ("mps", True, "mps"), ("mps", False, "cpu"),
    ("cpu", True, "cpu"), ("meta", True, "cpu")])
def test_the_step_is_simulated_on_the_device_when_one_is_here(monkeypatch, device, available, expected):
    """Autograd's engine needs a real device of the fake tensors' type for the backward pass (without one it
    raises), so a step estimated for a GPU that is not here is simulated on the CPU."""
    from d2l_ext.estimate import _simulation_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.mps, "is_available", lambda: available, raising=False)
    assert _simulation_device(device) == expected


def test_a_device_whose_fake_backward_fails_falls_back_to_the_cpus_simulation(monkeypatch):
    """Pretend CUDA is here: the fake CUDA forward runs, its backward raises in autograd's engine (there is no
    GPU), and the estimate is the CPU's simulation, not an error in an unguarded cell."""
    from d2l_ext import estimate

    model, batch = models()["mlp"]
    if not torch.cuda.is_available():  # the path this test takes: the fake CUDA step cannot run here
        with pytest.raises(RuntimeError):
            estimate._fake_step(model, batch, None, "cuda")
    on_the_cpu = estimate_training_memory(model, batch, device="cuda")
    monkeypatch.setattr(estimate, "_simulation_device", lambda device_type: device_type)
    fallen_back = estimate_training_memory(model, batch, device="cuda")
    assert fallen_back == on_the_cpu
    with pytest.raises(ValueError, match="rejects this batch"):
        estimate_training_memory(model, torch.randn(64, 3), device="cuda")


def megatron_mlp() -> nn.Sequential:
    """Chapter 9's MLP: 16 -> 64 -> 16, 2,128 parameters (1,024 + 64 + 1,024 + 16)."""
    return nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))


MLP_PLAN = {"0": "colwise", "2": "rowwise"}


@pytest.mark.parametrize(("dp", "tp", "rows"), [
    # bytes: parameters, gradients, Adam state, activations. Split: the first weight and bias and the second
    # weight, 2,112 numbers; whole on each tp rank: the last bias, 16. Adam: 2 x the gradients + 4 B x 4 step
    # counters. Activations, for a batch of B / dp rows: the input (16 whole), GELU's input and output (64 / tp
    # each), x 4 B
    (1, 1, [8512, 8512, 17040, 16 * (16 + 2 * 64) * 4]),  # (2,112 + 16) x 4 B; 16 rows
    (2, 2, [2144, 2144, 4304, 8 * (16 + 2 * 32) * 4]),  # (2,112 / 4 + 16 / 2) x 4 B; 8 rows
    (1, 4, [2176, 2176, 4368, 16 * (16 + 2 * 16) * 4]),  # (2,112 / 4 + 16) x 4 B; 16 rows
    (4, 1, [2128, 2128, 4272, 4 * (16 + 2 * 64) * 4]),  # 8,512 / 4 B; 4 rows
    # dp = 3 divides no first dimension: FSDP2 pads each shard to the largest, ceil(rows / 3) rows, 22 of the
    # first layer's 64, 6 of the second's 16: (22 x 16 + 22 + 6 x 64 + 6) x 4 B; a batch of 24, 8 rows
    (3, 1, [3056, 3056, 6128, 8 * (16 + 2 * 64) * 4]),
])
def test_the_parallel_estimate_splits_by_tp_then_by_dp(dp, tp, rows):
    estimate = estimate_parallel_memory(megatron_mlp(), torch.randn(24 if dp == 3 else 16, 16), MLP_PLAN, dp=dp, tp=tp)
    assert [row.bytes for row in estimate.rows] == rows
    assert estimate.phases == () and "peak" not in estimate.table()
    with pytest.raises(ValueError, match="no peak"):
        _ = estimate.peak_bytes


def test_the_parallel_estimate_on_one_rank_is_chapter_8s():
    model, batch = megatron_mlp(), torch.randn(16, 16)
    one = [row.bytes for row in estimate_training_memory(model, batch).rows]
    assert [row.bytes for row in estimate_parallel_memory(model, batch, MLP_PLAN, dp=1, tp=1).rows] == one
    assert [row.bytes for row in estimate_parallel_memory(model, batch, {}, dp=1, tp=1).rows] == one


def test_the_parallel_estimate_leaves_the_model_as_it_was_and_accepts_the_meta_device():
    model = megatron_mlp()
    before = [p.detach().clone() for p in model.parameters()]
    estimate_parallel_memory(model, torch.randn(16, 16), MLP_PLAN, dp=2, tp=2)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert isinstance(model[0], nn.Linear) and model[0].out_features == 64
    wide = nn.Sequential(nn.Linear(8192, 32768, device="meta"), nn.GELU(), nn.Linear(32768, 8192, device="meta"))
    estimate = estimate_parallel_memory(wide, torch.empty(64, 8192, device="meta"), MLP_PLAN, dp=8, tp=8)
    assert estimate["parameters"] == (2 * 8192 * 32768 + 32768) * 4 // 64 + 8192 * 4 // 8


def test_the_parallel_estimate_names_bad_input():
    model, batch = megatron_mlp(), torch.randn(16, 16)
    with pytest.raises(ValueError, match="tp=3 does not divide the 64 output features of '0'"):
        estimate_parallel_memory(model, batch, MLP_PLAN, dp=1, tp=3)
    with pytest.raises(ValueError, match="tp=32 does not divide the 16 input features of '0'"):
        estimate_parallel_memory(model, batch, {"0": "rowwise"}, dp=1, tp=32)
    with pytest.raises(ValueError, match="tp_plan names '3', which is no module"):
        estimate_parallel_memory(model, batch, {"3": "colwise"}, dp=1, tp=2)
    with pytest.raises(ValueError, match="tp_plan names 'mlp.0', which is no module"):
        estimate_parallel_memory(model, batch, {"mlp.0": "colwise"}, dp=1, tp=2)
    with pytest.raises(ValueError, match=r"tp_plan\['0'\] is 'columns', not 'colwise' or 'rowwise'"):
        estimate_parallel_memory(model, batch, {"0": "columns"}, dp=1, tp=2)
    with pytest.raises(ValueError, match="GELU is not an nn.Linear"):
        estimate_parallel_memory(model, batch, {"1": "colwise"}, dp=1, tp=2)
    with pytest.raises(ValueError, match="dp=3 does not divide the batch of 16"):
        estimate_parallel_memory(model, batch, MLP_PLAN, dp=3, tp=2)
    for dp, tp in ((0, 2), (2, 0), (-1, 1)):
        with pytest.raises(ValueError, match="must be at least 1"):
            estimate_parallel_memory(model, batch, MLP_PLAN, dp=dp, tp=tp)
    with pytest.raises(ValueError, match="unknown optimizer 'lion'"):
        estimate_parallel_memory(model, batch, MLP_PLAN, dp=1, tp=2, optimizer="lion")


def test_a_forward_that_fixes_the_number_of_heads_is_refused_on_one_ranks_shapes():
    class FixedHeads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q = nn.Linear(16, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.q(x).view(x.shape[0], 4, 4)  # 4 heads, whatever the width: wrong on a rank

    with pytest.raises(ValueError, match=r"on one rank's shapes \(tp=2, dp=1\): the model rejects this batch"):
        estimate_parallel_memory(FixedHeads(), torch.randn(8, 16), {"q": "colwise"}, dp=1, tp=2)
