"""d2l_ext.checkpoint in one process: a round trip that restores the optimizer and the step exactly, and clear
errors for a checkpoint that is missing, half-written or from another model."""

from __future__ import annotations

import shutil

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from d2l_ext import checkpoint

READS_NOTEBOOKS = False  # no notebook, edition or markdown file: tools/result_cache.py keys it on code only


def trained(hidden: int = 8, steps: int = 3) -> tuple[nn.Sequential, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for step in range(steps):
        x = torch.randn(16, 4, generator=torch.Generator().manual_seed(step))
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer


def state(model: nn.Module, optimizer: torch.optim.Optimizer, step: int = 0) -> dict:
    model_state, optimizer_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optimizer_state, "progress": {"step": step}}


def test_a_round_trip_restores_parameters_adam_and_the_step_exactly(tmp_path):
    model, optimizer = trained()
    folder = checkpoint.save(tmp_path, 3, state(model, optimizer, step=3))
    assert folder.name == "step_000003" and checkpoint.is_complete(folder)
    names = [name for name, _ in checkpoint.files(folder)]
    assert names == [".metadata", "__0_0.distcp"]  # one process: one shard file, and the metadata
    fresh_model, fresh_optimizer = trained(steps=0)
    target = state(fresh_model, fresh_optimizer)
    checkpoint.load(folder, target)
    set_state_dict(fresh_model, fresh_optimizer, model_state_dict=target["model"],
                   optim_state_dict=target["optim"])
    assert target["progress"]["step"] == 3
    for a, b in zip(model.parameters(), fresh_model.parameters(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(optimizer.state.values(), fresh_optimizer.state.values(), strict=True):
        assert all(torch.equal(a[k], b[k]) for k in ("exp_avg", "exp_avg_sq", "step"))


def test_latest_skips_a_half_written_checkpoint(tmp_path):
    model, optimizer = trained()
    assert checkpoint.latest(tmp_path / "none") is None
    for step in (3, 6):
        checkpoint.save(tmp_path, step, state(model, optimizer, step))
    assert checkpoint.latest(tmp_path) == tmp_path / "step_000006"
    (tmp_path / "step_000006" / ".metadata").unlink()  # as if the process was killed during the save
    (tmp_path / "step_000009").mkdir()  # a save killed before it wrote anything
    assert checkpoint.latest(tmp_path) == tmp_path / "step_000003"
    assert checkpoint.step_of(tmp_path / "step_000003") == 3


@pytest.mark.parametrize("damage, words", [
    ("missing", "no such folder"),
    ("half-written", "half-written: no .metadata"),
    ("wider model", "from another model: 0.weight"),
    ("deeper model", "from another model: it has no model.4.bias, model.4.weight"),
])
def test_a_bad_checkpoint_fails_naming_its_folder_and_what_is_wrong(tmp_path, damage, words):
    model, optimizer = trained()
    folder = checkpoint.save(tmp_path, 3, state(model, optimizer, 3))
    target_model, target_optimizer = trained(steps=0)
    if damage == "missing":
        shutil.rmtree(folder)
    elif damage == "half-written":
        (folder / ".metadata").unlink()
    elif damage == "wider model":
        target_model, target_optimizer = trained(hidden=16, steps=0)
    else:
        target_model = nn.Sequential(*target_model, nn.ReLU(), nn.Linear(2, 2))
        target_optimizer = torch.optim.Adam(target_model.parameters())
    with pytest.raises(checkpoint.CheckpointError) as error:
        checkpoint.load(folder, state(target_model, target_optimizer))
    assert str(folder) in str(error.value) and words.replace("0.weight", "") in str(error.value), error.value


def test_a_negative_step_is_refused(tmp_path):
    with pytest.raises(ValueError, match="0 or more"):
        checkpoint.folder_for(tmp_path, -1)
