"""make check-memory (tools/checks/memory.py): the limit it finds, what it reads, and what it reports.

The runs use tiny notebooks without torch (a kernel of about 100 MB) and limits of a few hundred MB; a notebook
over its limit must fail naming its cell, under the operating system's limit where this machine allows one, and
under the fallback that watches the process tree everywhere.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from tools.checks import limits as lim
from tools.checks import memory as cm

pytestmark = pytest.mark.launches  # most tests here start processes (Pythons, kernels, torchrun)

REPO = Path(__file__).resolve().parent.parent
MB = 10**6

V1_MOUNTINFO = """\
30 25 0:26 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory
31 25 0:27 / /sys/fs/cgroup/unified rw,relatime shared:10 - cgroup2 cgroup2 rw
32 25 0:28 / /sys/fs/cgroup/cpu rw,relatime shared:11 - cgroup cgroup rw,cpu
"""
V1_CGROUP = "9:name=systemd:/\n4:memory:/box/42\n1:cpu:/\n0::/\n"
V2_MOUNTINFO = "35 25 0:30 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
V2_CGROUP = "0::/user.slice/user-1000.slice/session-3.scope\n"


def test_finds_the_mounts_and_this_process_cgroups():
    assert lim.cgroup_mounts(V1_MOUNTINFO) == {"memory": Path("/sys/fs/cgroup/memory"),
                                             "unified": Path("/sys/fs/cgroup/unified")}
    assert lim.own_cgroups(V1_CGROUP) == {"memory": "/box/42", "unified": "/"}
    assert lim.cgroup_mounts(V2_MOUNTINFO) == {"unified": Path("/sys/fs/cgroup")}
    assert lim.own_cgroups(V2_CGROUP) == {"unified": "/user.slice/user-1000.slice/session-3.scope"}


def test_picks_a_version_1_cgroup_or_a_delegated_version_2_one(tmp_path):
    v1 = tmp_path / "memory" / "box" / "42"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert lim.cgroup_parent({"memory": tmp_path / "memory"}, {"memory": "/box/42"}) == (v1, 1)
    v2 = tmp_path / "unified" / "me"
    v2.mkdir(parents=True)
    (v2 / "cgroup.subtree_control").write_text("cpu io\n")
    assert lim.cgroup_parent({"unified": tmp_path / "unified"}, {"unified": "/me"}) is None  # not delegated
    (v2 / "cgroup.subtree_control").write_text("cpu io memory pids\n")
    assert lim.cgroup_parent({"unified": tmp_path / "unified"}, {"unified": "/me"}) == (v2, 2)
    assert lim.cgroup_parent({}, {}) is None


def test_counts_anonymous_and_mapped_memory_not_the_file_cache(tmp_path):
    stat = tmp_path / "memory.stat"
    stat.write_text("cache 900\nrss 10\nmapped_file 20\ntotal_cache 5000\ntotal_rss 300\ntotal_mapped_file 200\n"
                    "total_inactive_file 4000\n")
    assert lim.mapped_bytes(stat, 1) == 500  # the hierarchy's totals: a launched process's memory included
    stat.write_text("anon 300\nfile 5000\nfile_mapped 200\nshmem 0\ninactive_file 4000\n")
    assert lim.mapped_bytes(stat, 2) == 500
    assert lim.mapped_bytes(tmp_path / "missing", 2) is None


def test_the_tool_and_the_course_read_a_cgroup_with_one_formula(tmp_path):
    from d2l_ext import room

    stat = tmp_path / "memory.stat"
    stat.write_text("anon 300\nfile 5000\nfile_mapped 200\nshmem 100\ninactive_file 4000\nbogus x\n")
    read = room.read_stat(stat)
    assert read == {"anon": 300, "file": 5000, "file_mapped": 200, "shmem": 100, "inactive_file": 4000}
    # what the notebook's processes hold, and what the system may drop: together, all but shared memory
    assert lim.mapped_bytes(stat, 2) == room.held_bytes(read, 2) == 500
    assert room._reclaimable(read, 2) == 5000 - 200 - 100


def test_the_peak_is_put_on_the_cell_that_brought_it():
    # memory the second cell keeps shows in every later cell: the second cell is the one to read
    peaks = {None: [60, 60], 2: [100, 100], 4: [500, 500], 5: [503, 700], 7: [501, 690]}
    assert cm.peak_cell(peaks, 0) == (4, 503)
    assert cm.peak_cell(peaks, 1) == (5, 700)
    assert cm.peak_cell({None: [0, 0]}, 0) == (None, None)


def test_without_a_limit_the_first_line_says_so(monkeypatch):
    monkeypatch.setattr(lim, "cgroup_parent", lambda mounts, paths: None)
    monkeypatch.setattr(lim, "systemd_scope_works", lambda: False)
    make, how = lim.choose_limit()
    assert make is lim.Limit and how.startswith("NO MEMORY LIMIT can be set on this machine")
    make, how = lim.choose_limit(no_limit=True)
    assert make is lim.Limit and "watched instead" in how


def notebook(path: Path, *sources: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("a tiny notebook")]
    nb.cells += [nbformat.v4.new_code_cell(source) for source in sources]
    for index, cell in enumerate(nb.cells):
        cell.id = f"c{index}"
    nbformat.write(nb, path)
    return path


ALLOCATE = "x{n} = bytearray({mb} * 10**6); x{n}[::4096] = b'1' * len(x{n}[::4096])"
CHILD = ("import subprocess, sys\n"
         "subprocess.run([sys.executable, '-c', 'b = bytearray({mb} * 10**6); b[::4096] = b\"1\" * len(b[::4096]); "
         "import time; time.sleep(0.5)'], check=True)")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("notebooks")
    return {
        "fits": notebook(folder / "fits.ipynb", ALLOCATE.format(n=1, mb=60), CHILD.format(mb=150), "print('done')"),
        "over": notebook(folder / "over.ipynb", "print('small')", ALLOCATE.format(n=2, mb=500), "print('never')"),
    }


def run(path: Path, make_limit, limit: int = 400 * MB, budget: int = 1000 * MB) -> cm.Result:
    return cm.run_notebook(path, make_limit, limit=limit, kernel_budget=budget, timeout=60, drop_cache=False)


def limits() -> list:
    found, how = lim.choose_limit()
    kinds = [pytest.param(lim.Limit, id="watched")]
    if found is not lim.Limit:
        kinds.append(pytest.param(found, id="os-limit"))
    return kinds


@pytest.mark.parametrize("make_limit", limits())
def test_a_notebook_within_its_limit_passes_and_names_its_peak_cells(tiny, make_limit):
    result = run(tiny["fits"], make_limit)
    assert result.ok, result.problems
    assert result.kernel_peak is not None and result.tree_peak is not None
    assert result.kernel_cell == 1 and 60 * MB < result.kernel_peak < 400 * MB  # the kernel keeps its 60 MB
    assert result.tree_cell == 2  # the launched process's 150 MB, beside the kernel's
    assert result.tree_peak > result.kernel_peak + 100 * MB


@pytest.mark.parametrize("make_limit", limits())
def test_a_notebook_over_its_limit_fails_naming_the_cell(tiny, make_limit):
    result = run(tiny["over"], make_limit)
    assert not result.ok
    assert result.problems[0].startswith("cell 2 (c2): ")
    assert ("killed the kernel" in result.problems[0]) if make_limit is not lim.Limit \
        else ("went over the limit" in result.problems[0])


def test_a_kernel_over_its_budget_fails_and_a_missing_notebook_is_named(tiny, tmp_path, capsys):
    result = run(tiny["fits"], lim.Limit, budget=50 * MB)
    assert any(p.startswith("cell 1 (c1): the kernel holds") and "over its budget" in p for p in result.problems)
    report = tmp_path / "report.md"
    code = cm.main([str(tmp_path / "absent.ipynb"), "--no-limit", "--report", str(report)])
    out = capsys.readouterr().out
    assert code == 1
    assert out.splitlines()[0].startswith("no operating-system limit (--no-limit)")
    assert "absent.ipynb" in out and "could not run it: FileNotFoundError" in out
    assert "0 of 1 notebooks pass" in out


def test_the_recorded_peaks_cover_every_notebook_and_the_readme_shows_them():
    data = json.loads(cm.RECORD.read_text())
    names = {p.name for p in (REPO / "notebooks").glob("*.ipynb")}
    names |= {"solutions/" + p.name for p in (REPO / "notebooks" / "solutions").glob("*.ipynb")}
    assert set(data["notebooks"]) == names, "run: python -m tools.checks.memory --record"
    for name, entry in data["notebooks"].items():
        assert entry["passes"], name
        assert entry["kernel_peak_bytes"] <= data["kernel_budget_bytes"], name
        assert entry["kernel_peak_bytes"] <= entry["tree_peak_bytes"] <= data["limit_bytes"], name
    readme = cm.README.read_text(encoding="utf-8")  # docs/chapters.md
    assert cm.README_START + "\n" + cm.readme_table(data) + "\n" + cm.README_END in readme


def test_a_systemd_scope_is_asked_for_the_limit_and_read_from_its_cgroup(monkeypatch, tmp_path):
    scope = lim.SystemdScope(1_847_483_648)
    assert scope.prefix() == ["systemd-run", "--user", "--scope", "--quiet", "-p", "MemoryMax=1847483648",
                              "-p", "MemorySwapMax=0", "--"]
    (tmp_path / "memory.current").write_text("9000\n")
    (tmp_path / "memory.stat").write_text("anon 300\nfile 8000\nfile_mapped 200\n")
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    monkeypatch.setattr(lim, "cgroup_of", lambda pid: tmp_path)
    scope.started(12345)
    assert scope.cgroup == tmp_path and scope.kernel_pid == 12345
    assert scope.usage() == 500 and scope.oom_kills() == 1


def test_each_kernel_starts_with_empty_compile_caches_of_its_own(tmp_path):
    # the kernel writes where torch.compile would cache, and whether that folder exists yet
    body = ("import json, os, pathlib\n"
            "folders = [os.environ[n] for n in ('TORCHINDUCTOR_CACHE_DIR', 'TRITON_CACHE_DIR')]\n"
            "pathlib.Path({out!r}).write_text(json.dumps([(f, os.path.exists(f)) for f in folders]))")
    seen = []
    for index in range(2):
        out = tmp_path / f"caches{index}.txt"
        result = run(notebook(tmp_path / f"c{index}.ipynb", body.format(out=str(out))), lim.Limit)
        assert result.ok, result.problems
        seen.append(json.loads(out.read_text()))
    folders = [folder for run_seen in seen for folder, _ in run_seen]
    assert all(not existed for run_seen in seen for _, existed in run_seen)  # empty: not even made yet
    assert len(set(folders)) == 4  # each kernel its own
    assert not any(Path(folder).parent.exists() for folder in folders)  # removed with the kernel
