"""A rank that skips a collective, and what the others see: a timeout that names nothing; then, with the debug
level DETAIL, a mismatch named at once.

    torchrun --nproc-per-node=2 scripts/hang.py 5 OUT      # a timeout of 5 s; rank 1 writes py-spy's dump to OUT

Every rank joins with a short timeout (the first argument, in seconds; the default is 10 minutes, or 30 with
gloo's own setting) so that a hang ends in an error instead of waiting until someone notices.

1. **A skipped collective.** Rank 1 "forgets" the all_reduce that rank 0 makes (a branch that only some ranks
   take: the most common cause of a hang). While rank 0 waits, rank 1 runs ``py-spy dump`` on it, as you would
   from a shell on the node, and writes the dump to ``OUT``, headed by one line on where rank 0 waits (or why
   py-spy could not attach).
2. **The same mistake under DETAIL.** ``dist.set_debug_level(DETAIL)`` (what ``TORCH_DISTRIBUTED_DEBUG=DETAIL``
   sets at start) makes every new process group check, before each collective, that all ranks call the same one
   with the same shapes. Both ranks call all_reduce, with 4 and 5 numbers, in a new group.

Each rank prints what it got, without the C++ source paths of the message, which change with every build.
"""

from __future__ import annotations

import datetime
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from d2l_ext.ranks import exit_without_teardown, write_lines  # write_lines: one system call a line

SOURCE_PATH = re.compile(r"\[[^\]\s]*\.(?:cc|cpp|h|hpp):\d+\]\s*")


# DETAIL's fingerprint repeats every TensorOptions default: left out, the shapes and dtypes stay
DEVICE_TYPES = re.compile(r", TensorDeviceTypes=TensorOptions\(.*?\)\)")
COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def first_line(error: BaseException) -> str:
    """Return the first line of ``error``'s message, without C++ source paths or repeated defaults."""
    return DEVICE_TYPES.sub("", SOURCE_PATH.sub("", str(error).strip().splitlines()[0]))


def dump(pid: int, out: Path) -> str:
    """Write ``py-spy dump`` of process ``pid`` to ``out``; return one line on what it found."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(py_spy).exists():
        out.write_text("py-spy is not installed here (pip install py-spy)\n")
        return "py-spy is not installed (pip install py-spy)"
    done = subprocess.run([py_spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=30,
                          env={**os.environ, "NO_COLOR": "1", "CLICOLOR": "0", "TERM": "dumb"})
    text = COLOUR.sub("", done.stdout + done.stderr)
    out.write_text(text)
    if done.returncode != 0:  # no ptrace permission: a container without CAP_SYS_PTRACE, macOS without sudo
        return "py-spy could not attach: " + (done.stderr.strip().splitlines() or ["no message"])[-1]
    frames = re.findall(r"^\s+(\S+) \(([^:)]+)", text, flags=re.M)  # innermost first
    names = [name for name, _ in frames]
    caller = next((f"{name} ({Path(path).name})" for name, path in frames if Path(path).name == "hang.py"), "?")
    where = "all_reduce" if "all_reduce" in names else names[0] if names else "?"
    return f"py-spy: rank 0 waits in {where}, called from {caller}"


def main() -> None:
    seconds, out = float(sys.argv[1]), Path(sys.argv[2])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=seconds))
    rank = dist.get_rank()
    pids: list = [None] * dist.get_world_size()
    dist.all_gather_object(pids, os.getpid())  # each rank's process id, for py-spy

    started = time.monotonic()
    try:
        if rank == 1:  # busy elsewhere: the all_reduce below never comes
            found = dump(pids[0], out)  # its line heads the dump, which depends on py-spy and permissions
            out.write_text(f"{found}\n\n{out.read_text()}")
            write_lines(f"rank {rank}: skips the all_reduce")
            time.sleep(max(0.0, seconds + 1 - (time.monotonic() - started)))
        else:
            dist.all_reduce(torch.ones(4))
            write_lines(f"rank {rank}: all_reduce done")
    except RuntimeError as error:
        write_lines(f"rank {rank}: RuntimeError after {time.monotonic() - started:.1f} s: {first_line(error)}")

    dist.set_debug_level(dist.DebugLevel.DETAIL)  # pyright: ignore[reportPrivateImportUsage]
    checked = dist.new_group(backend="gloo")  # a new group, checked by the debug level
    assert isinstance(checked, dist.ProcessGroup)
    started = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4 + rank), group=checked)
        write_lines(f"rank {rank}: all_reduce done")
    except RuntimeError as error:
        write_lines(f"rank {rank} (DETAIL): RuntimeError after {time.monotonic() - started:.1f} s: {first_line(error)}")
    exit_without_teardown()  # not destroy_process_group: after a failed collective it may wait on the peer


if __name__ == "__main__":
    main()
