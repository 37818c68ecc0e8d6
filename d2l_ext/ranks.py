"""What a process that torchrun started does: take its device and join the process group (``join``), print on rank 0
what every rank found (``say``, ``from_every_rank``), and leave without hanging (``leave``).

The training scripts in ``notebooks/scripts`` import these; the notebook's side of a launch (starting the processes,
bounding them in time, turning a failure into an error) is ``d2l_ext.launch``.

``fail_as_nccl_would``: with gloo, a collective whose peer is gone raises at once ("Connection closed by peer"); with
NCCL it waits until the process group's timeout, when NCCL's watchdog tears the process down. The test mode
``D2L_EXT_LIKE_NCCL=1`` makes a gloo run fail the NCCL way, so that a CPU machine tests what a GPU machine would do.
"""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing
import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


def device_and_backend(local_rank: int, local_world_size: int, cuda_devices: int,
                       nccl_available: bool) -> tuple[torch.device, str]:
    """Return a local rank's device and process-group backend: its own CUDA GPU and NCCL, else CPU and gloo."""
    if not 0 <= local_rank < local_world_size:
        raise ValueError(f"local rank {local_rank} is not in 0..{local_world_size - 1}")
    # NCCL needs one GPU per process: two ranks on one GPU are refused, and cuda:1 does not exist on one GPU
    if nccl_available and cuda_devices >= local_world_size:
        return torch.device("cuda", local_rank), "nccl"
    return torch.device("cpu"), "gloo"


def rank_device_and_backend(local_rank: int, local_world_size: int) -> tuple[torch.device, str]:
    """Return ``device_and_backend`` for this machine, from what torch reports (CUDA GPUs, NCCL)."""
    nccl = dist.is_available() and dist.is_nccl_available()
    return device_and_backend(local_rank, local_world_size, torch.cuda.device_count(), nccl)


def say(*lines: str) -> None:
    """Print ``lines`` on rank 0 only (in a launched process; the other ranks' findings reach it by collectives)."""
    if dist.get_rank() == 0:
        write_lines(*lines)


def write_lines(*lines: str) -> None:
    """Write ``lines`` to stdout in one system call. Ranks share their agent's stdout, and print() writes a line
    and its newline apart: two ranks printing at once then mix their lines. One write of less than the pipe's
    atomic size (4 KiB on Linux) is never mixed with another."""
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), "".join(line + "\n" for line in lines).encode())


def from_every_rank(value: T) -> list[T]:
    """Return ``value`` as each rank has it, in rank order (in a launched process; every rank must call this)."""
    values: list = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def join(timeout: float | None = None, cpu: bool = False) -> tuple[int, torch.device, str]:
    """Join the process group in a process that torchrun started: take this rank's device and backend
    (``rank_device_and_backend``), make a GPU the current one, and bind NCCL to it at once (``device_id``: NCCL
    errors then show here rather than later). Return the local rank, the device and the backend.
    ``timeout`` (seconds): how long a collective may wait before it fails (the default: 10 minutes with NCCL, 30
    with gloo). ``cpu``: the CPU over gloo even where there are GPUs (chapter 10.5 times collectives beside CPU step
    times). Chapter 6.3's scripts/ddp_train.py spells these lines out, since teaching them is its point."""
    local_rank, local_world_size = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    if cpu:
        device, backend = torch.device("cpu"), "gloo"
    else:
        device, backend = rank_device_and_backend(local_rank, local_world_size)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if backend == "nccl":  # the default already; set so that the script says what it relies on (see fail_as_nccl_would)
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
    wait = None if timeout is None else datetime.timedelta(seconds=timeout)
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None, timeout=wait)
    return local_rank, device, backend


LIKE_NCCL = "D2L_EXT_LIKE_NCCL"


def like_nccl(environ: dict[str, str] | os._Environ[str] | None = None) -> bool:
    """Whether the test mode that makes gloo fail as NCCL does is on (``D2L_EXT_LIKE_NCCL=1``)."""
    return (os.environ if environ is None else environ).get(LIKE_NCCL, "") == "1"


@contextlib.contextmanager
def fail_as_nccl_would(timeout: float) -> Iterator[None]:
    """Run the block; under the test mode ``D2L_EXT_LIKE_NCCL=1`` with gloo, make a collective that fails do what
    NCCL does: wait ``timeout`` seconds (the process group's timeout), then tear the process down.

    Why: when a peer is gone, gloo's collective raises at once ("Connection closed by peer"). NCCL's does not: on
    one machine its transports (shared memory, peer to peer) do not notice a dead peer, and the collective waits.
    NCCL's watchdog thread fails it when the process group's ``timeout`` expires, and with
    ``TORCH_NCCL_ASYNC_ERROR_HANDLING=3`` (PyTorch's default) it then aborts the whole process: no Python exception
    reaches the script (docs.pytorch.org, "ProcessGroupNCCL Environment Variables"). Here the abort is a SIGABRT,
    as NCCL's, without a core file; torchrun sees a failed worker either way. The mode does nothing with NCCL, or
    outside the test mode."""
    if not like_nccl() or dist.get_backend() != "gloo":
        yield
        return
    try:
        yield
    except (RuntimeError, dist.DistError) as error:  # what gloo raises when a peer is gone, or times out
        rank = dist.get_rank()
        first = re.sub(r"\[[^\]\s]*\.(?:cc|cpp|h|hpp):\d+\]\s*", "", (str(error).strip().splitlines() or ["?"])[0])
        first = first.split(". ")[0]
        write_lines(f"rank {rank}: gloo raised at once ({first}); like NCCL, waiting {timeout:g} s for the watchdog")
        time.sleep(timeout)
        write_lines(f"rank {rank}: like NCCL's watchdog: the collective timed out after {timeout:g} s; "
                    "the process is torn down (TORCH_NCCL_ASYNC_ERROR_HANDLING=3)")
        with contextlib.suppress(ImportError, ValueError, OSError):  # no core file in the working folder
            import resource  # not on Windows

            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.kill(os.getpid(), signal.SIGABRT)


# The process groups that ``leave`` destroyed, kept until the process ends (see ``keep_process_groups``)
_KEPT_GROUPS: list[Any] = []


def keep_process_groups() -> int:
    """Keep a reference to every process group of this process until it ends; return how many.

    ``destroy_process_group`` unregisters the groups, but a gloo group's C++ object lives until its last reference
    goes: in a worker that torchrun forked, when the script's ``main()`` returns and frees its DDP model. Its
    destructor joins gloo's threads with the GIL held, while one of them may still be freeing the last collective's
    work, whose tensors Python owns: that thread then waits for the GIL for ever (seen in chapter 11 under load: rank
    1 stuck there, its agent waiting on it, the launch stopped by its timeout; ``py-spy dump --native``:
    ``ProcessGroupGloo::runLoop`` > ``~AsyncBarrierWork`` > ``gil_scoped_acquire``). Kept, the groups are never
    destroyed: the process ends in ``os._exit`` (``exit_without_teardown``, or multiprocessing's for a forked worker),
    which runs no destructor."""
    world = getattr(dist.distributed_c10d, "_world", None)  # every group, subgroups too (private, so guarded)
    groups = list(getattr(world, "pg_map", {}) or []) or [g for g in [dist.group.WORLD] if g is not None]
    _KEPT_GROUPS.extend(groups)
    return len(groups)


def leave() -> None:
    """End a launched process once every rank is done: a barrier, the process group destroyed (and kept from its
    destructor: ``keep_process_groups``), then ``exit_without_teardown``."""
    dist.barrier()  # every rank is done with its collectives before any leaves
    keep_process_groups()
    dist.destroy_process_group()
    exit_without_teardown()


def exit_without_teardown() -> None:
    """Exit a launched process without the interpreter's teardown. Under load the C++ runtime sometimes aborted a
    rank in that teardown, after everything was printed ("terminate called without an active exception": gloo's
    threads still being torn down), and torchrun then reported the run as failed. A worker that torchrun forked
    (``forks_workers``) returns instead: torchrun waits for its script to return, and the forked process then
    exits without that teardown."""
    sys.stdout.flush()
    if multiprocessing.parent_process() is None:
        os._exit(0)
