"""d2l_ext.launch.torchrun: runs ranks over 127.0.0.1, reports a failing rank, never leaks processes."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import torch
import torch.distributed as dist

from d2l_ext import agent, launch

READS_NOTEBOOKS = False  # no notebook, edition or markdown file: tools/result_cache.py keys it on code only

SCRIPT = textwrap.dedent("""\
    import multiprocessing, os, sys, time
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    print(f"rank {rank} forked: {multiprocessing.parent_process() is not None}", flush=True)
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    print(f"rank {rank} of {dist.get_world_size()}: sum {total.item():.0f}, "
          f"master {os.environ['MASTER_ADDR']}", flush=True)
    if sys.argv[1] == str(rank):
        raise ValueError(f"rank {rank} fails on purpose")
    if sys.argv[1] == "sleep":
        time.sleep(120)
    dist.destroy_process_group()
""")


@pytest.fixture()
def script(tmp_path, monkeypatch):
    """The ranks' script; the launch's temporary folder (this process's and torchrun's) is an empty one of the
    test's, which must be empty again afterwards: torchrun's torchelastic_* log folders are not left behind."""
    path = tmp_path / "ranks.py"
    path.write_text(SCRIPT)
    temporary = tmp_path / "temporary"
    temporary.mkdir()
    monkeypatch.setenv("TMPDIR", str(temporary))
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    yield path
    assert sorted(p.name for p in temporary.iterdir()) == [], "the launch left files in the temporary folder"


def running(script) -> list[int]:
    """Return the processes anywhere on the machine whose command line names ``script``."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        if any(str(script) in part for part in process.info["cmdline"] or []):
            found.append(process.info["pid"])
    return found


@pytest.mark.launches
@pytest.mark.parametrize("fork", [True, False])  # the path CI takes, and the one a GPU machine takes
def test_two_ranks_meet_on_loopback(script, monkeypatch, fork):
    monkeypatch.setattr(launch, "forks_workers", lambda: fork)
    output = launch.torchrun(script, nproc=2, args=["none"], echo=False)
    assert "rank 0 of 2: sum 3, master 127.0.0.1" in output
    assert "rank 1 of 2: sum 3, master 127.0.0.1" in output
    assert f"rank 0 forked: {fork}" in output and f"rank 1 forked: {fork}" in output
    assert running(script) == []


def test_forked_workers_errors_are_read_from_the_last_attempt_in_torchrun_s_log_folder(tmp_path):
    def error(attempt: int, local_rank: int, text: str) -> None:
        folder = tmp_path / "none_abc" / f"attempt_{attempt}" / str(local_rank)
        folder.mkdir(parents=True)
        (folder / "error.json").write_text(text)

    error(0, 1, json.dumps({"message": {"message": "ValueError: from the first attempt", "extraInfo": {}}}))
    error(1, 0, json.dumps({"message": {"message": "RuntimeError: Connection reset by peer", "extraInfo": {}}}))
    error(1, 1, json.dumps({"message": {"message": "RuntimeError: rank 1's own\nmore", "extraInfo": {}}}))
    error(1, 2, '{"message": {"mess')  # killed while it wrote
    assert launch.worker_errors(tmp_path) == {0: ["RuntimeError: Connection reset by peer"],
                                              1: ["RuntimeError: rank 1's own"]}
    assert launch.worker_errors(tmp_path / "missing") == {}
    failure = launch.LaunchError(1, "", "Root Cause\n  rank      : 0 (local_rank: 0)\n",
                                 worker_errors=launch.worker_errors(tmp_path))
    assert failure.rank == 1 and str(failure).endswith("RuntimeError: rank 1's own")  # not the peer torchrun named


@pytest.mark.parametrize(("platform", "cuda_devices", "forks"), [
    ("linux", 0, True), ("linux", 1, False), ("linux", 2, False), ("darwin", 0, False), ("win32", 0, False),
])
def test_workers_are_forked_only_on_linux_without_a_gpu(platform, cuda_devices, forks):
    assert launch.forks_workers(platform, cuda_devices) is forks


def test_a_forking_agent_runs_the_script_by_its_absolute_path_and_finds_its_neighbours():
    plain = launch.torchrun_command("train.py", 2, ["--x"], 29999)
    forked = launch.torchrun_command("train.py", 2, ["--x"], 29999, fork=True)
    assert plain[1:3] == ["-m", "torch.distributed.run"] and plain[-2:] == ["train.py", "--x"]
    assert forked[1:3] == ["-m", "d2l_ext.agent"]
    assert forked[-4:] == ["--run-path", "--start-method=fork", str(Path("train.py").resolve()), "--x"]
    node = launch.node_command("train.py", 2, 1, [], "127.0.0.1:29400", "job", host=False, fork=True)
    assert node[1:3] == ["-m", "d2l_ext.agent"] and node[-3:] == forked[-4:-1]
    env = launch.forked_environment("scripts/train.py", {"PYTHONPATH": "/elsewhere"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(Path("scripts").resolve()), "/elsewhere"]
    assert launch.forked_environment("train.py", {})["PYTHONPATH"] == str(Path.cwd())


def test_the_agent_imports_what_the_script_imports_at_its_top_level(tmp_path, monkeypatch):
    (tmp_path / "d2l_ext_neighbour.py").write_text("VALUE = 1\n")
    script = tmp_path / "train.py"
    script.write_text("from __future__ import annotations\nimport json, os.path\nfrom d2l_ext_neighbour import VALUE\n"
                      "from . import sibling\nfrom d2l_ext_missing import x\n\ndef f():\n    import csv\n")
    assert agent.script_imports(script) == ["json", "os.path", "d2l_ext_neighbour", "d2l_ext_missing"]
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "d2l_ext_neighbour", raising=False)
    assert agent.preload(script) == ["d2l_ext_missing"]  # left to the workers, which report it
    assert "d2l_ext_neighbour" in sys.modules
    monkeypatch.delitem(sys.modules, "d2l_ext_neighbour")


@pytest.mark.launches
@pytest.mark.parametrize("fork", [True, False])
def test_a_failing_rank_raises_with_its_message(script, monkeypatch, fork):
    monkeypatch.setattr(launch, "forks_workers", lambda: fork)
    with pytest.raises(launch.LaunchError) as failure:
        launch.torchrun(script, nproc=2, args=["1"], echo=False)
    assert failure.value.rank == 1
    assert "rank 1 failed" in str(failure.value)
    assert "ValueError: rank 1 fails on purpose" in str(failure.value)


@pytest.mark.launches
def test_a_hanging_run_is_stopped_and_leaves_nothing(script):
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        # 8 s: the ranks are asleep by then on a quiet machine; on a busy one they may still be starting, and
        # must be killed all the same
        launch.torchrun(script, nproc=2, args=["sleep"], timeout=8, echo=False)
    assert time.monotonic() - start < 60, "the launcher waited for workers it should have killed"
    assert running(script) == []  # workers orphaned by a killed torchrun would still be listed


def test_the_command_meets_at_127_0_0_1():
    command = launch.torchrun_command("train.py", 4, ["--epochs", "1"], 29999)
    assert "--master-addr=127.0.0.1" in command and "--master-port=29999" in command
    assert "--nproc-per-node=4" in command and command[-3:] == ["train.py", "--epochs", "1"]
    assert not any(part.startswith("--log-dir") for part in command)  # torchrun() passes a temporary one
    assert "--log-dir=/tmp/logs" in launch.torchrun_command("train.py", 4, [], 29999, log_dir="/tmp/logs")


# (CUDA GPUs on the machine, local processes) -> each local rank's (device, backend). A rank gets its own GPU
# and NCCL only if every local process gets one; one GPU with two processes would need cuda:1 (which does not
# exist) or two NCCL ranks on one GPU (which NCCL refuses), so both ranks run on the CPU over gloo.
RANK_CASES = [
    (0, 1, [("cpu", "gloo")]),
    (0, 2, [("cpu", "gloo"), ("cpu", "gloo")]),
    (1, 1, [("cuda:0", "nccl")]),
    (1, 2, [("cpu", "gloo"), ("cpu", "gloo")]),
    (2, 1, [("cuda:0", "nccl")]),
    (2, 2, [("cuda:0", "nccl"), ("cuda:1", "nccl")]),
]


@pytest.mark.parametrize(("gpus", "nproc", "expected"), RANK_CASES)
def test_each_rank_gets_its_own_gpu_or_the_cpu(monkeypatch, gpus, nproc, expected):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    expected = [(torch.device(device), backend) for device, backend in expected]
    assert [launch.device_and_backend(rank, nproc, gpus, True) for rank in range(nproc)] == expected
    assert [launch.rank_device_and_backend(rank, nproc) for rank in range(nproc)] == expected  # reads torch


def test_without_nccl_gpus_are_not_used(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)  # e.g. a build without NCCL
    assert launch.rank_device_and_backend(1, 2) == (torch.device("cpu"), "gloo")


def test_a_rank_outside_the_local_world_is_an_error():
    with pytest.raises(ValueError, match="local rank 2"):
        launch.device_and_backend(2, 2, 4, True)


@pytest.mark.parametrize(("cuda_devices", "processes"), [(0, 2), (1, 1), (2, 2), (8, 8)])
def test_processes_to_start(monkeypatch, cuda_devices, processes):
    assert launch.processes_to_start(cuda_devices) == processes
    monkeypatch.setattr(torch.cuda, "device_count", lambda: cuda_devices)  # an Apple GPU reports 0 CUDA devices
    assert launch.processes_to_start() == processes
    # each of those processes gets a device and a backend: its own GPU over NCCL, or the CPU over gloo
    expected = "nccl" if cuda_devices else "gloo"
    backends = {launch.device_and_backend(rank, processes, cuda_devices, True)[1] for rank in range(processes)}
    assert backends == {expected}


ROOT_CAUSE_IS_A_PEER = """\
[rank1]: Traceback (most recent call last):
[rank1]: RuntimeError: rank 1 fails on purpose after epoch 1
[rank0]: Traceback (most recent call last):
[rank0]: RuntimeError: [../gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:398.
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_05:20:01
  host      : localhost
  rank      : 0 (local_rank: 0)
"""


def test_the_rank_whose_own_error_it_was_is_named_not_a_peer_that_lost_it():
    # torchrun named rank 0, which failed only because rank 1 had died: the error names rank 1 and its message
    error = launch.LaunchError(1, "", ROOT_CAUSE_IS_A_PEER)
    assert error.rank == 1
    assert str(error) == "rank 1 failed (torchrun exit code 1): RuntimeError: rank 1 fails on purpose after epoch 1"
    peers_only = ROOT_CAUSE_IS_A_PEER.replace("[rank1]: RuntimeError: rank 1 fails on purpose after epoch 1\n", "")
    assert launch.LaunchError(1, "", peers_only).rank == 0  # no better candidate: torchrun's answer stands


@pytest.mark.parametrize(("platform", "interface"), [("linux", "lo"), ("darwin", "lo0"), ("win32", None)])
def test_gloo_listens_on_the_loopback_interface_of_each_platform(platform, interface):
    assert launch.loopback_interface(platform) == interface
    env = launch.launch_environment({"PATH": "/bin"}, platform)
    assert env.get("GLOO_SOCKET_IFNAME") == interface
    assert env["OMP_NUM_THREADS"] == "1" and env["PATH"] == "/bin"
    chosen = launch.launch_environment({"GLOO_SOCKET_IFNAME": "eth1", "OMP_NUM_THREADS": "4"}, platform)
    assert chosen["GLOO_SOCKET_IFNAME"] == "eth1" and chosen["OMP_NUM_THREADS"] == "4"  # the user's choice stays


@pytest.mark.launches
def test_run_script_returns_its_output_or_raises_its_error(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text("import sys\nprint('argument', sys.argv[1], flush=True)\nif sys.argv[1] == 'fail':\n"
                      "    raise ValueError('it fails on purpose')\n")
    assert launch.run_script(script, ["ok"], echo=False) == "argument ok\n"
    with pytest.raises(launch.LaunchError) as failure:
        launch.run_script(script, ["fail"], echo=False)
    assert failure.value.returncode == 1 and failure.value.stdout == "argument fail\n"
    assert "(plain.py exit code 1)" in str(failure.value) and "ValueError: it fails on purpose" in str(failure.value)


# torchrun's stderr when rank 1 raises, recorded by tests/data/launch/record.py on Python 3.10 to 3.13, 3.13 with
# colour off and on: Python 3.13 colours tracebacks under FORCE_COLOR (Colab sets it) or PYTHON_COLORS=1
RECORDINGS = sorted((Path(__file__).parent / "data" / "launch").glob("*.txt"))


def test_every_python_and_colour_case_is_recorded():
    assert {path.stem for path in RECORDINGS} >= {"py310", "py311", "py312", "py313", "py313-force-color",
                                                   "py313-python-colors", "py313-no-color"}
    coloured = [path.stem for path in RECORDINGS if "\x1b[" in path.read_text()]
    assert coloured == ["py313-force-color", "py313-python-colors"]  # the recordings hold the real colour codes


@pytest.mark.parametrize("recording", RECORDINGS, ids=lambda path: path.stem)
def test_the_failing_rank_is_named_with_its_own_error_on_every_python(recording):
    error = launch.LaunchError(1, "", recording.read_text())
    assert error.rank == 1
    assert str(error) == "rank 1 failed (torchrun exit code 1): RuntimeError: rank 1 fails on purpose after epoch 1"
    assert "\x1b" not in error.stderr


@pytest.mark.launches
def test_launched_processes_write_no_colour():
    assert launch.launch_environment({"FORCE_COLOR": "1"})["PYTHON_COLORS"] == "0"  # 3.13: overrides FORCE_COLOR


GIB = 2**30


@pytest.mark.parametrize(("cuda_devices", "available", "processes", "why"), [
    (0, 16 * GIB, 4, None),  # a laptop: 4 CPU processes over gloo, the (2, 2) mesh included
    (0, 1 * GIB, 2, "4 CPU processes need about 2.5 GiB and 1.0 GiB is available: 2 processes, so no (2, 2) mesh"),
    (1, 12 * GIB, 4, None),  # Colab's T4: NCCL needs a GPU per process, so the CPU over gloo
    (1, 2 * GIB, 2, "4 CPU processes need about 2.5 GiB and 2.0 GiB is available: 2 processes, so no (2, 2) mesh"),
    (2, 1 * GIB, 2, "the (2, 2) mesh needs 4 GPUs, and this machine has 2: 2 processes, one per GPU"),
    (3, 64 * GIB, 2, "the (2, 2) mesh needs 4 GPUs, and this machine has 3: 2 processes, one per GPU"),
    (4, 1 * GIB, 4, None),
    (8, 64 * GIB, 4, None),
])
def test_model_parallel_processes_for_0_1_2_4_gpus(cuda_devices, available, processes, why):
    assert launch.model_parallel_processes(cuda_devices, available) == (processes, why)
    # each process then gets its own GPU over NCCL exactly when there are enough GPUs for all of them
    devices = {launch.device_and_backend(rank, processes, cuda_devices, True) for rank in range(processes)}
    assert {backend for _, backend in devices} == ({"nccl"} if cuda_devices >= processes else {"gloo"})
    assert len(devices) == (processes if cuda_devices >= processes else 1)


@pytest.mark.parametrize(("available", "fork", "fits"), [
    (GIB, True, False), (1.2 * GIB, True, True), (1.2 * GIB, False, False), (3 * GIB, False, True),
])
def test_four_cpu_ranks_fit_in_1_1_gib_when_forked_else_in_2_5(available, fork, fits):
    """Binder's 2 GB leaves about 1.2 GiB beside chapter 11's kernel: forked workers fit there, new Pythons do not."""
    fit, why = launch.four_cpu_ranks_fit(int(available), fork)
    assert fit is fits
    if fits:
        assert why is None
    else:
        assert why == (f"not on 4 ranks: they need about {1.1 if fork else 2.5} GiB free, and "
                       f"{available / GIB:.1f} GiB is free here")


def test_model_parallel_processes_refuses_negative_counts():
    with pytest.raises(ValueError, match="cannot be negative"):
        launch.model_parallel_processes(-1, GIB)


def fake_cgroup(tmp_path, version: int, limit: str, usage: int, stat: dict[str, int]):
    """A /proc/self/cgroup and a cgroup file system with one limited cgroup, /job, inside an unlimited root."""
    sys_fs = tmp_path / "cgroup"
    if version == 2:
        names, folder, lines = ("memory.max", "memory.current"), sys_fs / "job", "0::/job\n"
    else:
        names = ("memory.limit_in_bytes", "memory.usage_in_bytes")
        folder, lines = sys_fs / "memory" / "job", "4:memory:/job\n3:cpuset:/\n0::/\n"
    folder.mkdir(parents=True)
    (folder / names[0]).write_text(limit + "\n")
    (folder / names[1]).write_text(f"{usage}\n")
    (folder / "memory.stat").write_text("".join(f"{name} {value}\n" for name, value in stat.items()))
    (tmp_path / "self-cgroup").write_text(lines)
    return tmp_path / "self-cgroup", sys_fs


def cache_stat(version: int, cache: int, mapped: int, shared: int, inactive: int) -> dict[str, int]:
    """memory.stat's file cache, mapped files, shared memory and inactive file cache, as each version names them."""
    if version == 1:
        return {"total_rss": 1, "total_cache": cache, "total_mapped_file": mapped, "total_shmem": shared,
                "total_inactive_file": inactive}
    return {"anon": 1, "file": cache, "file_mapped": mapped, "shmem": shared, "inactive_file": inactive}


@pytest.mark.parametrize("version", [1, 2])
def test_available_memory_is_what_the_cgroup_leaves(tmp_path, version):
    # Binder's 2 GB: 1.5 GiB used, of it 0.5 GiB of file cache: 0.2 GiB mapped by processes (torch's libraries)
    # and 0.05 GiB of shared memory stay; the rest the system drops (even the active part, 0.25 GiB of it here)
    stat = cache_stat(version, GIB // 2, GIB // 5, GIB // 20, GIB // 20)
    files = fake_cgroup(tmp_path, version, str(2 * GIB), 3 * GIB // 2, stat)
    assert launch.available_memory(*files) == 2 * GIB - 3 * GIB // 2 + GIB // 2 - GIB // 5 - GIB // 20


@pytest.mark.parametrize("version", [1, 2])
def test_without_the_cache_figures_only_the_inactive_file_cache_counts_as_free(tmp_path, version):
    stat = {"total_inactive_file" if version == 1 else "inactive_file": GIB // 4}
    files = fake_cgroup(tmp_path, version, str(2 * GIB), 3 * GIB // 2, stat)
    assert launch.available_memory(*files) == 3 * GIB // 4


@pytest.mark.parametrize("version", [1, 2])
def test_available_memory_without_a_limit_is_the_system_s(tmp_path, monkeypatch, version):
    monkeypatch.setattr(launch.psutil, "virtual_memory", lambda: SimpleNamespace(available=5 * GIB))
    unlimited = "max" if version == 2 else str(9223372036854771712)  # what each version writes for none
    assert launch.available_memory(*fake_cgroup(tmp_path, version, unlimited, GIB, {})) == 5 * GIB
    assert launch.available_memory(tmp_path / "missing", tmp_path) == 5 * GIB  # no cgroup file: not Linux


def test_node_commands_meet_with_the_c10d_rendezvous_one_of_them_holding_it():
    host = launch.node_command("train.py", "1:2", 2, ["--steps", "3"], "127.0.0.1:29400", "job", host=True,
                               restarts=1, log_dir="/tmp/logs", rdzv_conf="last_call_timeout=5")
    other = launch.node_command("train.py", 2, 1, [], "127.0.0.1:29400", "job", host=False)
    assert "--nnodes=1:2" in host and "--nproc-per-node=2" in host and "--max-restarts=1" in host
    assert "--rdzv-backend=c10d" in host and "--rdzv-endpoint=127.0.0.1:29400" in host and "--rdzv-id=job" in host
    assert "--rdzv-conf=is_host=1,last_call_timeout=5" in host and "--rdzv-conf=is_host=0" in other
    assert "--log-dir=/tmp/logs" in host and host[-3:] == ["train.py", "--steps", "3"]
    # no --node-rank: c10d numbers the agents when the round closes (by host name, then pid)
    assert not any(part.startswith("--node-rank") for part in host + other)


@pytest.mark.parametrize("settings", [
    {"nodes": 0}, {"nproc_per_node": 0}, {"restarts": -1}, {"min_nodes": 0}, {"min_nodes": 3},
])
def test_a_job_without_nodes_workers_or_with_negative_restarts_is_refused(settings):
    with pytest.raises(ValueError, match="nodes|restarts"):
        launch.torchrun_nodes("train.py", **settings)


@pytest.mark.launches
def test_two_nodes_on_one_machine_meet_and_leave_nothing_behind(script):
    before = set(running(script))
    outputs = launch.torchrun_nodes(script, nodes=2, nproc_per_node=1, args=["none"], timeout=180, echo=False)
    printed = "".join(outputs)
    assert "rank 0 of 2: sum 3" in printed and "rank 1 of 2: sum 3" in printed  # one worker on each node
    assert set(running(script)) <= before


@pytest.mark.launches
def test_two_hanging_nodes_are_stopped_and_say_what_they_printed_last(script):
    # each node's agent, and its worker unless a busy machine has not started it yet at 8 s
    with pytest.raises(TimeoutError, match=r"within 8 s and were stopped\. Still running: node 0 and [01] process(es)? "
                                           r"it started, node 1 and [01] process(es)? it started\. Last lines: node 0: "
                                           r"'.*' on stdout, '.*' on stderr; node 1: .+"):
        launch.torchrun_nodes(script, nodes=2, nproc_per_node=1, args=["sleep"], timeout=8, echo=False)
    assert running(script) == []


@pytest.mark.launches
def test_a_run_that_ends_on_its_own_is_no_timeout_however_late_the_clock_says_it_is(script, monkeypatch):
    """Only the timer stops a run: a clock that runs fast (make check-timing stretches the kernel's) must not turn
    a finished run into a TimeoutError, which would also hide a failing node's own error."""
    late = iter(range(0, 10**9, 1000))  # each reading 1000 s after the one before
    monkeypatch.setattr(launch, "time", SimpleNamespace(monotonic=lambda: next(late), monotonic_ns=time.monotonic_ns))
    outputs = launch.torchrun_nodes(script, nodes=2, nproc_per_node=1, args=["none"], timeout=180, echo=False)
    assert "rank 0 of 2: sum 3" in "".join(outputs)


@pytest.mark.parametrize(("visible", "nodes", "nproc", "expected"), [
    ([], 2, 1, ["", ""]),  # no GPU: every worker on the CPU
    (["0"], 2, 1, ["", ""]),  # one GPU, two one-worker nodes: not both on cuda:0 (NCCL refuses it)
    (["0"], 1, 1, ["0"]),
    (["0", "1"], 2, 1, ["0", "1"]),  # a GPU each, numbered 0 on each node
    (["0", "1"], 2, 2, ["", ""]),  # 4 workers, 2 GPUs
    (["3", "5", "6", "7"], 2, 2, ["3,5", "6,7"]),  # a restricted CUDA_VISIBLE_DEVICES is split, not renumbered
])
def test_each_node_on_one_machine_sees_its_own_gpus_or_none(visible, nodes, nproc, expected):
    assert [launch.node_visible_gpus(n, nodes, nproc, visible) for n in range(nodes)] == expected


def test_the_visible_gpus_follow_cuda_visible_devices(monkeypatch):
    monkeypatch.setattr(launch.torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    assert launch.visible_gpus() == ["4", "6"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert launch.visible_gpus() == ["0", "1"]
    monkeypatch.setattr(launch.torch.cuda, "device_count", lambda: 0)
    assert launch.visible_gpus() == []


def test_leave_keeps_every_process_group_from_its_destructor(tmp_path, monkeypatch):
    """Issue 51: a gloo group destroyed as a forked worker's main() returned deadlocked its rank (the destructor joins
    gloo's threads holding the GIL; one of them waited for the GIL to free the last collective's work). leave()
    keeps every group, subgroups too, so that none is destroyed before the process ends in os._exit."""
    from d2l_ext import ranks

    monkeypatch.setattr(ranks, "_KEPT_GROUPS", [])
    monkeypatch.setattr(ranks, "exit_without_teardown", lambda: None)
    ranks.dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    subgroup = ranks.dist.new_group([0])
    world = ranks.dist.group.WORLD
    ranks.leave()
    assert not ranks.dist.is_initialized()  # destroyed, as before: unregistered
    assert any(group is world for group in ranks._KEPT_GROUPS)
    assert any(group is subgroup for group in ranks._KEPT_GROUPS)


@pytest.mark.launches
def test_a_timed_out_launch_says_where_its_processes_were_when_asked(tmp_path, monkeypatch):
    """D2L_EXT_HANG_DUMP: py-spy's dump of each process of a launch that timed out, before it is killed."""
    if launch.shutil.which("py-spy") is None and not (Path(sys.executable).parent / "py-spy").exists():
        pytest.skip("py-spy is not installed here")
    dump = tmp_path / "stacks.txt"
    monkeypatch.setenv("D2L_EXT_HANG_DUMP", str(dump))
    script = tmp_path / "wait.py"
    script.write_text("import time\n\ndef wait_here():\n    time.sleep(60)\n\nwait_here()\n")
    with pytest.raises(TimeoutError):
        launch.run_script(script, timeout=3, echo=False)
    text = dump.read_text()
    assert "wait.py" in text and "wait_here" in text, text[-2000:]


def test_a_timer_that_fires_after_every_process_ended_stops_nothing():
    """The timer may fire between the last process's end and its own cancelling: the run then reports its own outcome,
    not a timeout."""
    with launch.Supervised(timeout=600) as run:
        run.start([sys.executable, "-c", "print('done')"], dict(os.environ), name="quick")
        run.wait()
        run._stop()  # as the timer would, late
    assert not run.stopped.is_set() and run.running == [] and run.stdout == [["done\n"]]
