"""tools/result_cache.py: a test file runs again when anything it may read changes, and only then."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools import result_cache

READS_NOTEBOOKS = False  # this module reads only the files it writes in temporary folders

REPO = Path(__file__).resolve().parent.parent


def keys(files: dict[str, str], environment: str = "env") -> dict[str, str]:
    targets = ["notebooks/a.ipynb", "notebooks/b.ipynb", "tests/test_x.py"]
    return result_cache.file_keys(files, environment, targets)


FILES = {"notebooks/a.ipynb": "1", "notebooks/b.ipynb": "2", "editions/vi/a.ipynb": "3", "README.md": "4",
         "d2l_ext/devices.py": "5", "tests/sanitize.cfg": "6", "tests/test_x.py": "7", ".ci/run": "8",
         ".github/workflows/book.yml": "9"}


@pytest.mark.parametrize("edited", ["notebooks/b.ipynb", "editions/vi/a.ipynb", "README.md", ".ci/run",
                                    ".github/workflows/book.yml"])
def test_a_notebook_does_not_rerun_for_another_notebook_an_edition_markdown_or_ci(edited):
    assert keys({**FILES, edited: "changed"})["notebooks/a.ipynb"] == keys(FILES)["notebooks/a.ipynb"]
    assert keys({**FILES, edited: "changed"})["tests/test_x.py"] != keys(FILES)["tests/test_x.py"]  # a module does


@pytest.mark.parametrize("edited", ["notebooks/a.ipynb", "d2l_ext/devices.py", "tests/sanitize.cfg"])
def test_a_notebook_reruns_for_itself_and_for_any_code_or_setting(edited):
    assert keys({**FILES, edited: "changed"})["notebooks/a.ipynb"] != keys(FILES)["notebooks/a.ipynb"]


def test_new_or_deleted_files_and_the_environment_change_every_key():
    before = keys(FILES)
    for changed in (keys({**FILES, "d2l_ext/new.py": "8"}), keys({k: v for k, v in FILES.items()
                                                                  if k != "d2l_ext/devices.py"}),
                    keys(FILES, environment="another")):
        assert all(changed[target] != before[target] for target in before)


def test_a_test_module_reruns_for_a_notebook_unless_it_says_it_reads_none(tmp_path, monkeypatch):
    monkeypatch.setattr(result_cache, "REPO", tmp_path)
    (tmp_path / "tests").mkdir()
    module = tmp_path / "tests" / "test_x.py"
    module.write_text("def test_one():\n    pass\n")
    edited = {**FILES, "notebooks/b.ipynb": "changed"}
    assert keys(edited)["tests/test_x.py"] != keys(FILES)["tests/test_x.py"]
    module.write_text("READS_NOTEBOOKS = False\n\ndef test_one():\n    pass\n")
    assert keys(edited)["tests/test_x.py"] == keys(FILES)["tests/test_x.py"]
    assert keys({**FILES, "d2l_ext/devices.py": "x"})["tests/test_x.py"] != keys(FILES)["tests/test_x.py"]


def test_the_environment_key_follows_variables_packages_and_options_not_the_worker_count(monkeypatch):
    base = result_cache.environment_key(["tests", "-n", "3"])
    assert result_cache.environment_key(["tests", "-n", "2"]) == base
    assert result_cache.environment_key(["tests", "--nbval-lax"]) != base
    with monkeypatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "7")
        assert result_cache.environment_key(["tests", "-n", "3"]) != base
    monkeypatch.setenv("UNRELATED_VARIABLE", "x")
    assert result_cache.environment_key(["tests", "-n", "3"]) == base


PASSING = "def test_ok():\n    assert True\n"


def run(project: Path, *arguments: str) -> subprocess.CompletedProcess:
    """Run pytest with the plugin in ``project`` (a git repository); return what it printed."""
    command = [sys.executable, "-m", "pytest", "-p", "tools.result_cache", "--test-cache",
               str(project / "record.json"), "-p", "no:cacheprovider", "-q", *arguments, "tests"]
    # only the plugins needed: loading every installed one (nbval, ...) takes seconds a run
    environment = {**os.environ, "PYTHONPATH": str(REPO), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    environment.pop("TEST_CACHE_ENVIRONMENT_KEY", None)
    return subprocess.run(command, cwd=project, env=environment, capture_output=True, text=True, timeout=120)


@pytest.fixture()
def project(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text(PASSING)
    (tmp_path / "tests" / "test_b.py").write_text(PASSING)
    (tmp_path / ".gitignore").write_text("record.json\n")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    return tmp_path


@pytest.mark.launches
@pytest.mark.parametrize("workers", [[], ["-p", "xdist.plugin", "-n", "2"]], ids=["one process", "xdist"])
def test_passes_are_reused_until_an_input_changes_and_a_failure_is_never_reused(project, workers):
    first = run(project, *workers)
    assert first.returncode == 0 and "2 passed" in first.stdout, first.stdout
    assert "0 test file(s) not run again" in first.stdout
    again = run(project, *workers)  # nothing changed: nothing runs, and that is a pass
    assert again.returncode == 0, again.stdout
    assert "2 test file(s) not run again" in again.stdout and "0 ran" in again.stdout
    (project / "tests" / "test_b.py").write_text("def test_ok():\n    assert False\n")  # uncommitted edits count
    failed = run(project, *workers)  # both rerun: test_b changed, and test_a may read it (it does not say otherwise)
    assert failed.returncode == 1 and "1 failed, 1 passed" in failed.stdout, failed.stdout
    still = run(project, *workers)  # the failure was not recorded: it runs again
    assert still.returncode == 1 and "1 failed" in still.stdout and "1 test file(s) not run again" in still.stdout
    (project / "tests" / "test_b.py").write_text(PASSING)
    fixed = run(project, *workers, "--rerun-all")
    assert fixed.returncode == 0 and "2 passed" in fixed.stdout and "--rerun-all given" in fixed.stdout


@pytest.mark.launches
def test_the_summary_names_the_slowest_files_with_their_tests_summed(project):
    """A file's tests are summed: two tests that each sleep 0.2 s make the file take at least 0.4 s."""
    (project / "tests" / "test_slow.py").write_text(
        "import time\n\ndef test_one():\n    time.sleep(0.2)\n\ndef test_two():\n    time.sleep(0.2)\n")
    result = run(project, "-p", "xdist.plugin", "-n", "2")
    line = next(x for x in result.stdout.splitlines() if x.startswith("slowest test files"))
    named = dict(item.rsplit(" ", 1) for item in line.split(": ", 1)[1].split(", "))
    assert list(named)[0] == "tests/test_slow.py" and float(named["tests/test_slow.py"]) >= 0.4, line
    assert set(named) == {"tests/test_a.py", "tests/test_b.py", "tests/test_slow.py"}


@pytest.mark.launches
def test_a_partial_run_records_nothing(project):
    partial = run(project, "-k", "test_a")
    assert partial.returncode in (0, 5)
    assert not (project / "record.json").exists() or (project / "record.json").read_text().strip() in ("{}", "")
    full = run(project)
    assert "2 passed" in full.stdout, full.stdout


def test_a_module_that_says_it_reads_no_notebook_names_none():
    """A wrong READS_NOTEBOOKS = False would let an edited notebook leave a stale pass: such a module must not name
    a notebook, an edition, a markdown file or the folders that hold them."""
    said = [p for p in sorted((REPO / "tests").glob("test_*.py")) if result_cache.OPTED_OUT.search(p.read_text())]
    assert len(said) >= 10
    for path in said:
        text = result_cache.OPTED_OUT.sub("", path.read_text())
        if path.name == "test_result_cache.py":  # its own fake paths name them on purpose, for temporary folders
            continue
        for name in ("notebooks", ".ipynb", "editions", ".md", "README", "glossary", "nbformat"):
            assert name not in text, f"{path.name} says READS_NOTEBOOKS = False but names {name!r}"
