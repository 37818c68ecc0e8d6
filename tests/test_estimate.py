"""d2l_ext.estimate: the estimate against one real step's tensors, on four kinds of model, and its bad input."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from d2l_ext import estimate_training_memory, measure_training_memory, zero_bytes_per_gpu

READS_NOTEBOOKS = False  # no notebook, edition or markdown file: tools/test_cache.py keys it on code only

ROWS = ("parameters", "gradients", "optimizer state", "activations", "peak")


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


@pytest.mark.parametrize("amp", [None, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam", "adamw"])
@pytest.mark.parametrize("name", ["mlp", "lenet", "transformer", "tied"])
def test_the_estimate_is_within_ten_percent_of_one_real_step(name, optimizer, amp):
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
    assert adam.peak_bytes == sum(row.bytes for row in adam.rows) == adam["peak"]
    assert f"P = {count:,}" in adam.rows[0].formula
    assert adam.table().splitlines()[-1].startswith("peak")


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
    assert estimate["peak"] == pytest.approx(16e9, rel=0.001)  # 4 + 4 + 8 bytes per parameter


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
