"""Launching a distributed training script with torchrun from a notebook, without leaks.

``torchrun`` starts one process per device, sets ``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` for each,
and lets them meet at a rendezvous address. From a notebook it must also be bounded in time, talk over
127.0.0.1 only, clean up every process it started, and turn a failing rank into an error that shows
that rank's message. ``torchrun`` does the first part; this module does the rest (``run_script`` does it
for a script that starts its processes itself, with ``torch.multiprocessing.spawn``). What each launched process
does is ``d2l_ext.ranks``; how many processes fit here is ``d2l_ext.room``. Their names stay importable from here
too (chapters 9 and 11 call ``launch.available_memory``, ``launch.model_parallel_processes`` and
``launch.four_cpu_ranks_fit``).
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.distributed as dist

# the names that lived here before d2l_ext.ranks and d2l_ext.room, kept importable (explicit re-exports)
from d2l_ext.ranks import device_and_backend as device_and_backend
from d2l_ext.ranks import exit_without_teardown as exit_without_teardown
from d2l_ext.ranks import from_every_rank as from_every_rank
from d2l_ext.ranks import join as join
from d2l_ext.ranks import keep_process_groups as keep_process_groups
from d2l_ext.ranks import leave as leave
from d2l_ext.ranks import rank_device_and_backend as rank_device_and_backend
from d2l_ext.ranks import say as say
from d2l_ext.ranks import write_lines as write_lines
from d2l_ext.room import FOUR_CPU_PROCESSES_BYTES as FOUR_CPU_PROCESSES_BYTES
from d2l_ext.room import FOUR_FORKED_WORKERS_BYTES as FOUR_FORKED_WORKERS_BYTES
from d2l_ext.room import available_memory as available_memory
from d2l_ext.room import four_cpu_ranks_fit as four_cpu_ranks_fit
from d2l_ext.room import model_parallel_processes as model_parallel_processes
from d2l_ext.room import processes_to_start as processes_to_start


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
    cluster: the node at that address). There is no --node-rank: c10d numbers the agents when the round closes,
    sorted by host name, then process id.
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
    # the rendezvous' store, on a port the system picks: it outlives every agent
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # pyright: ignore[reportPrivateImportUsage]
    echoed = (lambda name, line: print(f"[{name}] {line}", end="", flush=True)) if echo else None
    with tempfile.TemporaryDirectory(prefix="d2l-ext-torchrun-") as logs, Supervised(timeout, echoed) as run:
        for node in range(nodes):
            command = node_command(script, size, nproc_per_node, args or [], f"127.0.0.1:{store.port}", run_id,
                                   host=False, restarts=restarts, log_dir=Path(logs) / f"node{node}",
                                   rdzv_conf=rdzv_conf, fork=fork)
            gpus = node_visible_gpus(node, nodes, nproc_per_node, visible)
            run.start(command, {**env, "D2L_EXT_NODE": str(node), "CUDA_VISIBLE_DEVICES": gpus, "TMPDIR": logs},
                      name=f"node {node}")
        run.wait()
    del store  # closes the rendezvous' port
    if run.stopped.is_set():
        # what each node printed last says where it stopped (a rendezvous, a collective, a rank that never came)
        raise TimeoutError(f"the {nodes} nodes did not finish within {timeout} s and were stopped. "
                           f"Still running: {', '.join(run.running) or 'none'}. Last lines: {run.last_lines()}")
    for node, process in enumerate(run.processes):
        if process.returncode not in (0, -signal.SIGKILL):
            raise LaunchError(process.returncode, "".join(run.stdout[node]), "".join(run.stderr[node]),
                              launcher=f"torchrun (node {node})")
    return ["".join(lines) for lines in run.stdout]


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
    with Supervised(timeout, (lambda name, line: print(line, end="", flush=True)) if echo else None) as run:
        process = run.start(command, env, name=launcher)
        run.wait()
    if process.returncode != 0:
        if run.stopped.is_set():
            raise TimeoutError(f"{launcher} did not finish within {timeout} s and was stopped. "
                               f"Last lines: {run.last_lines()}")
        raise LaunchError(process.returncode, "".join(run.stdout[0]), "".join(run.stderr[0]), launcher=launcher,
                          worker_errors=worker_errors(log_dir) if log_dir is not None else None)
    return "".join(run.stdout[0])


class Supervised:
    """The processes of one launch, each in its own process group, watched until every one has ended or ``timeout``
    seconds have passed since the launch began; then all of them, and every process they started, are killed.

    Both launch modes use it (``run_command``: one process; ``torchrun_nodes``: one agent per node). Readers keep
    each process's stdout and stderr lines (``stdout[i]``, ``stderr[i]``); ``wait`` echoes the stdout lines on the
    calling thread as they come (``echo(name, line)``), so a notebook cell shows them in order. The timer, not a
    clock reading, says whether the launch was stopped (``stopped``): a run that ended on its own reports its own
    outcome, however long a busy machine made it take (a check-timing run once turned a finished run into a
    timeout). When it stops them, ``running`` says what was still running, and ``dump_stacks`` where."""

    def __init__(self, timeout: float, echo: Callable[[str, str], None] | None = None):
        self.echo = echo
        self.processes: list[subprocess.Popen] = []
        self.names: list[str] = []
        self.stdout: list[list[str]] = []
        self.stderr: list[list[str]] = []
        self.stopped = threading.Event()  # set by the timer only
        self.running: list[str] = []  # what the timer found still running
        self._lines: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()
        self._readers: list[threading.Thread] = []
        self._timer = threading.Timer(timeout, self._stop)

    def __enter__(self) -> Supervised:
        self._timer.start()
        return self

    def start(self, command: list[str], env: Mapping[str, str], name: str) -> subprocess.Popen:
        """Start ``command`` in a process group of its own, so that all of it can be killed; return the process."""
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                   start_new_session=True)
        self.processes.append(process)
        self.names.append(name)
        self.stdout.append([])
        self.stderr.append([])
        for stream, into, echoed in ((process.stdout, self.stdout[-1], True), (process.stderr, self.stderr[-1], False)):
            reader = threading.Thread(target=self._read, args=(name, stream, into, echoed), daemon=True)
            reader.start()
            self._readers.append(reader)
        return process

    def _read(self, name: str, stream: Any, into: list[str], echoed: bool) -> None:
        for line in stream:
            into.append(line)
            if echoed and self.echo is not None:
                self._lines.put((name, line))

    def _echo_waiting(self) -> None:
        while True:
            try:
                name, line = self._lines.get_nowait()
            except queue.Empty:
                return
            if self.echo is not None:
                self.echo(name, line)

    def wait(self) -> None:
        """Echo the processes' lines as they come, until every process has ended."""
        while any(process.poll() is None for process in self.processes):
            try:
                name, line = self._lines.get(timeout=0.05)
            except queue.Empty:
                continue
            if self.echo is not None:
                self.echo(name, line)

    def _stop(self) -> None:
        self.running.extend(f"{name} and {_started_by(process)}"
                            for name, process in zip(self.names, self.processes, strict=True) if process.poll() is None)
        if not self.running:
            return  # everything ended as the time ran out: the run reports its own outcome
        dump_stacks(self.processes)
        self.stopped.set()
        for process in self.processes:
            _kill_group(process)

    def __exit__(self, *exc_info: object) -> None:
        self._timer.cancel()
        for process in self.processes:
            _kill_group(process)  # leftovers, if any
            process.wait()
        for reader in self._readers:
            reader.join(timeout=10)
        self._echo_waiting()  # the last lines, read after the processes ended

    def last_lines(self) -> str:
        """What each process printed last (up to 3 lines, joined by " | "), on stdout and on stderr: where it stopped.
        Three lines: a worker's last step, then what it waited for (chapter 11's lost node)."""
        return "; ".join(f"{name}: {_last_lines(out)!r} on stdout, {_last_lines(err)!r} on stderr"
                         for name, out, err in zip(self.names, self.stdout, self.stderr, strict=True))


def _started_by(process: subprocess.Popen) -> str:
    """Say how many processes a launched process has started (for torchrun's agent: its workers)."""
    try:
        count = len(psutil.Process(process.pid).children(recursive=True))
    except psutil.NoSuchProcess:
        count = 0
    return f"{count} process{'es' if count != 1 else ''} it started"


def _last_lines(lines: list[str], count: int = 3) -> str:
    shown = [line.strip() for line in lines if line.strip()][-count:]
    return " | ".join(shown)


def dump_stacks(processes: list[subprocess.Popen], path: str | None = None) -> None:
    """Before a timed-out launch is killed: write where each of its processes is, Python and native frames (``py-spy
    dump --native``), to ``path`` (default: the file ``D2L_EXT_HANG_DUMP`` names; without it, nothing is done). A hang
    that only a busy CI machine shows is then explained by its log (issue 51's was read this way; .ci/run prints the
    file). py-spy: ``D2L_EXT_PY_SPY``, else on PATH or beside this Python."""
    path = path or os.environ.get("D2L_EXT_HANG_DUMP")
    spy = (os.environ.get("D2L_EXT_PY_SPY") or shutil.which("py-spy")
           or shutil.which("py-spy", path=str(Path(sys.executable).parent)))
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
