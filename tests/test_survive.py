"""Chapter 11's training that survives: its run log read into attempts, the timeline drawn from them, and a killed
worker that no restart saves, which must fail the launch and leave nothing behind.

The runs that recover (a killed rank, a lost node, a resharded checkpoint, a hang) are checked by the chapter's
compared outputs: notebooks/11_survive.ipynb prints the steps of each attempt and the bit-for-bit comparison.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import matplotlib
import psutil
import pytest

from d2l_ext import diagrams, launch

matplotlib.use("Agg")

SURVIVE = Path(__file__).resolve().parents[1] / "notebooks" / "scripts" / "survive.py"

# what rank 0 and the killed rank 1 printed in a run of scripts/survive.py --kill 1:7 (torchrun, 2 workers,
# --max-restarts=1), steps and the worker lines of attempt 1 cut short
RUN = """\
attempt 0, worker RANK=0 LOCAL_RANK=0 GROUP_RANK=0 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2
attempt 0, worker RANK=1 LOCAL_RANK=1 GROUP_RANK=0 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2
attempt 0: step 0 done
attempt 0: step 1 done
attempt 0: step 2 done
attempt 0: checkpoint step_000003
attempt 0: step 3 done
attempt 0: rank 1 killed at step 4
attempt 1, worker RANK=0 LOCAL_RANK=0 GROUP_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1
attempt 1: resumed from step_000003 at step 3, world size 1
attempt 1: step 3 done
attempt 1: step 4 done
attempt 1: step 5 done
attempt 1: checkpoint step_000006
"""


def test_a_run_is_read_attempt_by_attempt():
    first, second = diagrams.read_attempts(RUN)
    assert (first.number, first.world_size, first.resumed_from) == (0, 2, None)
    assert first.steps == [0, 1, 2, 3] and first.checkpoints == [3] and first.killed == "rank 1 at step 4"
    # LOCAL_WORLD_SIZE is not taken for WORLD_SIZE
    assert (second.number, second.world_size, second.resumed_from) == (1, 1, 3)
    assert second.steps == [3, 4, 5] and second.checkpoints == [6] and second.killed is None


def test_a_run_without_its_killed_rank_s_line_still_reads():
    first, _ = diagrams.read_attempts(RUN.replace("attempt 0: rank 1 killed at step 4\n", ""))
    assert first.killed is None and first.steps == [0, 1, 2, 3]


def test_the_timeline_hatches_the_steps_done_again_and_marks_the_failure():
    ax = diagrams.draw_restart_timeline(diagrams.read_attempts(RUN), failures=["rank 1 killed at step 4"])
    bars = [patch for patch in ax.patches if patch.get_width() == pytest.approx(0.9)]
    assert len(bars) == 4 + 3  # every step each attempt finished
    assert [bar.get_x() for bar in bars if bar.get_hatch()] == [pytest.approx(3.05)]  # step 3, done twice
    assert [text.get_text() for text in ax.texts if text.get_text()] == ["rank 1 killed at step 4"]
    assert [label.get_text() for label in ax.get_yticklabels()] == ["attempt 1\n(world size 1)",
                                                                    "attempt 0\n(world size 2)"]


def listening_ports() -> set[int]:
    """Return the TCP ports this process listens on."""
    return {c.laddr.port for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN}


@pytest.mark.launches
def test_a_killed_worker_without_a_restart_fails_and_leaves_nothing(tmp_path, monkeypatch):
    temporary = tmp_path / "temporary"
    temporary.mkdir()
    monkeypatch.setenv("TMPDIR", str(temporary))
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    ports = listening_ports()
    with pytest.raises(launch.LaunchError):
        launch.torchrun_nodes(SURVIVE, nodes=1, nproc_per_node=2, restarts=0, timeout=180, echo=False,
                              args=["--steps", "3", "--every", "1", "--checkpoints", str(tmp_path / "ck"),
                                    "--out", str(tmp_path / "final.pt"), "--kill", "1:2"])
    # this launch's processes: their command lines name this test's folder (other tests and chapter 11 run
    # survive.py at the same time, in other folders)
    leftovers = [p.info["pid"] for p in psutil.process_iter(["pid", "cmdline"])
                 if any(str(tmp_path) in part for part in p.info["cmdline"] or [])]
    assert leftovers == [], "a worker or an agent outlived the failed launch"
    # torchinductor_<user>: torch's compile cache, which importing DCP creates once and every torch process reuses
    left = sorted(p.name for p in temporary.iterdir() if not p.name.startswith("torchinductor_"))
    assert left == [], "the launch left files in the temporary folder"
    assert listening_ports() == ports, "the rendezvous' port is still open"
    assert not (tmp_path / "final.pt").exists()
    assert [p.name for p in sorted((tmp_path / "ck").iterdir())] == ["step_000001", "step_000002"]


# a stand-in for torch.distributed: a collective that waits, in a module of its own
COLLECTIVES = """\
import time


def all_reduce():
    print("waiting", flush=True)
    time.sleep(60)
"""

WAITER = """\
import collectives


def main():
    collectives.all_reduce()


main()
"""


@pytest.mark.launches
def test_py_spy_finds_where_a_process_waits_or_says_why_not(tmp_path):
    """hang.py's dump(): py-spy on a live process whose stack is known (a script named hang.py, waiting in a
    function named all_reduce in another module), read the way the chapter reads rank 0's."""
    import subprocess
    import sys

    sys.path.insert(0, str(SURVIVE.parent))
    try:
        import hang  # notebooks/scripts/hang.py
    finally:
        sys.path.remove(str(SURVIVE.parent))
    script = tmp_path / "hang.py"
    script.write_text(WAITER)
    (tmp_path / "collectives.py").write_text(COLLECTIVES)
    waiter = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert waiter.stdout is not None and waiter.stdout.readline() == "waiting\n"
        found = hang.dump(waiter.pid, tmp_path / "dump.txt")
    finally:
        waiter.kill()
        waiter.wait()
    if found.startswith("py-spy could not attach"):  # no ptrace permission here: the line must say so
        pytest.skip(found)
    assert found == "py-spy: rank 0 waits in all_reduce, called from main (hang.py)"
    assert "all_reduce (" in (tmp_path / "dump.txt").read_text()
