"""Training that survives a killed worker: checkpoints every few steps, and a restart that resumes from the last one.

    torchrun --nproc-per-node=2 --max-restarts=1 scripts/survive.py --checkpoints ck --out final.pt --kill 1:7

Chapter 6's classifier trains with DDP and Adam for ``--steps`` steps; every ``--every`` steps all ranks save a
checkpoint with torch.distributed.checkpoint (d2l_ext.checkpoint): the parameters, Adam's state and the step.
The data order is a function of the step alone (each epoch's shuffle is seeded by the epoch, each step takes the
next global batch of it, and each rank its 1/world-size slice), so restoring the step restores the data order too.

``--kill RANK:STEP``: that rank kills itself with SIGKILL (as the out-of-memory killer or a scheduler would) at the
start of that step, in the first attempt only. torchrun (``--max-restarts``) then stops the other workers and
starts them all again; they resume from the newest complete checkpoint and redo the steps since. A start with
fewer workers (an elastic job that lost a node) resumes the same way, each rank taking a larger slice.

Rank 0 prints each step with the attempt that ran it (``TORCHELASTIC_RESTART_COUNT``), and at the end writes the
final parameters to ``--out``, to compare with an uninterrupted run's.

``--timeout`` (30 s): how long a collective may wait for a peer. With gloo a dead peer makes the collective fail
at once. With NCCL (one GPU per worker) it waits until this timeout, when NCCL's watchdog aborts the process
(``TORCH_NCCL_ASYNC_ERROR_HANDLING=3``, the default, set by ``join``); only then does torchrun's agent see a failed
worker and restart. NCCL's default timeout, 10 minutes, would make a lost node cost 10 minutes. Two heartbeats
matter too: the rendezvous' keep-alive (the agents'; chapter 11 passes ``keep_alive_interval=1,
keep_alive_max_attempt=3``), after which the next round drops a lost node; and NCCL's own monitor
(``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC``), which aborts a process whose watchdog stops beating. With error handling 3
the watchdog does not call into NCCL to abort a communicator, so we expect it not to hang there (not run here;
PyTorch's "ProcessGroupNCCL Environment Variables" page). A step is printed "done" only once the device has finished
it: NCCL's collectives return before they complete.
``D2L_EXT_LIKE_NCCL=1`` makes a CPU run fail the NCCL way (``d2l_ext.ranks.fail_as_nccl_would``).
"""

from __future__ import annotations

import argparse
import os
import signal

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel

from d2l_ext import checkpoint
from d2l_ext.ranks import fail_as_nccl_would, from_every_rank, join, leave, say, write_lines
from ddp_train import model, synthetic_data  # chapter 6's model and data (scripts/ddp_train.py)

ENVIRONMENT = ["RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"]


def global_batch(step: int, samples: int, batch_size: int) -> torch.Tensor:
    """Return the sample indices of the global batch at ``step``: the same on every rank, in every attempt."""
    per_epoch = samples // batch_size
    epoch, position = divmod(step, per_epoch)
    order = torch.randperm(samples, generator=torch.Generator().manual_seed(epoch))
    return order[position * batch_size:(position + 1) * batch_size]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--every", type=int, default=3, help="checkpoint every this many steps")
    parser.add_argument("--checkpoints", required=True, help="the folder of the checkpoints (step_NNNNNN)")
    parser.add_argument("--out", required=True, help="where rank 0 writes the final parameters")
    parser.add_argument("--kill", default="", metavar="RANK:STEP", help="this rank kills itself at this step")
    parser.add_argument("--kill-node", default="", metavar="NODE:STEP",
                        help="this node (D2L_EXT_NODE, as d2l_ext.launch.torchrun_nodes numbers them) dies at this "
                             "step: its first worker kills its agent, then itself")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=64, help="global batch, split across ranks")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds a collective may wait for a peer")
    args = parser.parse_args()
    if args.every < 1 or args.steps < 1 or args.timeout <= 0:
        raise SystemExit("--steps and --every are 1 or more, --timeout more than 0")

    _, device, _ = join(timeout=args.timeout)
    with fail_as_nccl_would(args.timeout):
        train(args, device)
    leave()


def train(args: argparse.Namespace, device: torch.device) -> None:
    """Train from the newest checkpoint to ``args.steps``, saving every ``args.every`` steps."""
    kill_rank, kill_step = (int(x) for x in args.kill.split(":")) if args.kill else (-1, -1)
    kill_node, kill_node_step = (int(x) for x in args.kill_node.split(":")) if args.kill_node else (-1, -1)
    node = int(os.environ.get("D2L_EXT_NODE", "-1"))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    seen = from_every_rank(" ".join(f"{name}={os.environ[name]}" for name in ENVIRONMENT))
    say(*(f"attempt {attempt}, worker {line}" for line in seen))

    torch.manual_seed(0)
    net = model(args.hidden).to(device)
    ddp = DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.Adam(ddp.parameters(), lr=0.01)
    features, labels = (t.to(device) for t in synthetic_data(args.samples, seed=1).tensors)

    start = 0
    last = checkpoint.latest(args.checkpoints)
    if last is not None:  # every rank loads the same checkpoint: the newest one that was finished
        model_state, optimizer_state = get_state_dict(ddp, optimizer)
        state = {"model": model_state, "optim": optimizer_state, "progress": {"step": 0}}
        checkpoint.load(last, state)
        set_state_dict(ddp, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        start = state["progress"]["step"]
        say(f"attempt {attempt}: resumed from {last.name} at step {start}, world size {world_size}")

    share = args.batch_size // world_size
    for step in range(start, args.steps):
        if rank == kill_rank and step == kill_step and attempt == 0:
            write_lines(f"attempt {attempt}: rank {rank} killed at step {step}")
            os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no message: as the out-of-memory killer does
        if node == kill_node and step == kill_node_step and attempt == 0 and os.environ["LOCAL_RANK"] == "0":
            write_lines(f"attempt {attempt}: node {node} dies at step {step} (its agent and rank {rank})")
            os.kill(os.getppid(), signal.SIGKILL)  # the agent: it can restart nothing on this node any more
            os.kill(os.getpid(), signal.SIGKILL)
        batch = global_batch(step, args.samples, args.batch_size)[rank * share:(rank + 1) * share]
        loss = nn.functional.cross_entropy(ddp(features[batch]), labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if device.type == "cuda":  # NCCL's all-reduce returned at once: wait until the step is really done
            torch.cuda.synchronize(device)
        say(f"attempt {attempt}: step {step} done")
        if (step + 1) % args.every == 0:
            model_state, optimizer_state = get_state_dict(ddp, optimizer)
            folder = checkpoint.save(args.checkpoints, step + 1,
                                     {"model": model_state, "optim": optimizer_state, "progress": {"step": step + 1}})
            say(f"attempt {attempt}: checkpoint {folder.name}")
    if rank == 0:
        torch.save({k: v.detach().cpu() for k, v in net.state_dict().items()}, args.out)


if __name__ == "__main__":
    main()
