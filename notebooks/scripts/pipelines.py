"""Pipeline parallelism on 2 processes with ``torch.distributed.pipelining``, checked against one process: run it
with torchrun.

    torchrun --nproc-per-node=2 scripts/pipelines.py

A stack of 8 identical blocks (Linear(16, 16), then Tanh) is cut into stages of equal numbers of blocks, and a
batch of 8 into 4 micro-batches of 2. Each schedule gets stages of its own, built by hand (``PipelineStage`` on a
slice of the blocks, no tracing), and runs one training step, the MSE loss computed on the last stage:

- ``ScheduleGPipe`` and ``Schedule1F1B``: one stage per rank;
- ``ScheduleInterleaved1F1B``: two stages per rank, looping (rank r holds stages r and r + 2);
- ``ScheduleInterleavedZeroBubble`` on one stage per rank, where it runs ZB-H1 (each backward split into the
  input's gradient, B, and the weights', W, which rank r runs r steps later), and on two, looping.

Left out: ``ScheduleZBVZeroBubble`` and ``ScheduleDualPipeV``, whose V placement (rank 0 holds the first stage and
the last) finishes on torch 2.14 but, over gloo, stops on torch 2.11 (Colab's) as a rank sends to itself: "Pair is
not connected".

Every rank also builds the whole model from the same seed and runs the whole batch through it in one process: each
parameter's gradient, on every rank, must equal that process's within 1e-6, and so must the loss (the mean of the
micro-batches' mean losses, which is the batch's mean since the micro-batches are equal).

What each rank ran, in order (F, B or W of a micro-batch through one of its stages), is recorded as it runs and
compared with chapter 9's simulator, ``d2l_ext.pipeline.schedule``. While each step runs, ``saved_tensors_hooks``
follow the bytes of the tensors autograd saves for backward that are alive at once, parameters left out, each
region of memory counted once: on rank 0, GPipe holds all 4 micro-batches' activations before its first backward,
1F1B at most p = 2; divided by what one micro-batch saves through one stage, the peaks are the simulator's
in-flight counts. Each process picks its device as scripts/ddp_train.py does (its own GPU over NCCL when every
process has one, else the CPU over gloo); rank 0 prints what every rank found, in rank order.
"""

from __future__ import annotations

import copy
import os
import sys
import warnings
import weakref
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn

from d2l_ext.pipeline import Op, schedule, simulate
from d2l_ext.ranks import from_every_rank, join, leave, say

WIDTH, BLOCKS, BATCH, MICROBATCHES, RANKS = 16, 8, 8, 4, 2
TOLERANCE = 1e-6


class Plan(NamedTuple):
    """A schedule as this script runs it: a name, torch's class, stages per rank (rank r holds r, r + p, ...), and
    the simulator's name for it, if the simulator has it."""

    name: str
    torch_class: str
    per_rank: int
    simulated: str | None = None


PLANS = (Plan("GPipe", "ScheduleGPipe", 1, simulated="gpipe"),
         Plan("1F1B", "Schedule1F1B", 1, simulated="1f1b"),
         Plan("Interleaved1F1B", "ScheduleInterleaved1F1B", 2, simulated="interleaved"),
         Plan("ZB-H1 (InterleavedZeroBubble)", "ScheduleInterleavedZeroBubble", 1, simulated="zb-h1"),
         Plan("InterleavedZeroBubble", "ScheduleInterleavedZeroBubble", 2))


def split_blocks(blocks: int, stages: int) -> list[range]:
    """Return the blocks of each stage, in order: equal runs; ValueError if ``stages`` does not divide ``blocks``."""
    if stages < 1 or blocks < 1 or blocks % stages:
        raise ValueError(f"{blocks} blocks do not split into {stages} stages of equal size")
    size = blocks // stages
    return [range(stage * size, (stage + 1) * size) for stage in range(stages)]


def stages_of(rank: int, ranks: int, per_rank: int) -> list[int]:
    """Return the stages ``rank`` holds, first to last, looping: r, r + p, r + 2p, ... ValueError for a rank outside
    0..ranks - 1, or fewer than one stage per rank."""
    if not 0 <= rank < ranks:
        raise ValueError(f"rank {rank} is not in 0..{ranks - 1}")
    if per_rank < 1:
        raise ValueError(f"a rank holds at least one stage, not {per_rank}")
    return [rank + k * ranks for k in range(per_rank)]


def check_microbatches(plan: Plan, batch: int, microbatches: int, ranks: int) -> int:
    """Return the size of a micro-batch, or raise ValueError. The batch must split into equal micro-batches (so that
    the mean of their mean losses is the batch's); and what the schedule's own class checks (torch 2.14) is checked
    here first: Schedule1F1B needs at least as many micro-batches as stages, the interleaved
    ones (1F1B and zero-bubble) a multiple of their rounds, max(1, m // p)."""
    if microbatches < 1 or batch % microbatches:
        raise ValueError(f"a batch of {batch} does not split into {microbatches} equal micro-batches")
    stages = ranks * plan.per_rank
    if plan.torch_class == "Schedule1F1B" and microbatches < stages:
        raise ValueError(f"{plan.name} needs at least as many micro-batches as stages: {microbatches} < {stages}")
    rounds = max(1, microbatches // ranks)
    if plan.torch_class.startswith("ScheduleInterleaved") and microbatches % rounds:
        raise ValueError(f"{plan.name} needs micro-batches in a multiple of its rounds, max(1, m // p) = {rounds}: "
                         f"not {microbatches}")
    return batch // microbatches


def whole_model(device: torch.device) -> nn.Sequential:
    """The whole model, the same on every rank."""
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()) for _ in range(BLOCKS))).to(device)


class Saved:
    """A tensor saved for backward, as autograd keeps it: when autograd lets go of this, its bytes are released."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor


class SavedBytes:
    """Follow the bytes of the tensors autograd saves for backward that are alive at once, and their peak: each
    region of memory (address, size) once, however many operations save it; ``parameters`` left out.

    Each saved tensor is packed into a ``Saved`` holder, which autograd keeps as long as it needs the tensor; when
    the holder is freed (once the backward that used it is done), its bytes are released. The holder keeps a
    detached alias: the tensor itself would refer to the node that saved it (for a saved output, Tanh's), a cycle
    through autograd that no garbage collector sees, never freed where a schedule keeps its graph between the
    input's gradient and the weights' (the zero-bubble schedules)."""

    def __init__(self, parameters: list[nn.Parameter]):
        self.parameters = {p.untyped_storage().data_ptr() for p in parameters}
        self.holders: dict[tuple[int, int], int] = {}  # (address, bytes) -> holders alive
        self.now = self.peak = 0

    def pack(self, tensor: torch.Tensor) -> object:
        if tensor.untyped_storage().data_ptr() in self.parameters:
            return tensor
        region = (tensor.data_ptr(), tensor.numel() * tensor.element_size())
        if region not in self.holders:
            self.holders[region] = 0
            self.now += region[1]
            self.peak = max(self.peak, self.now)
        self.holders[region] += 1
        holder = Saved(tensor.detach())
        weakref.finalize(holder, self.release, region)
        return holder

    def release(self, region: tuple[int, int]) -> None:
        self.holders[region] -= 1
        if not self.holders[region]:
            del self.holders[region]
            self.now -= region[1]

    @staticmethod
    def unpack(packed: object) -> torch.Tensor:
        tensor = packed.tensor if isinstance(packed, Saved) else packed
        assert isinstance(tensor, torch.Tensor)
        return tensor

    def hooks(self) -> torch.autograd.graph.saved_tensors_hooks:
        return torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)


def record(stage, chunk: int, ran: list[Op]) -> None:
    """Make ``stage`` (``chunk``: its place among its rank's stages) append to ``ran`` each operation a schedule
    asks of it, as the simulator writes it: F, B (the whole backward, or the input's gradient only where the
    weights' come later) or W. On the first stage, whose input needs no gradient, torch's B of a zero-bubble
    schedule computes nothing and its W the whole backward; the order is the same."""
    forward, backward, weights = stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk

    def forward_one_chunk(microbatch: int, *args, **kwargs):
        ran.append(Op("F", microbatch, chunk))
        return forward(microbatch, *args, **kwargs)

    def backward_one_chunk(microbatch: int, *args, **kwargs):
        ran.append(Op("B", microbatch, chunk))
        return backward(microbatch, *args, **kwargs)

    def backward_weight_one_chunk(microbatch: int, *args, **kwargs):
        ran.append(Op("W", microbatch, chunk))
        return weights(microbatch, *args, **kwargs)

    stage.forward_one_chunk = forward_one_chunk
    stage.backward_one_chunk = backward_one_chunk
    stage.backward_weight_one_chunk = backward_weight_one_chunk


def notation(order: list[Op]) -> str:
    """An order as text: each operation's kind and micro-batch, a ' on the rank's second stage (F0 F1 F0' ...)."""
    return " ".join(f"{op.kind}{op.microbatch}" + "'" * op.chunk for op in order)


class Step(NamedTuple):
    """What one rank found in one schedule's step."""

    same: bool  # its gradients (and the loss, where it holds the last stage) equal to one process's
    ran: list[Op]  # what it ran, in order
    peak: int  # the most bytes saved for backward alive at once
    one_microbatch: list[int]  # the bytes one micro-batch saves through each of its stages


def one_microbatch_bytes(module: nn.Module, stage: int, stages: int, size: int, device: torch.device,
                         loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> int:
    """Bytes one micro-batch saves for backward through ``module`` as stage ``stage`` (the loss too, on the last)."""
    x = torch.zeros(size, WIDTH, device=device, requires_grad=stage > 0)  # a later stage's input needs a gradient
    counter = SavedBytes(list(module.parameters()))
    with counter.hooks():
        y = module(x)
        if stage == stages - 1:
            loss_fn(y, torch.zeros_like(y))
    return counter.peak


def step(plan: Plan, reference: nn.Sequential, x: torch.Tensor, target: torch.Tensor, expected_loss: float,
         device: torch.device) -> Step:
    """Run one training step of ``plan``'s schedule on copies of ``reference``'s blocks, which has run the whole
    batch; compare each gradient and the loss with its own."""
    from torch.distributed import pipelining
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

    rank, ranks = dist.get_rank(), dist.get_world_size()
    size = check_microbatches(plan, len(x), MICROBATCHES, ranks)
    stages = ranks * plan.per_rank
    split = split_blocks(len(reference), stages)
    mine = stages_of(rank, ranks, plan.per_rank)
    modules = [copy.deepcopy(reference[split[s].start:split[s].stop]) for s in mine]
    for module in modules:
        module.zero_grad(set_to_none=True)  # the copies came with the reference's gradients
    # a micro-batch's shapes given up front: no stage infers them by running a micro-batch before the step
    pipeline_stages = [pipelining.PipelineStage(
        module, s, stages, device,
        input_args=torch.empty(size, WIDTH, device=device, requires_grad=s > 0),
        output_args=torch.empty(size, WIDTH, device=device, requires_grad=True))
        for s, module in zip(mine, modules, strict=True)]
    ran: list[Op] = []
    for chunk, stage in enumerate(pipeline_stages):
        record(stage, chunk, ran)
    loss_fn = nn.MSELoss()
    schedule_class = getattr(pipelining, plan.torch_class)
    if issubclass(schedule_class, PipelineScheduleSingle):  # GPipe, 1F1B: one stage, not a list
        pipe = schedule_class(pipeline_stages[0], MICROBATCHES, loss_fn=loss_fn)
    else:
        pipe = schedule_class(pipeline_stages, MICROBATCHES, loss_fn=loss_fn)
    counter = SavedBytes([p for module in modules for p in module.parameters()])
    losses: list[torch.Tensor] = []
    with counter.hooks():
        pipe.step(*((x,) if 0 in mine else ()), target=target, losses=losses)  # the first stage takes the batch
    same = True
    for s, module in zip(mine, modules, strict=True):
        whole = reference[split[s].start:split[s].stop]
        for ours, theirs in zip(module.parameters(), whole.parameters(), strict=True):
            assert ours.grad is not None and theirs.grad is not None, "no gradient: backward did not reach it"
            same &= torch.allclose(ours.grad, theirs.grad, atol=TOLERANCE, rtol=0)
    if stages - 1 in mine:  # the mean of the micro-batches' mean losses
        same &= abs(torch.stack(losses).mean().item() - expected_loss) <= TOLERANCE
    one = [one_microbatch_bytes(module, s, stages, size, device, loss_fn)
           for s, module in zip(mine, modules, strict=True)]
    return Step(bool(same), ran, counter.peak, one)


def saved_activations(found: dict[str, list[Step]], ranks: int) -> list[str]:
    """Lines on rank 0's saved activations: what one micro-batch saves through a stage, against the formula; the
    peaks of GPipe and 1F1B; and in each schedule the simulator has, the peak in micro-batches' worth (through one
    stage), against the simulator's in-flight count for rank 0."""
    size = BATCH // MICROBATCHES
    simulated = [plan for plan in PLANS if plan.simulated is not None]
    # rank 0 holds the first stage and never the last in these: every stage of it saves the same bytes
    per_stage = {plan.per_rank: found[plan.name][0].one_microbatch[0] for plan in simulated}
    blocks = {per_rank: BLOCKS // (ranks * per_rank) for per_rank in per_stage}
    # each block saves its Linear's input and its Tanh's output, and the next block's Linear saves that same
    # output as its input: a stage of k blocks saves k + 1 tensors of a micro-batch's activations
    formula = {per_rank: (k + 1) * size * WIDTH * 4 for per_rank, k in blocks.items()}
    held, expected = [], []
    for plan in simulated:
        assert plan.simulated is not None
        mine = found[plan.name][0]
        assert len(set(mine.one_microbatch)) == 1, "rank 0's stages save different bytes per micro-batch"
        held.append(f"{plan.simulated} {mine.peak / mine.one_microbatch[0]:g}")
        orders = schedule(plan.simulated, ranks, MICROBATCHES, plan.per_rank)
        # a zero-bubble rank keeps a stage's activations until its W
        expected.append(str(simulate(orders, v=plan.per_rank, t_w=int(plan.simulated == "zb-h1")).in_flight(0)))
    one, gpipe, one_f_one_b = per_stage[1], found["GPipe"][0].peak, found["1F1B"][0].peak
    return [f"one micro-batch saves {', '.join(f'{per_stage[n]:,} B through {k} blocks' for n, k in blocks.items())}"
            f"; (blocks + 1) x {size} x {WIDTH} x 4 B: {', '.join(f'{b:,} B' for b in formula.values())}",
            f"saved activations on rank 0 at the peak: GPipe {gpipe / one:g} x {one:,} B, 1F1B {one_f_one_b / one:g} "
            f"x {one:,} B (ratio {gpipe / one_f_one_b:g})",
            f"rank 0's peak in micro-batches per stage: {', '.join(held)}; simulated in flight: {', '.join(expected)}"]


def main() -> None:
    world_size = int(os.environ.get("WORLD_SIZE", "0"))
    if world_size != RANKS:
        sys.exit("start it on 2 processes: torchrun --nproc-per-node=2 scripts/pipelines.py")
    warnings.filterwarnings("ignore", module="torch.distributed")  # notices printed by every rank
    _, device, backend = join()
    say(f"{world_size} processes, backend {backend}, devices {from_every_rank(str(device))}")
    reference = whole_model(device)
    torch.manual_seed(1)
    x, target = torch.randn(BATCH, WIDTH, device=device), torch.randn(BATCH, WIDTH, device=device)
    loss = nn.MSELoss()(reference(x), target)
    loss.backward()  # one process: the whole model on the whole batch
    say(f"model: {BLOCKS} blocks of Linear({WIDTH}, {WIDTH}) + Tanh, MSE loss; a batch of {BATCH} in "
        f"{MICROBATCHES} micro-batches of {BATCH // MICROBATCHES}")
    found: dict[str, list[Step]] = {}
    for plan in PLANS:
        found[plan.name] = steps = from_every_rank(step(plan, reference, x, target, loss.item(), device))
        held = [stages_of(rank, world_size, plan.per_rank) for rank in range(world_size)]
        say(f"{plan.name} on stages {held}: same gradients and loss as one process (within 1e-6): "
            f"{all(s.same for s in steps)}")
    say("rank 0's order as run (F, B, W of a micro-batch, ' on its second stage); True: every rank's as simulated")
    for plan in PLANS:
        if plan.simulated is not None:
            ran = [s.ran for s in found[plan.name]]
            say(f"  {plan.simulated}: {notation(ran[0])}: "
                f"{ran == schedule(plan.simulated, world_size, MICROBATCHES, plan.per_rank)}")
    say(*saved_activations(found, world_size))
    leave()


if __name__ == "__main__":
    main()
