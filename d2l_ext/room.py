"""How many processes a launch can start here: one per GPU, or CPU processes as the memory free allows, a container's
limit (a cgroup: Binder's 2 GB, make check-memory) counted."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import psutil
import torch


def processes_to_start(cuda_devices: int | None = None) -> int:
    """Return how many DDP processes to start on this machine: one per CUDA GPU, or two CPU processes without one."""
    if cuda_devices is None:
        cuda_devices = torch.cuda.device_count()
    # an Apple or Intel GPU counts as none: NCCL is CUDA's, and gloo cannot all-reduce MPS tensors, so DDP runs
    # on the CPU there, as two processes to show the communication
    return cuda_devices or 2


# The memory to have free before starting 4 CPU processes: measured, they add 1,826 MiB to the notebook's kernel
# (chapter 9's tp-run: 2,417 MiB in all, summed PSS, tools/checks/memory.py --no-limit), each importing torch;
# 2.5 GiB leaves some room. Under Binder's 2 GB (make check-memory) chapter 9 therefore starts 2
FOUR_CPU_PROCESSES_BYTES = 5 * 2**29  # 2.5 GiB


def model_parallel_processes(cuda_devices: int, available_bytes: int) -> tuple[int, str | None]:
    """Return how many processes chapter 9's tensor-parallel script starts, and why not 4 when fewer.

    Four processes run the (2, 2) mesh as well as the one-dimensional splits. With 4 CUDA GPUs or more, each
    process takes its own GPU (NCCL); with 2 or 3, two processes do; with none or one, the processes run on the
    CPU over gloo (NCCL needs a GPU per process), 4 of them if the memory allows."""
    if cuda_devices < 0 or available_bytes < 0:
        raise ValueError(f"a count cannot be negative: {cuda_devices} GPUs, {available_bytes} bytes")
    if cuda_devices >= 4:
        return 4, None
    if cuda_devices >= 2:
        return 2, f"the (2, 2) mesh needs 4 GPUs, and this machine has {cuda_devices}: 2 processes, one per GPU"
    if available_bytes >= FOUR_CPU_PROCESSES_BYTES:
        return 4, None
    return 2, (f"4 CPU processes need about {FOUR_CPU_PROCESSES_BYTES / 2**30:.1f} GiB and "
               f"{available_bytes / 2**30:.1f} GiB is available: 2 processes, so no (2, 2) mesh")


# The memory to have free before starting 4 CPU workers that torchrun forks from its agent (forks_workers): they
# share the agent's torch. Measured: chapter 11's 4-rank load (agent, 4 workers, then a plain process) added 900 MiB
# to the kernel's 597 MiB, under Binder's limit (a cgroup of 1,857 MiB, tools/checks/memory.py --cells, 2026-11-28).
# 1.1 GiB leaves a quarter more; where workers are not forked, each imports torch: FOUR_CPU_PROCESSES_BYTES.
FOUR_FORKED_WORKERS_BYTES = 11 * 2**30 // 10  # 1.1 GiB


def four_cpu_ranks_fit(available_bytes: int | None = None, fork: bool | None = None) -> tuple[bool, str | None]:
    """Return whether a launch of 4 CPU ranks fits in the memory available (default: ``available_memory()``), and
    why not when it does not. ``fork``: whether torchrun forks the workers (default: ``forks_workers()``)."""
    from d2l_ext.launch import forks_workers  # here: launch imports this module

    available_bytes = available_memory() if available_bytes is None else available_bytes
    fork = forks_workers() if fork is None else fork
    needed = FOUR_FORKED_WORKERS_BYTES if fork else FOUR_CPU_PROCESSES_BYTES
    if available_bytes >= needed:
        return True, None
    return False, (f"not on 4 ranks: they need about {needed / 2**30:.1f} GiB free, and "
                   f"{available_bytes / 2**30:.1f} GiB is free here")


def read_stat(path: Path) -> dict[str, int]:
    """Return a cgroup's ``memory.stat`` (or ``memory.events``) as {name: number}: one formula of a cgroup's
    memory for the course and its tools (tools/checks/limits.py reads its notebooks' cgroups through it)."""
    stat = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            stat[key] = int(value)
    return stat


def held_bytes(stat: Mapping[str, int], version: int) -> int:
    """Bytes of a cgroup's memory that its processes hold: their anonymous memory and the file pages they map
    (the code of torch's libraries), each page once. What it holds besides (``usage``) is mostly file cache that
    the system drops before the limit (`_reclaimable`)."""
    if version == 1:
        return stat.get("total_rss", 0) + stat.get("total_mapped_file", 0)
    return stat.get("anon", 0) + stat.get("file_mapped", 0)


def _reclaimable(stat: Mapping[str, int], version: int) -> int:
    """Bytes of a cgroup's memory that the system drops before it reaches the limit: the file cache that no process
    maps (what was only read or written: Python's sources, a saved checkpoint), less shared memory, which has no
    file to go back to. Without those figures (an old kernel), the inactive file cache."""
    cache, mapped, shared = (("total_cache", "total_mapped_file", "total_shmem") if version == 1
                             else ("file", "file_mapped", "shmem"))
    if cache in stat and mapped in stat:
        return max(0, stat[cache] - stat[mapped] - stat.get(shared, 0))
    return stat.get("total_inactive_file" if version == 1 else "inactive_file", 0)


def _cgroup_room(cgroup_file: Path, sys_fs: Path) -> int | None:
    """Bytes left under the memory limits of this process's cgroup and its parents (v2 or v1), or None."""
    rooms = []
    for line in cgroup_file.read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2
            version, base, limit_name, usage_name = 2, sys_fs, "memory.max", "memory.current"
        elif "memory" in controllers.split(","):  # cgroup v1
            version, base = 1, sys_fs / "memory"
            limit_name, usage_name = "memory.limit_in_bytes", "memory.usage_in_bytes"
        else:
            continue
        folder = base / path.lstrip("/")
        while folder != base.parent and base in [folder, *folder.parents]:
            try:
                limit = (folder / limit_name).read_text().strip()
                if limit != "max" and int(limit) < 2**60:
                    usage = int((folder / usage_name).read_text())
                    stat = read_stat(folder / "memory.stat")
                    rooms.append(int(limit) - usage + _reclaimable(stat, version))
            except (OSError, ValueError):
                pass
            folder = folder.parent
    return min(rooms) if rooms else None


def available_memory(cgroup_file: Path = Path("/proc/self/cgroup"), sys_fs: Path = Path("/sys/fs/cgroup")) -> int:
    """Return the bytes this process can still use: the system's available memory, or less where a cgroup limits
    this process (a container, Binder's 2 GB, make check-memory)."""
    available = psutil.virtual_memory().available
    try:
        room = _cgroup_room(cgroup_file, sys_fs)
    except (OSError, ValueError):
        room = None
    return max(0, min(available, room)) if room is not None else available
