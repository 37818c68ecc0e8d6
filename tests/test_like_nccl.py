"""The test mode that makes gloo fail as NCCL does (``D2L_EXT_LIKE_NCCL=1``, ``d2l_ext.ranks.fail_as_nccl_would``),
and chapter 11 under it: on a machine with 2 GPUs its scripts run over NCCL, where a collective whose peer is gone
waits for the watchdog instead of raising at once (the GPU review's B1 and M1)."""

from __future__ import annotations

import datetime
import os
import signal
from pathlib import Path

import pytest
import torch.distributed as dist

from d2l_ext import launch, ranks

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def gloo_group(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    yield
    dist.destroy_process_group()


@pytest.fixture
def recorded(monkeypatch):
    """What the mode did instead of sleeping and aborting this process: the sleeps, the signals, the lines."""
    seen: dict[str, list] = {"sleep": [], "kill": [], "lines": []}
    monkeypatch.setattr(ranks.time, "sleep", seen["sleep"].append)
    monkeypatch.setattr(ranks.os, "kill", lambda pid, sig: seen["kill"].append((pid, sig)))
    monkeypatch.setattr(ranks, "write_lines", lambda *lines: seen["lines"].extend(lines))
    return seen


def test_the_mode_is_on_only_when_asked():
    assert ranks.like_nccl({"D2L_EXT_LIKE_NCCL": "1"})
    assert not ranks.like_nccl({"D2L_EXT_LIKE_NCCL": "0"})
    assert not ranks.like_nccl({})


def test_under_the_mode_a_failed_gloo_collective_waits_for_the_timeout_then_aborts(gloo_group, recorded,
                                                                                   monkeypatch):
    monkeypatch.setenv(ranks.LIKE_NCCL, "1")
    with ranks.fail_as_nccl_would(30):
        raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:1: "
                           "Connection reset by peer. This is typically caused by a remote worker hanging")
    assert recorded["sleep"] == [30]
    assert recorded["kill"] == [(os.getpid(), signal.SIGABRT)]
    assert recorded["lines"][0] == ("rank 0: gloo raised at once (Read error [127.0.0.1]:1: Connection reset by "
                                    "peer); like NCCL, waiting 30 s for the watchdog")
    assert "timed out after 30 s" in recorded["lines"][1]


def test_without_the_mode_gloo_raises_at_once(gloo_group, recorded, monkeypatch):
    monkeypatch.delenv(ranks.LIKE_NCCL, raising=False)
    with pytest.raises(RuntimeError, match="Connection reset"), ranks.fail_as_nccl_would(30):
        raise RuntimeError("Connection reset by peer")
    assert recorded == {"sleep": [], "kill": [], "lines": []}


def test_the_mode_leaves_nccl_alone(gloo_group, recorded, monkeypatch):
    monkeypatch.setenv(ranks.LIKE_NCCL, "1")
    monkeypatch.setattr(ranks.dist, "get_backend", lambda *a, **k: "nccl")  # NCCL's own watchdog does this
    with pytest.raises(RuntimeError), ranks.fail_as_nccl_would(30):
        raise RuntimeError("NCCL error")
    assert recorded["kill"] == []


def test_a_block_that_succeeds_is_untouched(gloo_group, recorded, monkeypatch):
    monkeypatch.setenv(ranks.LIKE_NCCL, "1")
    with ranks.fail_as_nccl_would(30):
        pass
    assert recorded == {"sleep": [], "kill": [], "lines": []}


@pytest.mark.launches
def test_a_run_that_would_wait_past_its_limit_names_node_rank_and_last_step(tmp_path, monkeypatch):
    """Bad input: under the mode, a timeout longer than the launch's limit fails with the launch's own message."""
    monkeypatch.setenv(ranks.LIKE_NCCL, "1")
    monkeypatch.chdir(REPO / "notebooks")
    try:
        printed = launch.torchrun_nodes(
            "scripts/survive.py", nodes=2, nproc_per_node=1, min_nodes=1, restarts=1, echo=False, timeout=40,
            rdzv_conf="last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=3",
            args=["--checkpoints", str(tmp_path / "c"), "--out", str(tmp_path / "o.pt"), "--kill-node", "1:4",
                  "--timeout", "600"])
    except TimeoutError as raised:
        message = str(raised)
    else:  # once, under load (stop 55), the launch ended in 19 s: what each node printed says how
        pytest.fail("the launch ended without waiting for the watchdog; what the nodes printed:\n"
                    + "\n".join(f"node {n}:\n{text[-1500:]}" for n, text in enumerate(printed)))
    assert "node 0: " in message and "rank 0: gloo raised at once" in message, message
    assert "waiting 600 s for the watchdog" in message, message
    assert "attempt 0: step 3 done" in message, message  # the last step node 0 finished
    assert "node 1 dies at step 4" in message, message


def test_join_keeps_a_rank_on_the_cpu_when_asked_even_with_gpus(monkeypatch, tmp_path):
    """collectives.py --cpu (chapter 10.5): with 2 GPUs reported, join(cpu=True) takes gloo and the CPU, and touches
    no CUDA call (none would work here)."""
    from tests.helpers import free_port

    monkeypatch.setattr(ranks.torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(ranks.dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr(ranks.torch.cuda, "set_device", lambda device: pytest.fail("set_device called"))
    assert ranks.rank_device_and_backend(0, 1)[1] == "nccl"  # what it would take without cpu=True
    for name, value in {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "RANK": "0", "WORLD_SIZE": "1",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(name, value)
    try:
        local_rank, device, backend = ranks.join(timeout=30, cpu=True)
        assert (local_rank, device.type, backend, dist.get_backend()) == (0, "cpu", "gloo", "gloo")
    finally:
        dist.destroy_process_group()
