"""Check that Binder (repo2docker) builds the same pinned environment as `make`.

How to run (from anywhere; needs PyPI the first time, no Docker engine):

    .venv/bin/python -m tools.envs.binder              # all checks
    .venv/bin/python -m tools.envs.binder --no-resolve # skip the pip dry-run (offline)

What it does: creates `.venv-binder/` once (reused afterwards) with a pinned jupyter-repo2docker, runs
`repo2docker --no-build --debug --user-id 1000 --user-name jovyan <repo>` (the uid/name Binder uses), and
reads the Dockerfile it prints plus its log. One line per check, exit status 1 if any fails:

- python: the Python of the build (log line "Building conda environment for python=X.Y" and the base
  environment lock it copies) is the one in binder/runtime.txt, and make accepts it;
- buildpack: the Python buildpack from binder/ is used (no environment.yml, no `pip install .` of
  pyproject.toml, which repo2docker does only without a binder/ folder);
- requirements: binder/requirements.txt is installed with the kernel's pip, after the whole repository is
  copied (its `-r ../requirements.txt` needs ../requirements.txt in the build; pip resolves a nested -r
  relative to the file that names it, which this script repeats), and it brings every pin of
  requirements.txt and nothing that overrides one;
- postBuild: run from the repository root, after requirements, is executable in git, stops on errors, and
  runs the course's one install recipe without its requirements step (`tools/envs/install.sh python
  --no-requirements`: d2l --no-deps, then d2l_ext);
- recipe: the Binder build's installs (binder/requirements.txt, then postBuild's) are the recipe's steps that
  `make env` runs (`tools/envs/install.sh --print` says which), in the same order;
- base env (with network): repo2docker's base environment (its conda lock) keeps packages that the pins
  do not name (notebook, jupyterhub, ...); a `pip install --dry-run` of the pins together with those
  packages at their locked versions must resolve, or Binder would end with broken dependencies.

Why this module: jupyter-repo2docker generates Binder's build; no library compares it with ours.
"""

from __future__ import annotations

import argparse
import itertools
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

from tools import REPO

VENV = REPO / ".venv-binder"
R2D_VERSION = "2026.4.0"
# repo2docker's base packages (conda names) that the kernel environment keeps, with their pip names
BASE_TOP_LEVEL = {
    "ipywidgets": "ipywidgets",
    "jupyter-offlinenotebook": "jupyter-offlinenotebook",
    "jupyter-resource-usage": "jupyter-resource-usage",
    "jupyterhub-base": "jupyterhub",
    "notebook": "notebook",
}

results: list[bool] = []


def report(ok: bool, name: str, detail: str) -> None:
    results.append(ok)
    print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)


def info(name: str, detail: str) -> None:
    print(f"INFO  {name}: {detail}", flush=True)


def ensure_repo2docker() -> Path:
    """Create .venv-binder with the pinned repo2docker unless it is already there."""
    r2d = VENV / "bin" / "repo2docker"
    if r2d.exists():
        out = subprocess.run([str(r2d), "--version"], capture_output=True, text=True)
        if out.stdout.strip() == R2D_VERSION:
            return r2d
    print(f"creating {VENV.name}/ with jupyter-repo2docker=={R2D_VERSION} ...", flush=True)
    base_python = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base_python, "-m", "venv", str(VENV)], check=True)
    pip = [str(VENV / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, f"jupyter-repo2docker=={R2D_VERSION}"], check=True)
    return r2d


def dockerfile_steps(text: str) -> list[tuple[str, str, str, str]]:
    """(instruction, arguments, USER, WORKDIR) for each Dockerfile instruction, continuations joined."""
    steps, user, workdir, pending = [], "root", "/", ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        instruction, _, args = line.partition(" ")
        instruction = instruction.upper()
        if instruction not in {"FROM", "RUN", "COPY", "ENV", "ARG", "USER", "WORKDIR", "LABEL", "EXPOSE",
                               "ENTRYPOINT", "CMD"}:
            continue  # not an instruction (repo2docker's log lines)
        if instruction == "USER":
            user = args.strip()
        elif instruction == "WORKDIR":
            workdir = args.strip()
        steps.append((instruction, args.strip(), user, workdir))
    return steps


def requirement_lines(path: Path, seen: tuple[Path, ...] = ()) -> list[tuple[Path, str]]:
    """Lines of a requirements file, nested -r followed the way pip does (relative to the naming file)."""
    if path in seen:
        raise FileNotFoundError(f"{path.relative_to(REPO)} includes itself through -r")
    lines = []
    for raw in path.read_text().splitlines():
        line = raw.split(" #")[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(("-r ", "--requirement ")):
            nested = (path.parent / line.split(None, 1)[1]).resolve()
            if not nested.is_file():
                raise FileNotFoundError(f"{path.relative_to(REPO)}: {line} -> {nested} does not exist")
            lines.extend(requirement_lines(nested, (*seen, path)))
        else:
            lines.append((path, line))
    return lines


def pin_name(line: str) -> str:
    return re.split(r"[=<>!~\[; ]", line, maxsplit=1)[0].lower().replace("_", "-")


def pip_install_step(command: str) -> tuple[str, str, bool] | None:
    """('-r', file, no_deps) or ('-e', path, no_deps) for a pip install command line, else None."""
    words = shlex.split(command, comments=True)  # a comment may hold an apostrophe ("JupyterLab's")
    if "pip" not in " ".join(words) or "install" not in words:
        return None
    words = words[words.index("install") + 1:]
    no_deps = "--no-deps" in words
    for flag in ("-r", "-e"):
        if flag in words:
            return flag, words[words.index(flag) + 1], no_deps
    return None


def recipe_steps(*options: str) -> list[tuple[str, str, bool]]:
    """The pip installs of the course's one install recipe (tools/envs/install.sh), as it prints them."""
    done = subprocess.run(["bash", str(REPO / "tools" / "envs" / "install.sh"), "python", *options, "--print"],
                          capture_output=True, text=True, check=True)
    return [step for step in map(pip_install_step, done.stdout.splitlines()) if step]


def check_python(log: str, steps: list[tuple[str, str, str, str]]) -> str | None:
    """Check the build's Python against binder/runtime.txt; return the version repo2docker builds."""
    runtime = (REPO / "binder" / "runtime.txt").read_text().strip()
    match = re.fullmatch(r"python-(\d+\.\d+)(?:-\d{4}-\d{2}-\d{2})?", runtime)
    built = re.search(r"Building conda environment for python=(\S+)", log)
    if not match:
        report(False, "python", f"binder/runtime.txt is {runtime!r}, not python-X.Y")
        return built.group(1) if built else None
    wanted = match.group(1)
    # the lock's build-context name is escaped: environment.py-3.11-linux-64.lock -> ...-2epy-2d3-2e11-2dlinux...
    lock_name = r"environment-2epy-2d(\d+)-2e(\d+)-2dlinux-2d64-2elock"
    locks = {f"{a}.{b}" for _, args, _, _ in steps for a, b in re.findall(lock_name, args)}
    default_warning = "Python version unspecified" in log
    ok = bool(built) and built.group(1) == wanted and locks == {wanted} and not default_warning
    report(ok, "python", f"runtime.txt says {wanted}; repo2docker builds python="
           f"{built.group(1) if built else '?'} from base lock(s) {sorted(locks)}"
           + ("; it warns that it uses its default" if default_warning else ""))
    # the Pythons the course supports: pyproject.toml's requires-python (make checks the same range)
    found = re.search(r'^requires-python = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)
    supported = found[1] if found else "?"
    bounds = re.fullmatch(r">=(\d+)\.(\d+),<(\d+)\.(\d+)", supported.replace(" ", ""))
    if bounds:
        lo, below = (int(bounds[1]), int(bounds[2])), (int(bounds[3]), int(bounds[4]))
        version = tuple(int(p) for p in wanted.split("."))
        report(lo <= version < below, "python range", f"{wanted} within requires-python {supported}")
    return built.group(1) if built else None


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--no-resolve", action="store_true", help="skip the pip dry-run (needs PyPI)")
    opts = parser.parse_args()

    r2d = ensure_repo2docker()
    command = [str(r2d), "--no-build", "--debug", "--user-id", "1000", "--user-name", "jovyan", str(REPO)]
    run = subprocess.run(command, capture_output=True, text=True, cwd=tempfile.gettempdir())
    print(f"repo2docker {R2D_VERSION}: {' '.join(command[1:])} -> exit {run.returncode}", flush=True)
    if run.returncode != 0:
        report(False, "repo2docker", run.stderr[-2000:])
        return 1
    log = run.stdout + run.stderr
    steps = dockerfile_steps(run.stdout)
    runs = [(i, args, user, wd) for i, (kind, args, user, wd) in enumerate(steps) if kind == "RUN"]

    python = check_python(log, steps)

    # the Python buildpack from binder/: no environment.yml, no `pip install .` of pyproject.toml
    extra = [args for _, args, _, _ in runs if "environment.yml" in args or re.search(r"pip install .*\s\.$", args)]
    report(not extra, "buildpack", "binder/ (Python buildpack) is used; root environment.yml and "
           "pyproject.toml are not installed" if not extra else f"unexpected steps: {extra}")

    # binder/requirements.txt: installed with the kernel's pip after the whole repository is copied
    copy_all = next((i for i, (kind, args, _, _) in enumerate(steps)
                     if kind == "COPY" and re.search(r"\ssrc/ \$\{REPO_DIR\}/$", args)), None)
    req_runs = [(i, args, user) for i, args, user, _ in runs if 'install --no-cache-dir -r "binder/requirements.txt"'
                in args]
    kernel_pip = bool(req_runs) and req_runs[0][1].startswith("${KERNEL_PYTHON_PREFIX}/bin/pip ")
    ok = len(req_runs) == 1 and kernel_pip and copy_all is not None and req_runs[0][0] > copy_all
    report(ok, "requirements step", "`${KERNEL_PYTHON_PREFIX}/bin/pip install -r binder/requirements.txt` runs "
           "after `COPY src/ ${REPO_DIR}/`, so ../requirements.txt is in the build" if ok
           else f"requirements step not found after the repository copy: {req_runs}, copy at {copy_all}")
    try:
        binder_lines = requirement_lines(REPO / "binder" / "requirements.txt")
    except FileNotFoundError as err:
        report(False, "requirements -r", str(err))
        binder_lines = []
    pins = {pin_name(line): line for _, line in requirement_lines(REPO / "requirements.txt")}
    from_main = {pin_name(line): line for path, line in binder_lines if path == REPO / "requirements.txt"}
    extras = {pin_name(line): line for path, line in binder_lines if path != REPO / "requirements.txt"}
    report(from_main == pins, "requirements pins", f"binder/requirements.txt -> -r ../requirements.txt "
           f"(resolved relative to binder/) brings all {len(pins)} pins of requirements.txt")
    clash = sorted(set(extras) & set(pins))
    loose = sorted(line for line in extras.values() if "==" not in line)
    report(not clash and not loose, "requirements extras",
           f"binder-only pins {sorted(extras.values()) or 'none'}: none overrides a requirements.txt pin, all exact"
           if not clash and not loose else f"overriding {clash}, not exact {loose}")

    # postBuild
    post = REPO / "binder" / "postBuild"
    post_runs = [(i, wd) for i, args, _, wd in runs if args == "./binder/postBuild"]
    ok = (len(post_runs) == 1 and post_runs[0][1] == "${REPO_DIR}" and bool(req_runs)
          and post_runs[0][0] > req_runs[0][0])
    report(ok, "postBuild step", "`RUN ./binder/postBuild` with WORKDIR ${REPO_DIR} (the repository root), "
           "after the requirements" if ok else f"postBuild runs: {post_runs}")
    mode = subprocess.run(["git", "ls-files", "-s", "binder/postBuild"], cwd=REPO, capture_output=True,
                          text=True).stdout.split()
    text = post.read_text()
    ok = bool(mode) and mode[0] == "100755" and text.startswith("#!") and re.search(r"^set -e", text, re.M)
    report(bool(ok), "postBuild file", f"git mode {mode[0] if mode else 'untracked'}, shebang "
           f"{text.splitlines()[0]!r}, `set -e` present" if text else "empty")
    # each line's command, without the variables set for it (D2L_EXT_INSTALLER=pip)
    calls = [list(itertools.dropwhile(lambda word: re.match(r"^[A-Z_][A-Z0-9_]*=", word) is not None,
                                      shlex.split(line, comments=True))) for line in text.splitlines()]
    recipe_call = ["bash", "tools/envs/install.sh", "python", "--no-requirements"]
    stray = [s for s in map(pip_install_step, text.splitlines()) if s and not s[1].startswith("#")]
    report(recipe_call in calls and not stray, "postBuild installs",
           f"runs {' '.join(recipe_call)}" + (f"; and its own pip installs {stray}" if stray else ""))
    post_steps = recipe_steps("--no-requirements") if recipe_call in calls else stray

    # the recipe that make env runs, against the Binder build
    make_steps = recipe_steps()
    binder_steps = [("-r", "requirements.txt", False)] + post_steps if req_runs else post_steps
    report(make_steps == binder_steps, "recipe",
           f"make env {make_steps} == binder {binder_steps} (binder/requirements.txt counted as requirements.txt)")
    info("kernel", "make installs a kernelspec 'python3' ('Python 3 (d2l_ext)'); Binder's is ipykernel's "
         "default 'python3' of the same environment (KERNEL_PYTHON_PREFIX=NB_PYTHON_PREFIX)")

    if not opts.no_resolve and python:
        check_base_env(python, pins, extras)
    else:
        info("base env", "skipped (--no-resolve)")
    failed = results.count(False)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


def check_base_env(version: str, pins: dict[str, str], extras: dict[str, str]) -> None:
    """Resolve our pins with repo2docker's base packages that pip leaves alone (pip would only warn)."""
    lock_dir = next((VENV / "lib").glob("python*/site-packages/repo2docker/buildpacks/conda"))
    lock = (lock_dir / f"environment.py-{version}-linux-64.lock").read_text()
    base = {}
    for conda_name, pip_name in BASE_TOP_LEVEL.items():
        found = re.search(rf"/{re.escape(conda_name)}-(\d[^-]*)-[^/-]+\.(?:conda|tar\.bz2)", lock)
        if found:
            base[pip_name] = found.group(1)
    replaced = []
    for name in pins:
        found = re.search(rf"/{re.escape(name).replace('-', '[-_]')}-(\d[^-]*)-[^/-]+\.(?:conda|tar\.bz2)", lock)
        if found:
            replaced.append(f"{name} {found.group(1)}->{pins[name].split('==')[-1]}")
    info("base env", f"pins that replace repo2docker's base packages: {', '.join(replaced)}")
    kept = [extras.get(name, f"{name}=={v}") for name, v in sorted(base.items()) if name not in pins]
    with tempfile.TemporaryDirectory() as tmp:
        reqs = Path(tmp) / "requirements.txt"
        reqs.write_text("\n".join([*pins.values(), *kept]) + "\n")
        command = [str(VENV / "bin" / "python"), "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
                   "--python-version", version, "--only-binary=:all:", "--report", str(Path(tmp) / "r.json"),
                   "-r", str(reqs)]
        run = subprocess.run(command, capture_output=True, text=True)
    errors = [line for line in run.stderr.splitlines() if line.startswith("ERROR")]
    report(run.returncode == 0, "base env", f"pip --dry-run resolves the pins with the base packages kept: "
           f"{', '.join(kept)}" if run.returncode == 0 else " ".join(errors)[:600] or run.stderr[-600:])


if __name__ == "__main__":
    sys.exit(main())
