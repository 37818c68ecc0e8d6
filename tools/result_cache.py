"""Reuse the passes of test files whose inputs have not changed: `make test`'s fast loop (a pytest plugin).

A contributor runs `make test` after every edit, and the whole suite takes minutes on 2 cores, most of it in
notebooks that the edit did not touch. Like a build system's test cache, this reruns a test file (a test module,
or a notebook under nbval) only when something it may read has changed since it last passed here:

- a notebook is keyed on its own bytes and on every other file in the repository except the other notebooks, the
  editions, markdown, and CI's scripts and workflows (.ci/, .github/): no notebook reads those;
- a test module is keyed on every file in the repository, notebooks included, unless it says
  ``READS_NOTEBOOKS = False`` at top level (it reads no notebook, edition or markdown file);
- both are keyed on the environment: the Python, every installed package and its version, the environment
  variables that change numbers or devices (OMP_*, MKL_*, CUDA_*, ...), the CPU's flags, the GPU device files
  present, and pytest's arguments.

"Every file" is what git lists (tracked, and untracked but not ignored), read whole: an edit that is not committed
counts. A file whose tests all passed is recorded in ``.venv/.test-results.json`` (under the environment, so a new
environment starts empty); a failure, an interrupted run, or a run with -k, -m, -x, --deselect or --lf records
nothing for it. A fresh clone, as in CI, has no record and runs everything; ``make test FRESH=1`` (pytest option
``--rerun-all``) ignores the record. The run ends with one line saying how many files were reused, and one naming
the slowest files that ran, each with its tests' seconds summed: pytest's ``--durations`` names tests, while a
chapter's cost is its notebook's cells together (issue 33 set chapter 11 a budget in make test).

Loaded with ``-p tools.result_cache --test-cache PATH``; without ``--test-cache`` it does nothing.

Why not pytest-testmon: it traces coverage inside the pytest process, so it does not see code run in Jupyter
kernels or torchrun workers, nor the data files a test reads, and the notebooks are the expensive items.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tools import REPO

# environment variables that can change what a test computes or which device it sees
KEYED_VARIABLES = re.compile(r"^(OMP_|MKL_|ONEDNN_|ATEN_|KMP_|OPENBLAS_|PYTHON|TORCH|PYTORCH_|CUDA_|HIP_|ROCR_|NCCL_|"
                             r"GLOO_|D2L_|NBVAL|LANG$|LC_|TZ$|NO_COLOR$|FORCE_COLOR$)")
DEVICE_FILES = ("/dev/nvidia*", "/dev/kfd", "/dev/dri/renderD*", "/dev/accel*", "/dev/dxg")
NOT_READ_BY_NOTEBOOKS = re.compile(r"(\.ipynb|\.md)$|^(editions|\.ci|\.github)/")
ENVIRONMENT_VARIABLE = "TEST_CACHE_ENVIRONMENT_KEY"  # not matched by KEYED_VARIABLES
SLOWEST_SHOWN = 5  # test files named in the summary line
OPTED_OUT = re.compile(r"^READS_NOTEBOOKS\s*=\s*False\b.*$", re.M)


def repository_files(root: Path = REPO) -> dict[str, str] | None:
    """Return {path: sha256 of its bytes} for every file git lists (tracked, or untracked and not ignored);
    a symbolic link is hashed as its target's name. None without git or outside a repository."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                                capture_output=True, check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        return None
    hashes = {}
    for name in sorted(set(filter(None, listed))):
        path = root / name
        if path.is_symlink():
            data = b"link:" + os.readlink(path).encode()
        elif path.is_file():
            data = path.read_bytes()
        else:  # listed by git but deleted in the working tree
            data = b"deleted"
        hashes[name] = hashlib.sha256(data).hexdigest()
    return hashes


def environment_key(arguments: list[str]) -> str:
    """Hash what outside the repository can change a result: interpreter, packages, variables, CPU, GPUs, options."""
    packages = sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions())
    variables = sorted(f"{k}={v}" for k, v in os.environ.items() if KEYED_VARIABLES.match(k))
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        flags = platform.processor()
    devices = sorted(str(p) for pattern in DEVICE_FILES for p in Path("/").glob(pattern.lstrip("/")))
    # the number of workers changes no result; every other option may (which files, how they are compared)
    options = [a for a in arguments if not re.fullmatch(r"-n|\d+|--numprocesses=\d+|-n\d+|--durations=\d+", a)]
    parts = [sys.version, sys.executable, platform.platform(), str(os.cpu_count()), flags,
             *packages, *variables, *devices, *options]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def file_keys(files: dict[str, str], environment: str, targets: list[str]) -> dict[str, str]:
    """Return {test file: key} for each test file in ``targets`` (repository-relative paths)."""
    everything = hashlib.sha256("".join(f"{n}:{h}\n" for n, h in files.items()).encode()).hexdigest()
    code = hashlib.sha256("".join(f"{n}:{h}\n" for n, h in files.items()
                                  if not NOT_READ_BY_NOTEBOOKS.search(n)).encode()).hexdigest()
    keys = {}
    for target in targets:
        own = files.get(target, "absent")
        if target.endswith(".ipynb"):
            inputs = code
        else:
            path = REPO / target
            reads_notebooks = not (path.is_file() and OPTED_OUT.search(path.read_text(encoding="utf-8")))
            inputs = everything if reads_notebooks else code
        keys[target] = hashlib.sha256(f"{environment}\n{inputs}\n{target}:{own}".encode()).hexdigest()
    return keys


class TestCache:
    """The plugin's state in one pytest process (the controller, or an xdist worker)."""

    def __init__(self, config: pytest.Config, record: Path):
        self.config, self.record = config, record
        self.files = repository_files(config.rootpath)
        # computed once, in the controller; xdist workers (started later, with its environment) take its value
        if hasattr(config, "workerinput") and ENVIRONMENT_VARIABLE in os.environ:
            self.environment = os.environ[ENVIRONMENT_VARIABLE]
        else:
            self.environment = environment_key(list(config.invocation_params.args))
            os.environ[ENVIRONMENT_VARIABLE] = self.environment
        self.keys: dict[str, str] = {}
        self.reused: list[str] = []
        self.failed: set[str] = set()
        self.seen: set[str] = set()
        self.seconds: dict[str, float] = {}  # test file: its tests' setup, call and teardown summed

    def relative(self, path: Path) -> str | None:
        path = Path(path).resolve()
        return str(path.relative_to(self.config.rootpath)) if path.is_relative_to(self.config.rootpath) else None

    def passed_before(self) -> dict[str, str]:
        try:
            return json.loads(self.record.read_text())
        except (OSError, ValueError):
            return {}

    def partial_selection(self) -> bool:
        """True when this run does not run every test of each file it collects, or may stop early."""
        option = self.config.option
        return bool(getattr(option, "keyword", "") or getattr(option, "markexpr", "")
                    or getattr(option, "deselect", None) or getattr(option, "maxfail", 0)
                    or getattr(option, "lf", False) or getattr(option, "exitfirst", False))

    def under_arguments(self, target: str) -> bool:
        """True when ``target`` (repository-relative) lies under a path given to pytest (its whole run)."""
        arguments = [a.split("::")[0] for a in self.config.args] or ["."]
        path = (self.config.rootpath / target).resolve()
        return any(path == (Path(self.config.invocation_params.dir) / a).resolve()
                   or path.is_relative_to((Path(self.config.invocation_params.dir) / a).resolve()) for a in arguments)

    def reusable(self, targets: list[str]) -> set[str]:
        """The targets whose recorded key is their key now."""
        if self.files is None or self.config.getoption("rerun_all"):
            return set()
        self.keys.update(file_keys(self.files, self.environment, [t for t in targets if t not in self.keys]))
        passed = self.passed_before()
        return {t for t in targets if passed.get(t) == self.keys[t]}

    @pytest.hookimpl(trylast=True)  # after the nbval harness has added its checks to the items
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config, items: list) -> None:
        targets = sorted({r for item in items if (r := self.relative(item.path)) is not None})
        reused = self.reusable(targets)
        if reused:
            config.hook.pytest_deselected(items=[item for item in items if self.relative(item.path) in reused])
            items[:] = [item for item in items if self.relative(item.path) not in reused]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        target = report.nodeid.split("::")[0]
        self.seen.add(target)
        self.seconds[target] = self.seconds.get(target, 0.0) + report.duration
        if report.failed:
            self.failed.add(target)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if hasattr(self.config, "workerinput") or self.files is None:  # an xdist worker: the controller records
            return
        passed = self.passed_before()
        # what this run selected but did not run, because it passed before with the same key (computed here, as
        # an xdist controller collects nothing)
        self.reused = sorted(self.reusable([t for t in passed if t not in self.seen and self.under_arguments(t)]))
        if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED and self.reused:
            session.exitstatus = pytest.ExitCode.OK  # nothing left to run is a pass: every file passed before
            exitstatus = pytest.ExitCode.OK
        if exitstatus in (0, 1) and not self.partial_selection() and not session.shouldstop:
            self.keys.update(file_keys(self.files, self.environment, sorted(self.seen - set(self.keys))))
            kept = {t: k for t, k in passed.items() if self.keys.get(t) == k}  # still current
            kept.update({t: self.keys[t] for t in self.seen - self.failed})
            for target in self.failed:
                kept.pop(target, None)
            self.record.parent.mkdir(parents=True, exist_ok=True)
            self.record.write_text(json.dumps(kept, indent=0, sort_keys=True))

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.files is None:
            terminalreporter.write_line("test cache: off (git cannot list the files here): every test ran")
        elif self.config.getoption("rerun_all"):
            terminalreporter.write_line("test cache: --rerun-all given, every test file ran")
        else:
            terminalreporter.write_line(
                f"test cache: {len(self.reused)} test file(s) not run again: they passed before with the same "
                f"inputs (make test FRESH=1 runs everything); {len(self.seen)} ran")
        if self.seconds and not hasattr(self.config, "workerinput"):
            slowest = sorted(self.seconds.items(), key=lambda item: -item[1])[:SLOWEST_SHOWN]
            terminalreporter.write_line("slowest test files (seconds, their tests summed): "
                                        + ", ".join(f"{name} {seconds:.1f}" for name, seconds in slowest))


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("test cache")
    group.addoption("--test-cache", default=None, help="file that records which test files passed, and their keys")
    group.addoption("--rerun-all", action="store_true", help="run every test file, whatever the record says")


def pytest_configure(config: pytest.Config) -> None:
    record = config.getoption("test_cache")
    if record:
        config.pluginmanager.register(TestCache(config, Path(record)), "d2l-ext-test-cache")
