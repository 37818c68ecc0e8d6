"""tools/envs/matrix.py: the two combined runs that CI makes set every value that the single variants set."""

from __future__ import annotations

from d2l_ext.ranks import LIKE_NCCL
from tools.envs import matrix
from tools.envs.matrix import COMBINED, EACH, Variant


def via(run):
    """The matrix's streamed(), made of a fake subprocess.run: the runs these tests fake are called the same way."""
    return lambda command, env: run(command, cwd=matrix.REPO, env=env, capture_output=True, text=True)

def values(variants: list[Variant], key: str) -> set[str | None]:
    """The values (None: unset) that the variants without make test's pins give the environment variable."""
    return {variant.environment.get(key) for variant in variants if not variant.pins}


def test_the_combined_runs_cover_every_single_change():
    keys = {key for variant in EACH for key in variant.environment}
    assert keys == {"MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS"}
    for key in keys:
        needed = values(EACH, key)
        if key == "OMP_NUM_THREADS":
            needed.discard(None)  # unset means one thread per core (2 here): between the 1 and the 4 that are run
        assert needed <= values(COMBINED, key), f"{key}: no combined run sets {needed - values(COMBINED, key)}"
    pythons = sorted(v.python for v in EACH if v.python)
    assert {v.python for v in COMBINED} == {pythons[0], pythons[-1]}  # the oldest and the newest supported
    assert all(not v.pins for v in COMBINED)  # the pins would hide the code paths the runs are there to change


def test_combined_is_the_default_and_each_is_nine_runs(monkeypatch, tmp_path):
    chosen, parts = [], []

    def run(variant, folder, remove=False, part=None):
        chosen.append(variant)
        parts.append(part)
        return matrix.Result(variant, passed=2 if part == "solutions" else 1, largest_drift=0.01 * len(parts))

    monkeypatch.setattr(matrix, "run_variant", run)
    assert matrix.main(["--report", str(tmp_path / "r.md")]) == 0
    # the memory run in two parts (its chapters beside the other run, then its solutions), one row for both
    assert sorted(v.name for v in chosen) == sorted([v.name for v in COMBINED] + [COMBINED[0].name])
    assert sorted(p for p in parts if p) == ["chapters", "solutions"]
    rows = [line.split(" | ")[:3] for line in (tmp_path / "r.md").read_text().splitlines()[2:]]
    assert [row[0][2:] for row in rows] == [v.name for v in COMBINED]
    assert rows[0][1:] == ["3", "0"]  # 1 + 2 passed
    assert "| 3.00% |" in (tmp_path / "r.md").read_text().splitlines()[2]  # the larger drift of the two parts
    chosen.clear()
    parts.clear()
    assert matrix.main(["--each", "--report", str(tmp_path / "r.md")]) == 0
    assert chosen == EACH and len(EACH) == 9
    assert "| Python 3.12 (fresh venv) | 1 | 0 |" in (tmp_path / "r.md").read_text()


class Ran:
    """What run_variant gave `make`: its arguments and environment."""

    def __init__(self):
        self.arguments: list[str] = []
        self.commands: list[list[str]] = []

    def __call__(self, command, **kwargs):
        import subprocess
        self.arguments = command
        self.commands.append(command)
        return subprocess.CompletedProcess(command, 0, stdout="3 passed in 1.0s\n", stderr="")


def test_a_python_variant_builds_a_seeded_venv_when_the_disk_has_room(monkeypatch, tmp_path):
    ran = Ran()
    monkeypatch.setattr(matrix.subprocess, "run", ran)
    monkeypatch.setattr(matrix, "streamed", via(ran))
    monkeypatch.setattr(matrix, "find_python", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(matrix, "free_gib", lambda path: matrix.SEEDED_VENV_GIB + 1)
    result = matrix.run_variant(COMBINED[0], tmp_path)
    build = ran.commands[0]
    assert "PYTHON=/usr/bin/python3.10" in build and "SEED_FROM=.venv" in build
    assert ran.arguments[0] == str(matrix.REPO / ".venv-python3.10" / "bin" / "python")  # the notebooks run there
    assert (result.passed, result.failed, result.note) == (3, 0, "")


def test_a_full_disk_runs_the_settings_on_make_tests_python_and_says_so(monkeypatch, tmp_path):
    ran = Ran()
    monkeypatch.setattr(matrix.subprocess, "run", ran)
    monkeypatch.setattr(matrix, "streamed", via(ran))
    monkeypatch.setattr(matrix, "find_python", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(matrix, "free_gib", lambda path: 1.25)
    monkeypatch.setattr(matrix, "REPO", tmp_path)  # no .venv-python3.10 built there
    result = matrix.run_variant(COMBINED[0], tmp_path)
    assert not any(a.startswith(("PYTHON=", "VENV=", "SEED_FROM=")) for c in ran.commands for a in c)
    assert ran.arguments[0] == str(tmp_path / ".venv" / "bin" / "python")  # make test's Python
    assert "TEST_THREADS=" in ran.commands[0]  # the variant's other settings still apply
    assert result.note.startswith("python3.10 NOT RUN: 1.2 GiB free")


def test_the_cpu_build_variant_pretends_in_the_notebooks_run_only(monkeypatch, tmp_path):
    calls = []

    def run(command, **kwargs):
        import subprocess
        calls.append((command, kwargs["env"]))
        return subprocess.CompletedProcess(command, 0, stdout="3 passed in 1.0s\n", stderr="")

    monkeypatch.setattr(matrix.subprocess, "run", run)
    monkeypatch.setattr(matrix, "streamed", via(run))
    monkeypatch.setattr(matrix, "find_python", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(matrix, "free_gib", lambda path: matrix.SEEDED_VENV_GIB + 1)
    variant = next(v for v in COMBINED if "cpu-build" in v.pretend)
    # CI's replacement for a separate `make check-tags --mode cpu-build` and a check-timing pass, load early
    assert variant.pretend == "cpu-build,slow-clock"
    matrix.run_variant(variant, tmp_path)
    (build, build_env), (notebooks, notebooks_env) = calls
    assert build[2] == "dev" and "D2L_EXT_PRETEND" not in build_env  # pip must not import a pretending torch
    assert notebooks[1:3] == ["-m", "pytest"] and notebooks_env["D2L_EXT_PRETEND"] == "cpu-build,slow-clock"
    # Binder's memory measured in this run, one notebook at a time (tools/checks/memory_nbval.py)
    assert "tools.checks.memory_nbval" in notebooks and "no:xdist" in notebooks and variant.memory
    assert notebooks_env["PYTHONHASHSEED"] == "0" and notebooks[-1] == "notebooks"
    assert notebooks_env["D2L_EXT_SLOW_CLOCK_LOAD"] == "early"
    assert notebooks_env["OMP_NUM_THREADS"] == "4" and notebooks_env["OMP_WAIT_POLICY"] == "PASSIVE"  # no spinning
    assert notebooks_env["PYTHONPATH"].split(":")[0].endswith("tools/checks/pretend")
    chapters = sorted(f"notebooks/{path.name}" for path in (matrix.REPO / "notebooks").glob("*.ipynb"))
    assert len(chapters) >= 16 and "notebooks/15_plan.ipynb" in chapters  # each by name: no folder, no --ignore
    for part, wanted in (("chapters", chapters), ("solutions", ["notebooks/solutions"])):
        calls.clear()
        matrix.run_variant(variant, tmp_path, part=part)
        command = calls[-1][0]
        report = command.index("--memory-report")
        assert command[report - len(wanted):report] == wanted  # each part its notebooks, and its own table
        assert command[report + 1].endswith(f"check-memory-{part}.md")


def colab_run(monkeypatch, tmp_path, resolves: bool = True) -> tuple[list, matrix.Result]:
    """Run the Colab variant with every command recorded (none run) and its venv taken as built."""
    calls = []

    def run(command, **kwargs):
        import subprocess
        calls.append((command, kwargs.get("env")))
        printed, code = "", 0
        if "tests/test_widgets.py" in command:
            printed = "........ [100%]\n300 passed in 200.0s\n"
        elif "--dry-run" in command and not resolves:
            code = 1
        error = "" if code == 0 else "ERROR: No matching distribution found for torch==2.14.1\n"
        return subprocess.CompletedProcess(command, code, stdout=printed, stderr=error)

    from tools.envs import colab
    monkeypatch.setattr(matrix.subprocess, "run", run)
    monkeypatch.setattr(matrix, "streamed", via(run))
    monkeypatch.setattr(matrix, "find_python", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(matrix, "free_gib", lambda path: matrix.COLAB_VENV_GIB + 1)
    monkeypatch.setattr(colab, "build", lambda python, venv: venv / "bin" / "python")
    variant = next(v for v in COMBINED if v.colab)  # CI's replacement for test-colab and a check-timing pass
    return calls, matrix.run_variant(variant, tmp_path)


def test_the_second_combined_run_is_a_late_load_pass_on_colabs_packages(monkeypatch, tmp_path):
    calls, result = colab_run(monkeypatch, tmp_path)
    (tests, tests_env), (resolve, _) = calls
    colab_python = str(matrix.REPO / ".venv-colab" / "bin" / "python")
    assert tests[:3] == [colab_python, "-m", "pytest"]  # not make: its env target would install our pins there
    assert "--nbval" in tests and tests[-2:] == ["notebooks", "tests/test_widgets.py"]  # the sliders: ipywidgets 7
    assert tests_env["MKL_CBWR"] == "COMPATIBLE" and tests_env["OMP_NUM_THREADS"] == "1"
    assert tests_env["D2L_EXT_PRETEND"] == "slow-clock" and tests_env["D2L_EXT_SLOW_CLOCK_LOAD"] == "late"
    assert resolve[resolve.index("--python-version") + 1] == matrix.COLAB_PYTHON == "3.13"
    assert "--dry-run" in resolve and "--only-binary=:all:" in resolve  # our pins: resolved, not installed
    assert (result.passed, result.failed) == (300, 0)
    assert "requirements.txt resolves to wheels for Python 3.13" in result.note


def test_the_two_combined_runs_stretch_the_clocks_on_both_sides_of_each_cells_turn():
    loads = {v.environment.get("D2L_EXT_SLOW_CLOCK_LOAD") for v in COMBINED if "slow-clock" in v.pretend}
    assert loads == {"early", "late"}  # a stopwatch fact flips in one of them, as under make check-timing


def test_one_combined_run_makes_gloo_fail_as_nccl_does_so_chapter_11_is_checked_that_way(monkeypatch, tmp_path):
    """Chapter 11 under D2L_EXT_LIKE_NCCL=1 (tests/test_like_nccl.py tests the mode itself) runs in the matrix's
    second run, not as a second pass of chapter 11 in make test: its notebooks' kernels get the mode."""
    assert matrix.LIKE_NCCL == LIKE_NCCL
    assert [v.environment.get(LIKE_NCCL) for v in COMBINED] == [None, "1"]
    (tests, tests_env), _ = colab_run(monkeypatch, tmp_path)[0]
    assert "notebooks" in tests and tests_env[LIKE_NCCL] == "1"


def test_pins_that_do_not_resolve_on_colabs_python_fail_the_run(monkeypatch, tmp_path):
    _, result = colab_run(monkeypatch, tmp_path, resolves=False)
    assert result.failed == 1
    assert "pip could NOT resolve requirements.txt for Python 3.13: ERROR: No matching distribution" in result.note


def test_without_disk_for_colabs_environment_its_pass_runs_on_make_tests_python(monkeypatch, tmp_path):
    calls = []

    def run(command, **kwargs):
        import subprocess
        calls.append(command)
        printed = "18 passed in 100.0s\n"
        return subprocess.CompletedProcess(command, 0, stdout=printed if "make" in command else "", stderr="")

    monkeypatch.setattr(matrix.subprocess, "run", run)
    monkeypatch.setattr(matrix, "streamed", via(run))
    monkeypatch.setattr(matrix, "find_python", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(matrix, "free_gib", lambda path: 2.0)
    monkeypatch.setattr(matrix, "REPO", tmp_path)  # no .venv-colab built there
    result = matrix.run_variant(next(v for v in COMBINED if v.colab), tmp_path)
    build, notebooks, resolve = calls  # .venv's make dev first, without the pretence
    assert build[:3] == ["make", "--no-print-directory", "dev"]
    assert notebooks[:3] == ["make", "--no-print-directory", "notebooks"]
    assert not any(a.startswith(("PYTHON=", "VENV=")) for a in notebooks)  # .venv's Python, the settings kept
    assert "--dry-run" in resolve  # our pins on Colab's Python are still resolved
    assert result.note.startswith(".venv-colab NOT RUN: 2.0 GiB free") and result.passed == 18


def test_a_run_s_progress_lines_are_echoed_as_they_come_and_all_its_output_kept(capsys):
    import os
    import sys

    code = "import sys; print('..F.. [ 12%]'); print('other'); print('err', file=sys.stderr)"
    done = matrix.streamed([sys.executable, "-c", code], dict(os.environ))
    assert (done.returncode, done.stdout, done.stderr) == (0, "..F.. [ 12%]\nother\n", "err\n")
    assert capsys.readouterr().out == "  ..F.. [ 12%]\n"  # CI's log shows how far a run got


# pytest's report of a failed notebook cell, as nbval words it (shortened)
FAILED_RUN = """........F.. [ 50%]
=================================== FAILURES ===================================
_____________________ notebooks/07_profiling.ipynb::Cell 8 _____________________
Notebook cell execution failed
Cell 8: Cell outputs differ

Input:
with profile(activities=activities, with_stack=True,

Expected:

Got:
    a warning
=========================== short test summary info ============================
FAILED notebooks/07_profiling.ipynb::Cell 8
1 failed, 10 passed in 3.0s
"""


def test_a_failed_runs_log_shows_the_cells_stored_and_fresh_lines():
    shown = matrix.failure_excerpt("setting up\n" * 50 + FAILED_RUN)
    assert shown[0].startswith("=====") and "FAILURES" in shown[0]
    assert "    a warning" in shown and shown[-1] == "1 failed, 10 passed in 3.0s"  # what CI's log lacked at stop 53
    assert matrix.failure_excerpt("a\nb\n") == ["a", "b"]  # no report: the last lines
    long = matrix.failure_excerpt("=== FAILURES ===\n" + "x\n" * 500, most=40)
    assert len(long) == 40 and "lines left out" in long[30]


def test_the_memory_runs_two_parts_collect_every_notebook_once():
    """CI of this stop: the chapters given as the notebooks folder with --ignore=notebooks/solutions failed the
    suite's own check (tests/nbval_harness.py: a notebook under a folder given to pytest but not collected)."""
    import subprocess
    import sys

    found = {}
    for part in matrix.MEMORY_PARTS:
        done = subprocess.run([sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env", "-p",
                               "no:cacheprovider", "-p", "no:xdist", "--collect-only", "-q", *matrix.memory_part(part)],
                              cwd=matrix.REPO, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "not-collected" not in done.stdout, done.stdout[-1500:]
        found[part] = {line.split("::")[0] for line in done.stdout.splitlines() if ".ipynb::" in line}
    every = {str(p.relative_to(matrix.REPO)) for p in (matrix.REPO / "notebooks").rglob("*.ipynb")
             if ".ipynb_checkpoints" not in p.parts}
    assert found["chapters"] | found["solutions"] == every and not found["chapters"] & found["solutions"]
