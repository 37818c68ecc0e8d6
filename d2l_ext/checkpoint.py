"""Checkpoints that survive a killed process and a new number of processes (chapter 11).

Each checkpoint is a folder ``step_000012`` under one root, written by ``torch.distributed.checkpoint`` (DCP):
every rank writes its own shards (``__RANK_0.distcp``) at once, and the coordinator writes ``.metadata`` last,
through a temporary file and a rename. A folder without ``.metadata`` is a save cut short (its process was killed
during it): ``latest`` never takes it, and ``load`` refuses it. Loading reads the shards that the current ranks
need, whatever the number of ranks that saved them: that is how a checkpoint reshards.

The same functions work in one plain process (no process group: DCP says it assumes a single process) and in
every rank of a launched job (every rank must call them together, as any collective).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemReader

# dcp.save and dcp.load (torch.distributed.checkpoint), from the modules that define them
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

STEP_FOLDER = re.compile(r"^step_(\d+)$")


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be loaded: missing, half-written, or from another model."""


def folder_for(root: str | Path, step: int) -> Path:
    """Return the folder that holds the checkpoint taken after ``step`` steps."""
    if step < 0:
        raise ValueError(f"a step count is 0 or more, not {step}")
    return Path(root) / f"step_{step:06d}"


def is_complete(folder: str | Path) -> bool:
    """Return whether ``folder`` holds a finished DCP checkpoint (its ``.metadata``, written last, is there)."""
    return (Path(folder) / ".metadata").is_file()


def latest(root: str | Path) -> Path | None:
    """Return the newest complete checkpoint under ``root``, or None if there is none (a half-written one is
    skipped, never taken for the latest)."""
    root = Path(root)
    if not root.is_dir():
        return None
    steps = [(int(m[1]), p) for p in root.iterdir() if (m := STEP_FOLDER.match(p.name)) and is_complete(p)]
    return max(steps)[1] if steps else None


def step_of(folder: str | Path) -> int:
    """Return the step count a checkpoint folder was taken at (``step_000012`` -> 12)."""
    match = STEP_FOLDER.match(Path(folder).name)
    if not match:
        raise CheckpointError(f"{folder}: not a checkpoint folder (step_NNNNNN)")
    return int(match[1])


def save(root: str | Path, step: int, state: dict[str, Any], process_group: Any = None) -> Path:
    """Save ``state`` (nested dicts of tensors, DTensors and plain values) as the checkpoint after ``step`` steps;
    return its folder. In a launched job every rank calls it and writes its own shards."""
    folder = folder_for(root, step)
    with warnings.catch_warnings():  # in one process: "assuming the intent is to save in a single process"
        warnings.filterwarnings("ignore", message=".*single process.*")
        dcp_save(state, checkpoint_id=folder, process_group=process_group)
    return folder


def _problem(folder: Path, state: dict[str, Any]) -> str | None:
    """Return what makes ``folder`` unfit to load into ``state`` (its tensors' names and shapes), or None."""
    if not folder.is_dir():
        return "no such folder"
    if not is_complete(folder):
        return "half-written: no .metadata (the save was cut short, e.g. its process was killed during it)"
    saved = FileSystemReader(folder).read_metadata().state_dict_metadata
    wanted = dict(_flatten(state))
    missing = sorted(k for k, v in wanted.items() if isinstance(v, torch.Tensor) and k not in saved)
    if missing:
        return f"from another model: it has no {', '.join(missing[:3])}" + (" ..." if len(missing) > 3 else "")
    for key, value in wanted.items():
        size = getattr(saved.get(key), "size", None)
        if isinstance(value, torch.Tensor) and size is not None and tuple(size) != tuple(value.shape):
            return f"from another model: {key} has shape {tuple(size)} there, {tuple(value.shape)} here"
    return None


def _flatten(state: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Return (dotted name, value) for every leaf of nested dicts and lists, named as DCP names them."""
    if isinstance(state, dict):
        return [item for key, value in state.items() for item in _flatten(value, f"{prefix}{key}.")]
    if isinstance(state, list | tuple) and not isinstance(state, torch.Size):
        return [item for i, value in enumerate(state) for item in _flatten(value, f"{prefix}{i}.")]
    return [(prefix[:-1], state)]


def load(folder: str | Path, state: dict[str, Any], process_group: Any = None) -> None:
    """Load the checkpoint in ``folder`` into ``state`` in place (every tensor must already have its shape and,
    in a job, its sharding: each rank reads what its shards need). Raise CheckpointError naming the folder and
    what is wrong when it is missing, half-written or from another model."""
    folder = Path(folder)
    problem = _problem(folder, state)
    if problem is not None:
        raise CheckpointError(f"cannot load the checkpoint {folder}: {problem}")
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*single process.*")
            dcp_load(state, checkpoint_id=folder, process_group=process_group)
    except CheckpointException as err:  # a BaseException: DCP gathers each rank's error into one
        last = str(err).strip().splitlines()[-1]
        raise CheckpointError(f"cannot load the checkpoint {folder}: {last}") from None


def files(folder: str | Path) -> list[tuple[str, int]]:
    """Return (name, bytes) for each file of a checkpoint folder, by name."""
    return sorted((p.name, p.stat().st_size) for p in Path(folder).iterdir() if p.is_file())
