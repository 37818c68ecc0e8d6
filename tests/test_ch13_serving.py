"""Chapter 13 (serving a model): the KV cache, paged memory, continuous batching, speculative decoding, quantized
weights and tensor-parallel decode, each checked exactly against plain greedy decoding (issue 47)."""

from __future__ import annotations

import re
from fractions import Fraction
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
import nbformat
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from d2l_ext import diagrams_serving, launch, serving
from d2l_ext import serving_sched as sched
from tests.helpers import load_script

matplotlib.use("Agg")
NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def tiny(kv_heads: int = 2, seed: int = 0, vocab: int = 20, layers: int = 2) -> serving.GPT:
    torch.manual_seed(seed)
    return serving.GPT(vocab, dim=32, layers=layers, heads=4, kv_heads=kv_heads, ffn=64, context=64).eval()


PROMPT = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])


def test_kv_bytes_follow_the_formula_for_llama_3():
    per_token = {name: serving.kv_cache_bytes(layers=c["layers"], kv_heads=c["kv_heads"], head_dim=c["head_dim"])
                 for name, c in serving.LLAMA3.items()}
    assert per_token == {"Llama 3 8B": 128 * 1024, "Llama 3 70B": 320 * 1024}  # 2·32·8·128·2, 2·80·8·128·2
    assert serving.kv_cache_bytes(layers=80, kv_heads=8, head_dim=128, tokens=4096, batch=3) == 3 * 4096 * 320 * 1024
    assert serving.kv_cache_bytes(layers=2, kv_heads=1, head_dim=16, dtype="float32") == 256
    with pytest.raises(ValueError, match="at least 0"):
        serving.kv_cache_bytes(layers=2, kv_heads=1, head_dim=16, tokens=-1)
    assert "config.json" in serving.LLAMA3_SOURCE


def test_heads_must_be_a_multiple_of_the_kv_heads():
    with pytest.raises(ValueError, match="4 query heads are not a multiple of 3 KV heads"):
        serving.GPT(10, heads=4, kv_heads=3)


@pytest.mark.parametrize("kv_heads", [4, 2, 1])  # multi-head, grouped-query, multi-query
def test_the_cache_gives_the_tokens_of_recomputing(kv_heads):
    model = tiny(kv_heads)
    assert torch.equal(serving.generate(model, PROMPT, 30), serving.generate(model, PROMPT, 30, use_cache=False))


def test_flops_counted_equal_the_closed_form():
    model = tiny()
    for new, context in ((8, 8), (1, 9), (1, 40)):
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            cache = model.new_cache()
            if context > new:
                model(torch.zeros(1, context - new, dtype=torch.long), [cache], [0])
                counter.get_flop_counts().clear()
            model(torch.zeros(1, new, dtype=torch.long), [cache], [context - new])
        if context == new:
            assert counter.get_total_flops() == serving.forward_flops(model, new, context)
    with FlopCounterMode(display=False) as counter:
        serving.generate(model, PROMPT, 5)
    expected = serving.forward_flops(model, 8, 8) + sum(serving.forward_flops(model, 1, c) for c in range(9, 13))
    assert counter.get_total_flops() == expected


def test_bad_prompts_and_zero_tokens():
    model = tiny()
    with pytest.raises(ValueError, match="a prompt of 60 tokens plus 10 new ones is longer than the model's "
                                         "context of 64"):
        serving.generate(model, torch.zeros(60, dtype=torch.long), 10)
    with pytest.raises(ValueError, match="more than the model's context"):
        model(torch.zeros(1, 65, dtype=torch.long))
    assert torch.equal(serving.generate(model, PROMPT, 0), PROMPT)


def test_a_paged_cache_gives_the_same_tokens_and_returns_every_block():
    model = tiny()
    pool = serving.BlockAllocator(16, 8, 2, 2, 8)
    paged = serving.PagedCache(pool)
    assert torch.equal(serving.generate(model, PROMPT, 40, cache=paged), serving.generate(model, PROMPT, 40))
    assert len(paged.table) == -(-(8 + 40 - 1) // 8) == 6
    paged.release()
    assert sorted(pool.free) == list(range(16))


def test_an_empty_pool_says_what_it_has_and_what_was_asked():
    pool = serving.BlockAllocator(3, 8, 2, 2, 8)
    pool.allocate(2)
    with pytest.raises(ValueError, match="out of KV blocks: 1 free of 3, 2 asked for"):
        pool.allocate(2)
    with pytest.raises(ValueError, match="out of KV blocks"):
        serving.generate(tiny(), PROMPT, 40, cache=serving.PagedCache(serving.BlockAllocator(2, 8, 2, 2, 8)))


def stream() -> list[sched.Request]:
    lengths = [(5, 12), (3, 2), (8, 20), (4, 0), (6, 7), (2, 15), (7, 3)]
    return [sched.Request(torch.arange(p) % 20, n) for p, n in lengths]


def test_continuous_batching_counts_and_solo_runs():
    model, pool = tiny(), serving.BlockAllocator(32, 8, 2, 2, 8)
    requests = stream()
    ticks = sched.serve_continuously(model, requests, 3, pool)
    # static: batches (12, 2, 20) (0, 7, 15) (3) -> 20 + 15 + 3; continuous counted by hand from the schedule
    assert sched.static_iterations(requests, 3) == 38
    assert ticks == 24
    for r in requests:
        assert torch.equal(r.tokens, serving.generate(model, r.prompt, r.new_tokens))
    assert torch.equal(requests[3].tokens, requests[3].prompt)
    assert [r.ttft for r in requests] == [1, 1, 1, None, 3, 10, 13]  # r5 waits for r4 (done at 9)
    assert requests[0].tpot == 1 and requests[1].tpot == 1
    assert sorted(pool.free) == list(range(32))


@pytest.mark.parametrize("draft", ["itself", "int8", "early exit", "random"])
def test_speculation_gives_the_targets_tokens_for_every_draft(draft):
    target = tiny()
    drafts = {"itself": target, "int8": serving.quantize_int8(target),
              "early exit": tiny(layers=1), "random": tiny(seed=7, layers=1)}
    for new in (1, 5, 31):
        s = sched.speculate(target, drafts[draft], PROMPT, new, k=4)
        assert torch.equal(s.tokens, serving.generate(target, PROMPT, new))
        assert s.accepted + s.rounds == new
    if draft == "itself":
        assert s.acceptance == 1.0 and s.rounds == 1 + -(-30 // 5)


def test_a_draft_with_another_vocabulary_is_refused():
    with pytest.raises(ValueError, match=r"the draft's vocabulary \(21 tokens\) differs from the target's \(20\)"):
        sched.speculate(tiny(), tiny(vocab=21), PROMPT, 4)
    assert torch.equal(sched.speculate(tiny(), tiny(), PROMPT, 0).tokens, PROMPT)


@pytest.mark.parametrize("k", [1, 4, 7])
def test_leviathans_formula_equals_the_enumeration(k):
    for alpha in (Fraction(0), Fraction(1, 3), Fraction(9, 10), Fraction(1)):
        assert sched.simulated_tokens_per_round(alpha, k) == sched.expected_tokens_per_round(alpha, k)
    assert sched.expected_speedup(Fraction(1), k, Fraction(0)) == k + 1
    assert sched.expected_speedup(Fraction(0), k, Fraction(1, 10)) < 1


def test_int8_weights_their_bytes_and_their_error():
    model = tiny()
    q8 = serving.quantize_int8(model)
    linear = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    weights = sum(m.weight.numel() for m in linear)
    rows = sum(m.weight.shape[0] for m in linear)
    assert serving.weight_bytes(model) - serving.weight_bytes(q8) == 4 * weights - (weights + 4 * rows)
    with torch.no_grad():
        full, approx = model(PROMPT[None]), q8(PROMPT[None])
    assert 0 < ((approx - full).norm() / full.norm()).item() < 2e-2


def torchao_int8(model: serving.GPT) -> serving.GPT:
    import copy

    torchao = serving.import_torchao()  # requirements.txt pins it: a missing torchao fails here
    copied = copy.deepcopy(model)
    torchao.quantization.quantize_(copied, torchao.quantization.Int8WeightOnlyConfig())
    return copied


def test_torchaos_int8_bytes_are_its_integers_scales_and_zero_points():
    model = tiny()
    ao8 = torchao_int8(model)
    linear = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    weights = sum(m.weight.numel() for m in linear)
    rows = sum(m.weight.shape[0] for m in linear)
    others = serving.weight_bytes(model) - 4 * weights  # embeddings and norms stay float32
    # per row: a float32 scale and an int8 zero point; per weight: one int8
    assert serving.weight_bytes(ao8) == others + weights + 4 * rows + rows
    assert serving.weight_bytes(ao8) == serving.weight_bytes(serving.quantize_int8(model)) + rows
    assert serving.weight_bytes(model) == serving.weight_bytes(tiny())  # a float model: numel × 4, as before


def test_torchaos_int8_is_the_courses_rule_with_127_5_and_keeps_the_tokens():
    model = tiny()
    ao8 = torchao_int8(model)
    checked = 0
    int8_tensor = serving.import_torchao().quantization.Int8Tensor
    for ours, theirs in zip(model.modules(), ao8.modules(), strict=True):
        if isinstance(ours, torch.nn.Linear):
            w, q = ours.weight.detach(), theirs.weight
            assert isinstance(q, int8_tensor)
            scale = w.abs().amax(dim=1, keepdim=True) / 127.5
            assert torch.equal(q.scale, scale)
            assert torch.equal(q.qdata, (w * (1 / scale)).round().clamp(-128, 127).to(torch.int8))
            assert q.zero_point is not None and not q.zero_point.any()  # symmetric
            checked += 1
    assert checked == 2 * 6 + 1  # q, k, v, out, up, down in each block, and the head
    assert torch.equal(serving.generate(ao8, PROMPT, 30), serving.generate(model, PROMPT, 30))
    with torch.no_grad():
        full, approx = model(PROMPT[None]), ao8(PROMPT[None])
    assert 0 < ((approx - full).norm() / full.norm()).item() < 2e-2


def test_the_int4_cell_is_guarded_for_a_cuda_gpu():
    cells = {c.id: c for c in nbformat.read(NOTEBOOKS / "13_serving.ipynb", as_version=4).cells}
    cell = cells["quantize-int4"]
    assert cell.source.startswith('if d2l_ext.needs_gpus(1, kind="cuda"):')
    assert [o.text for o in cell.outputs] == [  # the stored run is this machine's skip, never a GPU's output
        "Skipped: this cell needs 1 GPU of type CUDA (NVIDIA, or AMD with ROCm); this machine has no GPU. "
        "To get one on Colab: Runtime > Change runtime type > T4 GPU.\n"]


@pytest.mark.parametrize(("gpus", "expected"), [(0, ("cpu", torch.float32)), (1, ("cuda", torch.float16))])
def test_the_gpu_cells_setting_follows_what_torch_reports(gpus, expected):
    assert serving.decode_setting(gpus) == expected


def test_the_gpu_cell_is_guarded_and_skips_in_one_line(monkeypatch, capsys):
    import d2l_ext

    cell = next(c for c in nbformat.read(NOTEBOOKS / "13_serving.ipynb", as_version=4).cells
                if c.get("id") == "gpu-decode")
    assert "device-dependent" in cell.metadata["tags"] and "torch.cuda.device_count()" in cell.source
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    exec(cell.source, {"d2l_ext": d2l_ext, "torch": torch, "serving": serving})
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 1 and printed[0].startswith("Skipped: this cell needs 1 GPU"), printed


def test_the_step_model_reads_weights_and_caches():
    assert serving.step_seconds(1e9, "bfloat16", 2e12) == pytest.approx(1e-3)
    assert serving.step_seconds(1e9, "bfloat16", 2e12, batch=2, context=10, kv_bytes_per_token=1e6) == \
        pytest.approx((2e9 + 2e7) / 2e12)


def test_the_pictures_draw():
    for draw in (diagrams_serving.draw_cache_growing, diagrams_serving.draw_block_table,
                 diagrams_serving.draw_slots, diagrams_serving.draw_speculation):
        figure = draw()
        assert sum(len(ax.patches) for ax in figure.axes) > 4
        plt.close(figure)


def test_a_rank_holds_its_part_of_each_weight():
    script = load_script("tp_decode")
    state = tiny().state_dict()
    part = script.shard_state(state, 1, 2)
    assert torch.equal(part["blocks.0.q.weight"], state["blocks.0.q.weight"][16:])
    assert torch.equal(part["blocks.1.down.weight"], state["blocks.1.down.weight"][:, 32:])
    assert torch.equal(part["head.weight"], state["head.weight"])
    with pytest.raises(ValueError, match="3 processes do not divide blocks.0.q.weight's 32 rows"):
        script.shard_state(tiny(layers=1).state_dict() | {"blocks.0.q.weight": torch.zeros(32, 32)}, 0, 3)


@pytest.mark.launches
def test_tensor_parallel_decode_equals_one_process(tmp_path):
    model = tiny()
    text = "".join(chr(97 + i) for i in range(20))
    saved = tmp_path / "model.pt"
    torch.save({"config": model.config, "state": model.state_dict(), "text": text}, saved)
    out = launch.torchrun(NOTEBOOKS / "scripts" / "tp_decode.py", 2, [str(saved), "abcab", "6"], echo=False)
    assert "tokens equal to one process's: True" in out and "logits within 1e-4 of one process's: True" in out
    assert re.search(r"all-reduces: 24 for 6 tokens .*: 4 per token, 2 per layer", out), out
