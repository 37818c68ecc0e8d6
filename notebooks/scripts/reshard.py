"""A sharded checkpoint loaded by another number of processes: FSDP2 and Adam saved on N ranks, loaded on M.

    torchrun --nproc-per-node=2 scripts/reshard.py save ck        # train 3 steps, save with DCP
    torchrun --nproc-per-node=4 scripts/reshard.py load ck        # the same state, in 4 shards
    python scripts/reshard.py load ck                             # in one plain process: no process group

Chapter 8's FSDP2 shards every parameter and Adam's moments by rows (Shard(dim=0)) over the ranks. ``save`` trains
chapter 8's model (scripts/fsdp2.py) for 3 steps and saves it with torch.distributed.checkpoint: each rank writes
the rows it holds, and the coordinator writes ``.metadata``, which records where each piece of each tensor is.
Rank 0 also writes the full state (``ck.full.pt``), gathered, to compare with. ``load`` builds the same model
sharded over however many ranks run it (or not sharded, in one plain process), loads the checkpoint into it, and
compares the full state it then holds with the saved one, entry by entry, exactly. Each rank prints the rows it
holds of each weight; the notebook lists the checkpoint's files.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from d2l_ext import checkpoint
from d2l_ext.ranks import from_every_rank, join, leave, say
from fsdp2 import model  # chapter 8's model (scripts/fsdp2.py)


def sharded(device: torch.device) -> nn.Sequential:
    """Return chapter 8's model, its Linear layers and root sharded with FSDP2 over every rank."""
    torch.manual_seed(0)
    net = model().to(device)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    return net


def flat(state: dict, prefix: str = "") -> dict[str, object]:
    """Return the leaves of nested dicts and lists by dotted name."""
    items = state.items() if isinstance(state, dict) else enumerate(state) if isinstance(state, list) else None
    if items is None:
        return {prefix[:-1]: state}
    return {name: leaf for key, value in items for name, leaf in flat(value, f"{prefix}{key}.").items()}


def full_state(net: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, object]:
    """Return the model's and Adam's whole state, gathered from the shards, on the CPU, by dotted name."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state, optimizer_state = get_state_dict(net, optimizer, options=options)
    return flat({"model": model_state, "optim": optimizer_state})


def same(a: object, b: object) -> bool:
    return torch.equal(a, b) if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) else a == b


def main() -> None:
    mode, folder = sys.argv[1], Path(sys.argv[2]) / "step_000003"
    launched = "RANK" in os.environ
    if launched:
        _, device, _ = join()
        net = sharded(device)
    else:  # one plain process: the whole model, no process group, no sharding
        device = torch.device("cpu")
        torch.manual_seed(0)
        net = model()
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
    world_size = dist.get_world_size() if launched else 1

    if mode == "save":
        rank, share = dist.get_rank(), 48 // world_size
        for step in range(3):
            X = torch.randn(48, 64, generator=torch.Generator().manual_seed(step)).to(device)
            y = (X[:, 0] + X[:, 1] > 0).long()
            nn.functional.cross_entropy(net(X[rank * share:(rank + 1) * share]),
                                        y[rank * share:(rank + 1) * share]).backward()
            optimizer.step()
            optimizer.zero_grad()
        model_state, optimizer_state = get_state_dict(net, optimizer)
        checkpoint.save(folder.parent, 3, {"model": model_state, "optim": optimizer_state})
        whole = full_state(net, optimizer)
        if rank == 0:
            torch.save(whole, folder.parent / "full.pt")
    else:
        model_state, optimizer_state = get_state_dict(net, optimizer)  # Adam's state, created to be filled
        state = {"model": model_state, "optim": optimizer_state}
        checkpoint.load(folder, state)
        set_state_dict(net, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        whole = full_state(net, optimizer) if launched else flat({"model": net.state_dict(),
                                                                  "optim": get_state_dict(net, optimizer)[1]})
        saved = torch.load(folder.parent / "full.pt")
        wrong = sorted(k for k in saved if k not in whole or not same(saved[k], whole[k]))
        tensors = sum(isinstance(v, torch.Tensor) for v in saved.values())
        verdict = (f"loaded on {world_size} {'ranks' if launched else 'plain process'}: {len(saved)} entries "
                   f"({tensors} tensors) equal to the saved ones: {not wrong}")
        verdict += f" (not {wrong[:3]})" if wrong else ""
        if not launched:
            print(verdict, flush=True)
            return
        say(verdict)
    weights = {f"{i}.weight": layer.weight for i, layer in enumerate(net) if isinstance(layer, nn.Linear)}
    local = ", ".join(f"{name} {tuple(w.to_local().shape) if isinstance(w, DTensor) else tuple(w.shape)}"
                      for name, w in weights.items())
    say(f"whole: {', '.join(f'{name} {tuple(w.shape)}' for name, w in weights.items())}",
        *(f"rank {r} holds: {rows}" for r, rows in enumerate(from_every_rank(local))))
    leave()


if __name__ == "__main__":
    main()
