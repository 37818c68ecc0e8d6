"""Chapter 15's check of the planner against real runs: one launch of 4 gloo processes, every layout they allow.

    torchrun --nproc-per-node=4 scripts/plan_check.py OUT.json

A stack of 4 of the course's blocks (``d2l_ext.planner_model.Block``: hidden 64, 8 heads, 4 KV heads, FFN 128,
float32) trains with Adam on 8 sequences of 32 random vectors, under DP (DDP), FSDP2, TP, TP+SP, PP (1F1B over 4
stages, 4 micro-batches), FSDP2 x TP (2 x 2) and PP x DP (2 x 2, DDP inside each stage). Each layout runs one step
to make Adam's state, then one step measured:

- ``MemTracker`` (torch.distributed._tools.mem_tracker) follows every tensor of the step; per rank, the most
  bytes of each kind (parameters, gradients, optimizer state, activations) over its snapshots: the step's peak,
  and each module's before, after and at its own peak, forward and backward;
- ``CommDebugMode`` counts the collectives the step calls through the dispatcher (DTensor's and FSDP2's). DDP's
  reducer calls gloo from C++, where CommDebugMode cannot see it: a communication hook counts its all-reduces.
  Pipeline sends and receives are point-to-point, not collectives: CommDebugMode counts none, nor does the planner.

Rank 0 writes every rank's figures to OUT.json, which the notebook compares with ``d2l_ext.planner``.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.torch_version import TorchVersion

from d2l_ext.planner_model import Block
from d2l_ext.ranks import from_every_rank, join, leave, say

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipelines import Saved, SavedBytes  # noqa: E402 (chapter 9's script, beside this one)

LAYOUTS = ("DP", "FSDP2", "TP", "TP+SP", "PP", "FSDP2 x TP", "PP x DP")
HIDDEN, HEADS, KV_HEADS, FFN, LAYERS, SEQ, BATCH, MICROBATCHES = 64, 8, 4, 128, 4, 32, 8, 4


class Stack(nn.Module):
    def __init__(self, blocks: int):
        super().__init__()
        self.blocks = nn.ModuleList(Block(HIDDEN, HEADS, KV_HEADS, FFN) for _ in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def data(share: int, parts: int) -> torch.Tensor:
    """This rank's share of the global batch (the same data in every run), as an activation, not a leaf."""
    x = torch.randn(BATCH, SEQ, HIDDEN, generator=torch.Generator().manual_seed(0))
    return x.chunk(parts)[share]


def tp_plan(sequence: bool) -> dict[str, Any]:
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    into = {"input_layouts": Shard(1)} if sequence else {}
    out = {"output_layouts": Shard(1)} if sequence else {}
    plan: dict[str, Any] = {name: ColwiseParallel(**into) for name in ("q", "k", "v", "gate", "up")}
    plan.update(o=RowwiseParallel(**out), down=RowwiseParallel(**out))
    if sequence:
        plan.update(norm1=SequenceParallel(), norm2=SequenceParallel())
    return plan


class Replicas(nn.Module):
    """A pipeline stage's blocks once per micro-batch, every copy made of the stage's own parameters. MemTracker
    refuses a module called more than once a step, and a stage runs once per micro-batch: each micro-batch runs its
    own copy, so every module it sees is called once. Called without module hooks, this wrapper is invisible to it."""

    def __init__(self, stage: Stack, copies: int):
        super().__init__()
        self.stage, self.calls = stage, 0
        self.copies = [Stack(0) for _ in range(copies)]  # a plain list: no parameters of their own to register
        blocks = list(stage.blocks)
        for copy in self.copies:
            copy.blocks = nn.ModuleList(Block(HIDDEN, HEADS, KV_HEADS, FFN) for _ in blocks)
            for mine, theirs in zip(copy.blocks, blocks, strict=True):
                for name, module in mine.named_modules():
                    for parameter in list(dict(module.named_parameters(recurse=False))):
                        setattr(module, parameter, getattr(theirs.get_submodule(name), parameter))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # no hooks: MemTracker sees only the copies
        return self.forward(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.copies[(self.calls - 1) % len(self.copies)](x)


def counted_ddp(module: nn.Module, counts: dict, group: Any = None) -> nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    class Unhooked(DistributedDataParallel):  # called once a micro-batch in a pipeline: see Replicas
        def __call__(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN204
            return self.forward(*args, **kwargs)

    ddp = (Unhooked if isinstance(module, Replicas) else DistributedDataParallel)(module, process_group=group)

    def hook(state, bucket):  # noqa: ANN001 (DDP's signature)
        counts["all_reduce (DDP buckets)"] = counts.get("all_reduce (DDP buckets)", 0) + 1
        work = dist.all_reduce(bucket.buffer().div_(dist.get_world_size(group)), group=group, async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])

    ddp.register_comm_hook(None, hook)
    return ddp


def build(layout: str, counts: dict) -> tuple[Any, torch.Tensor, Any]:
    """This rank's model, its input and a step function (forward, backward) for ``layout``."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    if layout in ("PP", "PP x DP"):
        return pipelined(layout, counts)
    model = Stack(LAYERS)
    if layout == "DP":
        return counted_ddp(model, counts), data(rank, world), None
    if layout == "FSDP2":
        for block in model.blocks:
            fully_shard(block)
        return fully_shard(model), data(rank, world), None
    if layout in ("TP", "TP+SP"):
        mesh = init_device_mesh("cpu", (world,))
        for block in model.blocks:
            parallelize_module(block, mesh, tp_plan(layout == "TP+SP"))
        x = data(0, 1)
        return model, x.chunk(world, dim=1)[rank] if layout == "TP+SP" else x, None
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))  # FSDP2 x TP
    for block in model.blocks:
        parallelize_module(block, mesh["tp"], tp_plan(False))
        fully_shard(block, mesh=mesh["dp"])
    return fully_shard(model, mesh=mesh["dp"]), data(mesh["dp"].get_local_rank(), 2), None


def pipelined(layout: str, counts: dict) -> tuple[Any, torch.Tensor, Any]:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    rank, world = dist.get_rank(), dist.get_world_size()
    stages = 4 if layout == "PP" else 2
    stage, replica = rank % stages, rank // stages
    model = Stack(LAYERS)
    blocks = LAYERS // stages
    module = Stack(0)
    module.blocks = nn.ModuleList(model.blocks[stage * blocks:(stage + 1) * blocks])
    wrapped: nn.Module = Replicas(module, MICROBATCHES)
    if layout == "PP x DP":
        groups = [dist.new_group([s + r * stages for r in range(world // stages)]) for s in range(stages)]
        pp_groups = [dist.new_group(list(range(r * stages, (r + 1) * stages))) for r in range(world // stages)]
        wrapped = counted_ddp(wrapped, counts, groups[stage])
        pp_group: Any = pp_groups[replica]
    else:
        pp_group = None
    pipe = PipelineStage(wrapped, stage, stages, torch.device("cpu"), group=pp_group)
    schedule = Schedule1F1B(pipe, MICROBATCHES, loss_fn=lambda y, _: y.square().mean())
    x = data(replica, world // stages)

    def step() -> None:
        target = torch.zeros(1)
        if stage == 0:
            schedule.step(x)
        elif stage == stages - 1:
            schedule.step(target=target.expand(x.shape[0]), losses=[])
        else:
            schedule.step()

    return wrapped, x, step


def local_bytes(tensors) -> int:  # noqa: ANN001 (any tensors)
    """Bytes of the part of ``tensors`` this rank holds (a DTensor's local shard)."""
    return sum(local(t).numel() * local(t).element_size() for t in tensors if isinstance(t, torch.Tensor))


def local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class LocalSaved(SavedBytes):
    """Chapter 9's count of the bytes autograd saves, alive at once; a DTensor counted by its local shard. The
    weights FSDP2 gathers are parameters of the model while a layer runs: not counted either."""

    def __init__(self, model: nn.Module):
        super().__init__([local(p) for p in model.parameters()])  # type: ignore[arg-type]
        self.model = model

    def pack(self, tensor: torch.Tensor) -> object:
        gathered = {local(p).untyped_storage().data_ptr() for p in self.model.parameters()}
        if local(tensor).untyped_storage().data_ptr() in gathered:
            return tensor
        if not isinstance(tensor, DTensor):
            return super().pack(tensor)
        holder = super().pack(tensor.to_local())
        if not isinstance(holder, Saved):  # a parameter's shard: not counted
            return tensor
        holder.tensor = tensor.detach()  # autograd gets its DTensor back; the count keeps the shard's bytes
        return holder


def measure(layout: str) -> dict:
    """One measured step of ``layout`` on this rank: the bytes of each kind and the collectives."""
    counts: dict = {}
    model, x, step = build(layout, counts)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def one_step() -> None:
        if step is None:
            model(x * 1).square().mean().backward()
        else:
            step()
        optimizer.step()

    one_step()  # Adam's state now exists
    if layout in ("DP", "PP x DP"):  # DDP's second step rebuilds its buckets in the order the first backward
        one_step()  # made gradients, and broadcasts that order from rank 0 (twice, once a run): not a step's
    optimizer.zero_grad(set_to_none=False)
    counts.clear()
    parameters = list(model.parameters())
    saved = LocalSaved(model)
    tracker = MemTracker()
    # torch 2.11's CommDebugMode (Colab's) stops a pipeline stage's forward (an IndexError in its module tracker;
    # 2.14's does not): before 2.14 the pipelined layouts' collectives are counted by DDP's comm hook, the only
    # collectives they call (a pipeline's own sends are point-to-point, which CommDebugMode does not count either)
    by_hook = step is not None and TorchVersion(torch.__version__) < "2.14"
    with contextlib.ExitStack() as stack:
        tracker.track_external(model, optimizer)
        stack.enter_context(tracker)
        comm = None if by_hook else stack.enter_context(CommDebugMode())
        stack.enter_context(saved.hooks())
        one_step()
    if comm is not None:
        counts.update({str(op).split(".")[-1]: n for op, n in comm.get_comm_counts().items()})
    elif counts.get("all_reduce (DDP buckets)"):
        counts["allreduce_"] = counts["all_reduce (DDP buckets)"]
    found = {"parameters": local_bytes(parameters), "gradients": local_bytes(p.grad for p in parameters),
             "optimizer state": local_bytes(v for state in optimizer.state.values() for v in state.values()),
             "activations": saved.peak}
    return {"counted": found, "memtracker": most_of_each_kind(tracker), "collectives": counts}


def most_of_each_kind(tracker: MemTracker) -> dict[str, int]:
    """The most bytes of each kind MemTracker saw: over its snapshots of the step's peak and of every module before,
    after and at its own peak, forward and backward. The step's peak alone is one moment, where some kinds are
    not at their most (FSDP2's gradients, mid-backward)."""
    snapshots = [tracker.get_tracker_snapshot("peak")]
    for stats in tracker.memory_tracking.values():
        snapshots += [snapshot for taken in stats.snapshots.values() for snapshot in taken]
    most: dict[str, int] = {}
    for snapshot in snapshots:
        for device, kinds in snapshot.items():
            if torch.device(device).type == "cpu":
                for kind, n in kinds.items():
                    name = str(kind).split(".")[-1]
                    most[name] = max(most.get(name, 0), n)
    return most


def main() -> None:
    warnings.filterwarnings("ignore")
    # a rank still running after 150 s (the notebook stops the launch at 200) writes where each of its threads
    # is to stderr, which the launch's error shows: a run that hangs says where
    faulthandler.dump_traceback_later(150, exit=False)
    join(cpu=True)
    results = {}
    for layout in sys.argv[2:] or LAYOUTS:
        try:
            results[layout] = from_every_rank(measure(layout))
        except Exception as err:
            raise RuntimeError(f"{layout}: {err}") from err
        dist.barrier()
        say(f"{layout}: measured")  # progress, as each layout is done
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as out:
            json.dump(results, out, indent=1)
    faulthandler.cancel_dump_traceback_later()
    leave()


if __name__ == "__main__":
    main()
