"""The memory limits make check-memory runs a notebook under (tools/checks/memory.py): a cgroup (version 1, or
version 2 where the memory controller is delegated to this user) made for each notebook; a desktop's systemd scope
(``systemd-run --user --scope -p MemoryMax=...``); or none, the kernel's process tree watched instead. Each says how
to start the kernel in it, reads the tree's memory as the limit counts it, and says whether the limit killed
anything. ``choose_limit`` picks the first this machine allows."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from d2l_ext.room import held_bytes, read_stat


class Limit:
    """How the kernel's process tree is held to ``limit`` bytes, and how its memory is read."""

    name = "none"
    enforced = False

    def __init__(self, limit: int):
        self.limit = limit
        self.kernel_pid: int | None = None

    def prefix(self) -> list[str]:
        """The command that starts the kernel inside the limit (put before the kernel's own command)."""
        return []

    def started(self, pid: int) -> None:
        self.kernel_pid = pid

    def usage(self) -> int | None:
        """Bytes the tree holds now."""
        return tree_pss(self.kernel_pid) if self.kernel_pid else None


    def oom_kills(self) -> int:
        """How many processes the operating system killed for memory in this limit so far."""
        return 0

    def pids(self) -> list[int]:
        if self.kernel_pid is None:
            return []
        try:
            root = psutil.Process(self.kernel_pid)
            return [root.pid] + [child.pid for child in root.children(recursive=True)]
        except psutil.Error:
            return []

    def close(self) -> None:
        """Kill what is left of the tree and remove what the limit made."""
        kill(self.pids())


def kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def tree_pss(pid: int) -> int | None:
    """The summed proportional set size of ``pid`` and its descendants (shared pages counted once)."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    total = 0
    for process in processes:
        try:
            text = Path(f"/proc/{process.pid}/smaps_rollup").read_text()
            total += int(re.search(r"^Pss:\s+(\d+) kB", text, re.M)[1]) * 1024  # type: ignore[index]
        except (OSError, TypeError):
            try:
                total += process.memory_info().rss
            except psutil.Error:
                pass
    return total


def mapped_bytes(stat_file: Path, version: int) -> int | None:
    """What a cgroup's processes hold (d2l_ext.room.held_bytes: anonymous memory and mapped file pages), or None
    where its ``memory.stat`` cannot be read.

    The file cache the processes only read or wrote (Python's sources, a saved checkpoint) is left out: the
    system drops it before it reaches a limit, while mapped pages (the code of torch's libraries) are in use.
    """
    try:
        return held_bytes(read_stat(stat_file), version)
    except OSError:
        return None


class Cgroup(Limit):
    """A cgroup made for one notebook, version 1 or 2, under the cgroup this process is in."""

    enforced = True

    def __init__(self, limit: int, parent: Path, version: int):
        super().__init__(limit)
        self.version = version
        self.name = f"a cgroup (version {version})"
        self.path = parent / f"d2l-check-memory-{os.getpid()}-{threading.get_ident()}-{time.monotonic_ns()}"
        self.path.mkdir()
        try:
            if version == 1:
                (self.path / "memory.limit_in_bytes").write_text(str(limit))
                swap = self.path / "memory.memsw.limit_in_bytes"  # memory and swap together: no swapping out
                if swap.exists():
                    swap.write_text(str(limit))
            else:
                (self.path / "memory.max").write_text(str(limit))
                (self.path / "memory.swap.max").write_text("0")
        except OSError:
            self.path.rmdir()
            raise

    def prefix(self) -> list[str]:
        # the shell puts itself in the cgroup, then becomes the kernel: everything the kernel starts is in it too
        return ["/bin/sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(self.path)]

    def usage(self) -> int | None:
        return mapped_bytes(self.path / "memory.stat", self.version)

    def oom_kills(self) -> int:
        try:
            if self.version == 1:
                return read_stat(self.path / "memory.oom_control").get("oom_kill", 0)
            return read_stat(self.path / "memory.events").get("oom_kill", 0)
        except OSError:
            return 0

    def pids(self) -> list[int]:
        try:
            return [int(pid) for pid in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return super().pids()

    def close(self) -> None:
        for _ in range(50):
            pids = self.pids()
            if not pids:
                break
            kill(pids)
            time.sleep(0.1)
        try:
            self.path.rmdir()
        except OSError:
            pass


class SystemdScope(Limit):
    """The kernel started by ``systemd-run --user --scope`` with ``MemoryMax``; its cgroup read once it runs."""

    enforced = True
    name = "systemd-run --user --scope (MemoryMax)"

    def __init__(self, limit: int):
        super().__init__(limit)
        self.cgroup: Path | None = None

    def prefix(self) -> list[str]:
        return ["systemd-run", "--user", "--scope", "--quiet", "-p", f"MemoryMax={self.limit}",
                "-p", "MemorySwapMax=0", "--"]

    def started(self, pid: int) -> None:
        super().started(pid)
        for _ in range(100):  # systemd-run execs the kernel once the scope exists
            path = cgroup_of(pid)
            if path is not None and (path / "memory.current").exists():
                self.cgroup = path
                return
            time.sleep(0.05)

    def usage(self) -> int | None:
        if self.cgroup is None:
            return super().usage()
        return mapped_bytes(self.cgroup / "memory.stat", 2)

    def oom_kills(self) -> int:
        try:
            return read_stat(self.cgroup / "memory.events").get("oom_kill", 0) if self.cgroup else 0
        except OSError:
            return 0


def cgroup_mounts(mountinfo: str) -> dict[str, Path]:
    """Where the cgroup hierarchies are mounted: {"memory": v1 mount, "unified": v2 mount}."""
    mounts: dict[str, Path] = {}
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, after = left.split(), right.split()
        if len(fields) < 5 or len(after) < 3:
            continue
        if after[0] == "cgroup2":
            mounts.setdefault("unified", Path(fields[4]))
        elif after[0] == "cgroup" and "memory" in after[2].split(","):
            mounts.setdefault("memory", Path(fields[4]))
    return mounts


def own_cgroups(proc_cgroup: str) -> dict[str, str]:
    """This process's cgroup paths: {"memory": v1 path, "unified": v2 path}."""
    paths = {}
    for line in proc_cgroup.splitlines():
        number, controllers, path = line.split(":", 2)
        if number == "0" and controllers == "":
            paths["unified"] = path
        elif "memory" in controllers.split(","):
            paths["memory"] = path
    return paths


def cgroup_of(pid: int) -> Path | None:
    """The version 2 cgroup directory of ``pid``, where it has one."""
    try:
        mounts = cgroup_mounts(Path("/proc/self/mountinfo").read_text())
        paths = own_cgroups(Path(f"/proc/{pid}/cgroup").read_text())
    except OSError:
        return None
    if "unified" not in mounts or "unified" not in paths:
        return None
    return mounts["unified"] / paths["unified"].lstrip("/")


def cgroup_parent(mounts: dict[str, Path], paths: dict[str, str]) -> tuple[Path, int] | None:
    """The cgroup under which a limited child can be made, and its version, or None."""
    if "memory" in mounts and "memory" in paths:  # version 1: any cgroup we may write to takes children
        for parent in (mounts["memory"] / paths["memory"].lstrip("/"), mounts["memory"]):
            if (parent / "memory.limit_in_bytes").exists() and os.access(parent, os.W_OK):
                return parent, 1
    if "unified" in mounts and "unified" in paths:  # version 2: the memory controller must be delegated to us
        parent = mounts["unified"] / paths["unified"].lstrip("/")
        try:
            delegated = "memory" in (parent / "cgroup.subtree_control").read_text().split()
        except OSError:
            delegated = False
        if delegated and os.access(parent, os.W_OK):
            return parent, 2
    return None


def systemd_scope_works() -> bool:
    if shutil.which("systemd-run") is None:
        return False
    try:
        done = subprocess.run(["systemd-run", "--user", "--scope", "--quiet", "-p", "MemoryMax=1G", "true"],
                              capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def choose_limit(no_limit: bool = False) -> tuple[Callable[[int], Limit], str]:
    """A factory of limits, one per notebook, and a line that says which kind and why."""
    if no_limit:
        return Limit, "no operating-system limit (--no-limit): the process tree's memory is watched instead"
    try:
        mounts = cgroup_mounts(Path("/proc/self/mountinfo").read_text())
        paths = own_cgroups(Path("/proc/self/cgroup").read_text())
    except OSError:
        mounts, paths = {}, {}
    found = cgroup_parent(mounts, paths)
    if found is not None:
        parent, version = found
        for stale in parent.glob("d2l-check-memory-*"):  # left by a run that was killed: empty, removed
            try:
                stale.rmdir()
            except OSError:
                pass
        try:
            Cgroup(1 << 30, parent, version).close()  # one made and removed: the tool may make them
            return (lambda limit: Cgroup(limit, parent, version)), \
                f"memory limit: a cgroup (version {version}) per notebook, under {parent}"
        except OSError as error:
            why = f"a cgroup could not be made under {parent} ({error.strerror})"
    else:
        why = "no cgroup memory controller this user may write to"
    if systemd_scope_works():
        return SystemdScope, f"memory limit: systemd-run --user --scope with MemoryMax ({why})"
    return Limit, (f"NO MEMORY LIMIT can be set on this machine ({why}; no working systemd-run --user): "
                   "the kernel's process tree is watched instead, and a notebook over the limit is stopped")
