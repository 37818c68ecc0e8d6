"""Launching a distributed training script with torchrun from a notebook, without leaks.

``torchrun`` starts one process per device, sets ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` for each,
and lets them meet at a rendezvous address. From a notebook it must also be bounded in time, talk over
127.0.0.1 only, clean up every process it started, and turn a failing rank into an error that shows
that rank's message. ``torchrun`` does the first part; this module does the rest (``run_script`` does it
for a script that starts its processes itself, with ``torch.multiprocessing.spawn``). Inside each launched
process, ``rank_device_and_backend`` picks the rank's device and the process group's backend, and ``say`` and
``from_every_rank`` let rank 0 print what every rank found, in rank order.
"""

from __future__ import annotations

import ctypes
import gc
import json
import multiprocessing
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import psutil
import torch
import torch.distributed as dist

T = TypeVar("T")


class LaunchError(RuntimeError):
    """A launched run failed: its exit code, what it printed, and the failing rank's error."""

    def __init__(self, returncode: int, stdout: str, stderr: str, launcher: str = "torchrun",
                 worker_errors: Mapping[int, list[str]] | None = None):
        # Python 3.13 colours tracebacks when FORCE_COLOR is set (Colab sets it) or on a terminal: the colour codes
        # would split "RuntimeError: ..." and hide the rank's own error, so they are removed first
        stdout, stderr = without_colour(stdout), without_colour(stderr)
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr
        # the ranks' own errors: printed under [rankN]:, or left in torchrun's log folder by forked workers
        errors = {**(worker_errors or {}), **rank_errors(stderr)}
        self.rank = failing_rank(stderr)
        # torchrun names the first failure it observed; when a rank dies, the others fail in their next collective
        # within the same instant ("Connection closed by peer"), and torchrun may name one of them: name the rank
        # whose own error it was
        own = sorted(rank for rank, lines in errors.items() if not PEER_FAILURE.search(lines[-1]))
        if own and (self.rank is None or self.rank not in own):
            self.rank = own[0]
        where = f"rank {self.rank}" if self.rank is not None else "a process"
        message = errors[self.rank][-1] if self.rank in errors else stderr.strip()[-1000:]
        super().__init__(f"{where} failed ({launcher} exit code {returncode}): {message}")


# a terminal's colour and style codes (ANSI "CSI" sequences such as ESC[1;35m), as Python 3.13 writes them
ANSI_CODE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def without_colour(text: str) -> str:
    """Return ``text`` without terminal colour codes."""
    return ANSI_CODE.sub("", text)


# what a rank prints when it fails because another rank died (gloo, NCCL)
PEER_FAILURE = re.compile(r"closed by peer|reset by peer|Broken pipe|remote worker crash|communicator was aborted",
                          flags=re.I)


def rank_errors(stderr: str) -> dict[int, list[str]]:
    """Return, for each rank, the error lines (``SomethingError: ...``) it printed under torchrun's ``[rankN]:``."""
    errors: dict[int, list[str]] = {}
    for match in re.finditer(r"^\[rank(\d+)\]: ([A-Za-z_][\w.]*(?:Error|Exception)\b.*)$", stderr, flags=re.M):
        errors.setdefault(int(match[1]), []).append(match[2])
    return errors


def worker_errors(log_dir: str | Path) -> dict[int, list[str]]:
    """Return the error each worker left in torchrun's log folder, by local rank, from the last attempt.

    A worker that torchrun forked (``forks_workers``) runs its script under torchrun's error handler, which writes
    the exception to ``attempt_N/LOCAL_RANK/error.json`` rather than print it under ``[rankN]:``. On one node the
    local rank is the rank."""
    errors: dict[int, list[str]] = {}
    attempts = sorted(Path(log_dir).glob("*/attempt_*"), key=lambda path: int(path.name.split("_")[1]))
    for error_file in (attempts[-1].glob("*/error.json") if attempts else []):
        try:
            message = json.loads(error_file.read_text())["message"]["message"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # being written when the worker was killed, or not torchrun's format
        if error_file.parent.name.isdigit() and str(message).strip():
            errors[int(error_file.parent.name)] = [str(message).strip().splitlines()[0]]
    return errors


def device_and_backend(local_rank: int, local_world_size: int, cuda_devices: int,
                       nccl_available: bool) -> tuple[torch.device, str]:
    """Return a local rank's device and process-group backend: its own CUDA GPU and NCCL, else CPU and gloo."""
    if not 0 <= local_rank < local_world_size:
        raise ValueError(f"local rank {local_rank} is not in 0..{local_world_size - 1}")
    # NCCL needs one GPU per process: two ranks on one GPU are refused, and cuda:1 does not exist on one GPU
    if nccl_available and cuda_devices >= local_world_size:
        return torch.device("cuda", local_rank), "nccl"
    return torch.device("cpu"), "gloo"


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
    available_bytes = available_memory() if available_bytes is None else available_bytes
    fork = forks_workers() if fork is None else fork
    needed = FOUR_FORKED_WORKERS_BYTES if fork else FOUR_CPU_PROCESSES_BYTES
    if available_bytes >= needed:
        return True, None
    return False, (f"not on 4 ranks: they need about {needed / 2**30:.1f} GiB free, and "
                   f"{available_bytes / 2**30:.1f} GiB is free here")


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
                    stat = {name: int(value) for name, value in
                            (row.split() for row in (folder / "memory.stat").read_text().splitlines())}
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


def join() -> tuple[int, torch.device, str]:
    """Join the process group in a process that torchrun started: take this rank's device and backend
    (``rank_device_and_backend``), make a GPU the current one, and bind NCCL to it at once (``device_id``: NCCL
    errors then show here rather than later). Return the local rank, the device and the backend.
    Chapter 6.3's scripts/ddp_train.py spells these lines out, since teaching them is its point."""
    local_rank, local_world_size = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    device, backend = rank_device_and_backend(local_rank, local_world_size)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    return local_rank, device, backend


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


def failing_rank(stderr: str) -> int | None:
    """Return the rank that torchrun names as the root cause of a failure, if it names one."""
    match = re.search(r"Root Cause.*?rank\s*:\s*(\d+)", stderr, flags=re.S)
    return int(match[1]) if match else None


def free_port() -> int:
    """Return a TCP port that is free on 127.0.0.1 right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def forks_workers(platform: str | None = None, cuda_devices: int | None = None) -> bool:
    """Return whether torchrun should fork its workers from its agent here: on Linux without a CUDA GPU.

    By default torchrun starts each worker as a new Python, which imports torch again: about 4 s of CPU each on
    the course's 2-core test machine, most of a short run's time. Forked from the agent, which has imported torch
    already, a worker starts at once. With a GPU the course keeps torchrun's default, the path every cluster uses;
    macOS and Windows keep it too, where forking a process that has loaded system frameworks is unsafe.
    """
    platform = platform or sys.platform
    cuda = torch.cuda.device_count() if cuda_devices is None else cuda_devices
    return platform.startswith("linux") and cuda == 0


def _agent(fork: bool) -> str:
    """Return the module that runs torchrun's agent: torchrun's own, or with ``fork`` d2l_ext.agent, which imports
    what the script imports before it forks the workers (they then import nothing again)."""
    return "d2l_ext.agent" if fork else "torch.distributed.run"


def _script(script: str | Path, fork: bool) -> list[str]:
    """Return the end of a torchrun command before the script's arguments: the script, or with ``fork`` the flags
    that make the agent fork its workers and run the script in them (``--run-path`` takes an absolute path)."""
    if fork:
        return ["--run-path", "--start-method=fork", str(Path(script).resolve())]
    return [str(script)]


def forked_environment(script: str | Path, env: Mapping[str, str]) -> dict[str, str]:
    """Return ``env`` for an agent that forks its workers: the script's folder first on ``PYTHONPATH``, since
    ``--run-path`` does not put it on ``sys.path`` as ``python script.py`` does (scripts import their neighbours)."""
    folder = str(Path(script).resolve().parent)
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [folder, env.get("PYTHONPATH", "")]))}


def torchrun_command(script: str | Path, nproc: int, args: list[str], port: int,
                     log_dir: str | Path | None = None, fork: bool = False) -> list[str]:
    """Return the torchrun command line for ``nproc`` processes on this machine, meeting at 127.0.0.1.

    torchrun keeps a folder of logs per launch (``log_dir``; without it a new ``torchelastic_*`` folder in the
    system's temporary folder, which it never removes). ``fork``: the workers are forked from the agent
    (``forks_workers``).
    """
    logs = [f"--log-dir={log_dir}"] if log_dir is not None else []
    return [sys.executable, "-m", _agent(fork), f"--nproc-per-node={nproc}", "--nnodes=1",
            "--master-addr=127.0.0.1", f"--master-port={port}", "--max-restarts=0", *logs, *_script(script, fork),
            *args]


def torchrun(script: str | Path, nproc: int, args: list[str] | None = None, timeout: float = 120,
             echo: bool = True) -> str:
    """Run ``script`` under torchrun with ``nproc`` local processes; return its stdout, or raise LaunchError.

    Lines the processes print are echoed as they arrive (``echo``), so a long run shows its progress.
    The whole process group is killed after ``timeout`` seconds (TimeoutError) or on any error. torchrun's
    log folder is a temporary one, removed afterwards, whether the run passed, failed or was stopped; it is the
    processes' temporary folder too (``TMPDIR``), for the files torchrun keeps a failing worker's error in.
    """
    with tempfile.TemporaryDirectory(prefix="d2l-ext-torchrun-") as logs:
        fork = forks_workers()
        command = torchrun_command(script, nproc, args or [], free_port(), log_dir=logs, fork=fork)
        env = {**launch_environment(), "TMPDIR": logs}  # what it writes in a temporary folder is removed too
        return run_command(command, timeout=timeout, echo=echo, env=forked_environment(script, env) if fork else env,
                           log_dir=logs)


def node_command(script: str | Path, nodes: int | str, nproc_per_node: int, args: list[str], endpoint: str,
                 run_id: str, host: bool, restarts: int = 0, log_dir: str | Path | None = None,
                 rdzv_conf: str = "", fork: bool = False) -> list[str]:
    """Return the torchrun command line of one "node" (one agent) of a job of ``nodes`` nodes (or ``"MIN:MAX"``)
    that meet at ``endpoint`` with the c10d rendezvous. The agent with ``host`` holds the rendezvous' store (on a
    cluster: the node at that address); node ranks are given as agents join, so there is no --node-rank.
    ``fork``: the workers are forked from the agent (``forks_workers``)."""
    conf = ",".join(filter(None, [f"is_host={int(host)}", rdzv_conf]))
    logs = [f"--log-dir={log_dir}"] if log_dir is not None else []
    return [sys.executable, "-m", _agent(fork), f"--nnodes={nodes}", f"--nproc-per-node={nproc_per_node}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}", f"--rdzv-conf={conf}",
            f"--max-restarts={restarts}", *logs, *_script(script, fork), *args]


def node_visible_gpus(node: int, nodes: int, nproc_per_node: int, visible: list[str]) -> str:
    """Return ``CUDA_VISIBLE_DEVICES`` for one node of ``torchrun_nodes`` on this machine, whose GPUs are
    ``visible``: the node's own ``nproc_per_node`` GPUs when there is one for every worker of every node, else
    none, so that its workers take the CPU and gloo. Each node's workers number their GPUs from 0 (``LOCAL_RANK``):
    without this, two one-worker nodes on one machine would both take cuda:0, which NCCL refuses."""
    if len(visible) >= nodes * nproc_per_node:
        return ",".join(visible[node * nproc_per_node:(node + 1) * nproc_per_node])
    return ""


def visible_gpus() -> list[str]:
    """Return the CUDA GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` names them."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed:
        return [name.strip() for name in listed.split(",") if name.strip()][:torch.cuda.device_count()]
    return [str(index) for index in range(torch.cuda.device_count())]


def torchrun_nodes(script: str | Path, nodes: int = 2, nproc_per_node: int = 1, args: list[str] | None = None,
                   min_nodes: int | None = None, restarts: int = 0, rdzv_conf: str = "", timeout: float = 180,
                   echo: bool = True) -> list[str]:
    """Run ``script`` as ``nodes`` torchrun agents on this machine, as if on ``nodes`` machines; return what each
    agent printed (its workers' output), node by node.

    The agents meet with the c10d rendezvous on 127.0.0.1 (a port the system picks), whose store this process holds
    while they run: on a cluster the first node's agent holds it, but an agent that finishes first closes it while
    another still reads it, and that agent then fails ("The connection to the C10d store has failed"; seen
    here under load). ``min_nodes``: the job may go on with fewer nodes (``--nnodes=MIN:MAX``).
    ``restarts``: how many times torchrun may restart the workers after a failure. Each node's processes see their
    node's number in ``D2L_EXT_NODE``, and the node's own GPUs if the machine has enough (``node_visible_gpus``).
    A node killed with SIGKILL, as a machine that dies, is no error here: its peers fail or go on as torchrun
    decides. Every process is killed after ``timeout`` seconds (TimeoutError); a node that fails otherwise raises
    LaunchError. The agents' log folders are temporary ones,
    removed afterwards.
    """
    if nodes < 1 or nproc_per_node < 1:
        raise ValueError(f"a job needs 1 or more nodes and workers per node, not {nodes} and {nproc_per_node}")
    if restarts < 0 or (min_nodes is not None and not 1 <= min_nodes <= nodes):
        raise ValueError(f"restarts is 0 or more (not {restarts}), min_nodes between 1 and {nodes} (not {min_nodes})")
    size = f"{min_nodes}:{nodes}" if min_nodes is not None and min_nodes < nodes else nodes
    run_id = f"d2l-ext-{os.getpid()}-{time.monotonic_ns()}"
    env = {**launch_environment(), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    fork = forks_workers()
    if fork:
        env = forked_environment(script, env)
    visible = visible_gpus()
    release_memory()
    outputs: list[list[str]] = [[] for _ in range(nodes)]
    errors: list[list[str]] = [[] for _ in range(nodes)]
    processes: list[subprocess.Popen] = []

    def read(node: int, stream: Any, into: list[str], echoed: bool) -> None:
        for line in stream:
            into.append(line)
            if echo and echoed:
                print(f"[node {node}] {line}", end="", flush=True)

    # the rendezvous' store, on a port the system picks: it outlives every agent
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # pyright: ignore[reportPrivateImportUsage]
    port = store.port
    with tempfile.TemporaryDirectory(prefix="d2l-ext-torchrun-") as logs:
        readers = []
        # the timer, not a clock reading, says whether the run was stopped: a run that ended on its own reports
        # its own outcome, however long a busy machine made it take
        stopped = threading.Event()
        running: list[str] = []  # what the timer found still running, node by node

        def stop() -> None:
            running.extend(_still_running(node, process) for node, process in enumerate(processes)
                           if process.poll() is None)
            dump_stacks(processes)
            stopped.set()
            for process in processes:
                _kill_group(process)

        timer = threading.Timer(timeout, stop)
        timer.start()
        try:
            for node in range(nodes):
                command = node_command(script, size, nproc_per_node, args or [], f"127.0.0.1:{port}", run_id,
                                       host=False, restarts=restarts, log_dir=Path(logs) / f"node{node}",
                                       rdzv_conf=rdzv_conf, fork=fork)
                gpus = node_visible_gpus(node, nodes, nproc_per_node, visible)
                process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                           env={**env, "D2L_EXT_NODE": str(node), "CUDA_VISIBLE_DEVICES": gpus,
                                                "TMPDIR": logs},
                                           start_new_session=True)
                processes.append(process)
                for stream, into, echoed in ((process.stdout, outputs[node], True), (process.stderr, errors[node],
                                                                                        False)):
                    reader = threading.Thread(target=read, args=(node, stream, into, echoed), daemon=True)
                    reader.start()
                    readers.append(reader)
            for process in processes:
                process.wait()
        finally:
            timer.cancel()
            for process in processes:
                _kill_group(process)
            for reader in readers:
                reader.join(timeout=10)
            del store  # closes the rendezvous' port
    if stopped.is_set():
        # what each node printed last says where it stopped (a rendezvous, a collective, a rank that never came)
        last = "; ".join(f"node {node}: {_last_line(outputs[node])!r} on stdout, {_last_line(errors[node])!r} on stderr"
                         for node in range(nodes))
        raise TimeoutError(f"the {nodes} nodes did not finish within {timeout} s and were stopped. "
                           f"Still running: {', '.join(running) or 'none'}. Last lines: {last}")
    for node, process in enumerate(processes):
        if process.returncode not in (0, -signal.SIGKILL):
            raise LaunchError(process.returncode, "".join(outputs[node]), "".join(errors[node]),
                              launcher=f"torchrun (node {node})")
    return ["".join(lines) for lines in outputs]


def _still_running(node: int, process: subprocess.Popen) -> str:
    """Say what of a node is still running: its agent, and how many workers (its processes' other processes)."""
    try:
        workers = len(psutil.Process(process.pid).children(recursive=True))
    except psutil.NoSuchProcess:
        workers = 0
    return f"node {node} (its agent and {workers} worker{'s' if workers != 1 else ''})"


def _last_line(lines: list[str]) -> str:
    return next((line.strip() for line in reversed(lines) if line.strip()), "")


def run_script(script: str | Path, args: list[str] | None = None, timeout: float = 120, echo: bool = True) -> str:
    """Run a Python script that starts its own processes (``torch.multiprocessing.spawn``); return its stdout.

    Bounded and cleaned up as ``torchrun`` is; a failure raises LaunchError with the script's error.
    """
    return run_command([sys.executable, str(script), *(args or [])], timeout=timeout, echo=echo,
                       launcher=Path(script).name)


def loopback_interface(platform: str | None = None) -> str | None:
    """Return the name of the loopback network interface on ``platform`` (default: this one), if known."""
    platform = platform or sys.platform
    if platform.startswith("linux"):
        return "lo"
    if platform == "darwin":
        return "lo0"  # macOS names it lo0
    return None


def launch_environment(environ: Mapping[str, str] | None = None, platform: str | None = None) -> dict[str, str]:
    """Return the environment for launched processes: one thread each unless set, gloo on loopback, no colour."""
    # PYTHON_COLORS=0: the processes write into pipes that LaunchError reads, where colour codes are noise
    env = {**(os.environ if environ is None else environ), "PYTHONUNBUFFERED": "1", "PYTHON_COLORS": "0"}
    env.setdefault("OMP_NUM_THREADS", "1")
    interface = loopback_interface(platform)
    if interface is not None:
        env.setdefault("GLOO_SOCKET_IFNAME", interface)  # gloo listens on the loopback interface only
    return env


def release_memory() -> None:
    """Hand the memory this process has freed back to the system, before it starts more processes.

    glibc keeps freed memory for reuse inside the process; each launched process imports torch anew (about
    400 MB here), and on Binder the kernel and every process it starts share 2 GB. Elsewhere this does nothing.
    """
    gc.collect()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # not glibc (musl, say)
            pass


def run_command(command: list[str], timeout: float = 120, echo: bool = True, launcher: str = "torchrun",
                env: Mapping[str, str] | None = None, log_dir: str | Path | None = None) -> str:
    """Run ``command`` in its own process group; return its stdout, or raise LaunchError (TimeoutError).

    Lines it prints are echoed as they arrive (``echo``); all of it is killed after ``timeout`` seconds.
    ``env``: its environment (default: ``launch_environment()``). ``log_dir``: torchrun's log folder, where
    forked workers leave their errors (``worker_errors``).
    """
    release_memory()
    env = launch_environment() if env is None else env
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               start_new_session=True)  # its own process group, so that all of it can be killed
    stdout, stderr = process.stdout, process.stderr
    assert stdout is not None and stderr is not None  # both are pipes
    stderr_lines: list[str] = []
    drain = threading.Thread(target=lambda: stderr_lines.extend(stderr), daemon=True)
    drain.start()
    stopped = threading.Event()  # set by the timer only: a run that ended on its own reports its own outcome
    timer = threading.Timer(timeout, lambda: (dump_stacks([process]), stopped.set(), _kill_group(process)))
    timer.start()
    stdout_lines: list[str] = []
    try:
        for line in stdout:
            stdout_lines.append(line)
            if echo:
                print(line, end="", flush=True)
        process.wait()
    finally:
        timer.cancel()
        _kill_group(process)  # leftovers, if any
        drain.join(timeout=10)
    if process.returncode != 0:
        if stopped.is_set():
            raise TimeoutError(f"{launcher} did not finish within {timeout} s and was stopped")
        raise LaunchError(process.returncode, "".join(stdout_lines), "".join(stderr_lines), launcher=launcher,
                          worker_errors=worker_errors(log_dir) if log_dir is not None else None)
    return "".join(stdout_lines)


def dump_stacks(processes: list[subprocess.Popen], path: str | None = None) -> None:
    """Before a timed-out launch is killed: write where each of its processes is, Python and native frames (``py-spy
    dump --native``), to ``path`` (default: the file ``D2L_EXT_HANG_DUMP`` names; without it, nothing is done). A hang
    that only a busy CI machine shows is then explained by its log (issue 51's was read this way)."""
    path = path or os.environ.get("D2L_EXT_HANG_DUMP")
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if not path or spy is None:
        return
    with open(path, "a", encoding="utf-8") as out:
        for process in processes:
            try:
                tree = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
            for each in tree:
                try:
                    out.write(f"== {each.pid}: {' '.join(each.cmdline())[:300]}\n")
                except psutil.Error:
                    continue
                out.flush()
                subprocess.run([spy, "dump", "--native", "--pid", str(each.pid)], stdout=out, stderr=out,
                               timeout=60, check=False)


def _kill_group(process: subprocess.Popen) -> None:
    """Kill ``process``, its process group and every process it started (workers may be in other groups)."""
    try:
        tree = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for child in tree:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(tree, timeout=10)
