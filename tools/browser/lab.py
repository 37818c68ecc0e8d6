"""Open a chapter notebook in JupyterLab in a real (headless Chromium) browser and check that it renders.

How to run (needs Chromium: make browser-deps; no extra Python package):

    .venv/bin/python -m tools.browser.lab                       # 01_devices.ipynb -> build/browser-check.png
    .venv/bin/python -m tools.browser.lab --notebook 03_copying.ipynb --expect "GB/s" --output /tmp/lab.png

What it does and checks:

1. starts JupyterLab through the real `make -s lab` target on 127.0.0.1, a free port and a random token (own
   process group, temporary JUPYTER_CONFIG_DIR/JUPYTER_RUNTIME_DIR), and waits until GET /api/contents/
   answers with that token;
2. loads http://127.0.0.1:PORT/lab/tree/NOTEBOOK?token=TOKEN in headless Chromium with `--dump-dom` and a
   virtual time budget, retrying with a larger budget until the DOM holds the notebook panel, JupyterLab's
   output areas (`jp-OutputArea-output`) and a text known to be in the notebook's stored outputs
   (default: the first of "device(type='cpu')" for 01_devices.ipynb);
3. checks that JupyterLab's news toast is absent and that closing a notebook shuts its kernel down (the
   settings in binder/overrides.json);
4. takes a screenshot (`--screenshot`, same budget, fresh browser profile) and checks with Pillow that it
   is not blank: at least --min-ink of its pixels are not white (JupyterLab's loading splash is ~1 %);
5. stops JupyterLab (SIGTERM to its process group, then SIGKILL), ends any process it left (kernels run
   in their own session), and checks that nothing is left and the port is free.

Exit status 0 when all checks pass, 1 with a message otherwise.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
from PIL import Image

from tools import REPO
from tools.browser.chromium import FLAGS, INSTALL_HINT, find_chromium, free_port

CHROMIUM_FLAGS = ["--headless", *FLAGS]
EXPECTED_TEXT = {"01_devices.ipynb": "device(type='cpu')"}


class CheckFailed(Exception):
    pass


def wait_for_api(lab: subprocess.Popen, port: int, token: str, timeout: float) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and lab.poll() is None:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/api/contents/",
                                         headers={"Authorization": f"token {token}"})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return [item["name"] for item in json.load(response)["content"]]
        except OSError:
            time.sleep(0.5)
    status = f"make exited with {lab.returncode}" if lab.poll() is not None else "still running"
    raise CheckFailed(f"JupyterLab did not answer on port {port} within {timeout:.0f} s ({status})")


def chromium(browser: str, url: str, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium once with a fresh profile."""
    with tempfile.TemporaryDirectory(prefix="browser-check-profile-") as profile:
        command = [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, url]
        try:
            return subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as err:
            raise CheckFailed(f"chromium did not finish within {timeout:.0f} s") from err


NEWS_TOAST = "Would you like to get notified about official Jupyter news?"  # JupyterLab 4's first-run toast


def settings(port: int, token: str, plugin: str) -> dict:
    """Return the settings JupyterLab applies for ``plugin``: the schema's defaults (which overrides.json
    replaces), then the user's own settings."""
    url = f"http://127.0.0.1:{port}/lab/api/settings/{plugin}?token={token}"
    with urllib.request.urlopen(url, timeout=30) as answer:
        answer_json = json.load(answer)
    defaults = {name: spec.get("default") for name, spec in answer_json["schema"].get("properties", {}).items()}
    return {**defaults, **answer_json.get("settings", {})}


def rendered(dom: str, expected: str) -> list[str]:
    """What is missing from the dumped DOM for a rendered notebook with outputs."""
    markers = {"notebook panel (jp-NotebookPanel)": ["jp-NotebookPanel"],
               "code cells (jp-CodeCell)": ["jp-CodeCell"],
               "output areas (jp-OutputArea-output)": ["jp-OutputArea-output"],
               f"stored output text {expected!r}": [expected, html.escape(expected)]}
    return [name for name, texts in markers.items() if not any(text in dom for text in texts)]


def ink(path: Path) -> tuple[float, tuple[int, int]]:
    """Fraction of pixels that are not (near) white, and the image size."""
    with Image.open(path) as image:
        gray = image.convert("L")
        histogram = gray.histogram()
        return sum(histogram[:240]) / (gray.width * gray.height), gray.size


def stop(lab: subprocess.Popen, port: int) -> list[str]:
    """Stop make's process group and anything it started; return what could not be stopped."""
    try:
        family = [lab.pid, *(p.pid for p in psutil.Process(lab.pid).children(recursive=True))]
    except psutil.NoSuchProcess:
        family = [lab.pid]
    if lab.poll() is None:
        os.killpg(lab.pid, signal.SIGTERM)  # jupyter shuts its kernels down on SIGTERM
    try:
        lab.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(lab.pid, signal.SIGKILL)
        lab.wait()
    left = []
    for pid in family[1:]:  # kernels live in their own session: end them if the server did not
        try:
            process = psutil.Process(pid)
        except psutil.NoSuchProcess:
            continue
        try:
            process.terminate()
            process.wait(timeout=10)
        except psutil.NoSuchProcess:
            continue
        except psutil.TimeoutExpired:
            process.kill()
        if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            left.append(f"pid {pid}")
    with socket.socket() as s:  # nothing listens any more (TIME_WAIT leftovers allowed)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            left.append(f"port {port} still in use")
    return left


def check(opts: argparse.Namespace, workdir: Path) -> None:
    browser = find_chromium()
    if browser is None:
        raise CheckFailed(f"no chromium found; install it with: {INSTALL_HINT}")
    expected = opts.expect or EXPECTED_TEXT.get(opts.notebook)
    if not expected:
        raise CheckFailed(f"no known output text for {opts.notebook}; pass --expect TEXT")
    if expected not in (REPO / "notebooks" / opts.notebook).read_text():
        raise CheckFailed(f"{expected!r} is not in the stored outputs of notebooks/{opts.notebook}")
    port, token = free_port(), secrets.token_hex(16)
    lab_args = (f"--no-browser --ServerApp.ip=127.0.0.1 --ServerApp.port={port} "
                f"--ServerApp.port_retries=0 --IdentityProvider.token={token}")
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(workdir), "JUPYTER_CONFIG_DIR": str(workdir)}
    log_path = workdir / "lab.log"
    started = time.monotonic()
    with open(log_path, "w") as log:
        lab = subprocess.Popen(["make", "-s", "lab", f"LAB_ARGS={lab_args}"], cwd=REPO, env=env, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    left: list[str] = []
    try:
        try:
            names = wait_for_api(lab, port, token, opts.start_timeout)
        except CheckFailed as err:
            raise CheckFailed(f"{err}\n{log_path.read_text()[-3000:]}") from None
        if opts.notebook not in names:
            raise CheckFailed(f"{opts.notebook} is not served by `make lab` (it serves {names})")
        print(f"ok  `make lab` answered GET /api/contents/ on 127.0.0.1:{port} after "
              f"{time.monotonic() - started:.1f} s ({len(names)} entries)", flush=True)

        url = f"http://127.0.0.1:{port}/lab/tree/{opts.notebook}?token={token}"
        size = f"--window-size={opts.window_size}"
        budget, attempt = opts.budget, 1
        while True:  # at least one attempt
            dom = chromium(browser, url, [size, f"--virtual-time-budget={budget}", "--dump-dom"], opts.timeout)
            missing = rendered(dom.stdout, expected)
            if not missing or attempt >= opts.attempts:
                break
            print(f"..  after a {budget} ms budget the DOM lacks {', '.join(missing)}; retrying", flush=True)
            budget, attempt = budget * 2, attempt + 1
        if missing:
            raise CheckFailed(f"the notebook did not render: the DOM lacks {', '.join(missing)}")
        outputs = dom.stdout.count("jp-OutputArea-output")
        print(f"ok  DOM ({len(dom.stdout)} chars, {budget} ms budget) has the notebook panel, {outputs} "
              f"output areas and the stored output {expected!r}", flush=True)
        if NEWS_TOAST in dom.stdout:
            raise CheckFailed(f"JupyterLab shows its news toast ({NEWS_TOAST!r}): binder/overrides.json is not "
                              "in the environment's share/jupyter/lab/settings/")
        shutdown = settings(port, token, "@jupyterlab/notebook-extension:tracker").get("kernelShutdown")
        if shutdown is not True:
            raise CheckFailed(f"closing a notebook does not shut its kernel down (kernelShutdown = {shutdown})")
        print(f"ok  no news toast in the DOM; kernelShutdown = {shutdown} (closing a tab ends its kernel)", flush=True)

        opts.output.parent.mkdir(parents=True, exist_ok=True)
        opts.output.unlink(missing_ok=True)
        chromium(browser, url, [size, f"--virtual-time-budget={budget}", f"--screenshot={opts.output}"],
                 opts.timeout)
        if not opts.output.is_file():
            raise CheckFailed(f"chromium wrote no screenshot to {opts.output}")
        fraction, (width, height) = ink(opts.output)
        if fraction < opts.min_ink:
            raise CheckFailed(f"the screenshot {opts.output} looks blank: {fraction:.1%} non-white pixels "
                              f"(< {opts.min_ink:.0%})")
        print(f"ok  screenshot {opts.output} ({width}x{height}) is not blank: {fraction:.1%} non-white pixels",
              flush=True)
    finally:
        left = stop(lab, port)
    if left:
        raise CheckFailed(f"left behind after stopping JupyterLab: {', '.join(left)}")
    print(f"ok  JupyterLab stopped: no process of its group left, port {port} free", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--notebook", default="01_devices.ipynb", help="chapter notebook under notebooks/")
    parser.add_argument("--expect", help="text known to be in the notebook's stored outputs")
    parser.add_argument("--output", type=Path, default=REPO / "build" / "browser-check.png", help="screenshot")
    parser.add_argument("--window-size", default="1400,1800", help="browser window, WIDTH,HEIGHT")
    parser.add_argument("--budget", type=int, default=20000, help="first virtual time budget, ms")
    parser.add_argument("--attempts", type=int, default=3, help="DOM dumps, the budget doubling each time")
    parser.add_argument("--timeout", type=float, default=180, help="seconds for one chromium run")
    parser.add_argument("--start-timeout", type=float, default=120, help="seconds for JupyterLab to answer")
    parser.add_argument("--min-ink", type=float, default=0.05, help="least fraction of non-white pixels")
    opts = parser.parse_args()
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="browser-check-") as workdir:
            check(opts, Path(workdir))
    except CheckFailed as err:
        print(f"FAIL {err}", file=sys.stderr)
        return 1
    print(f"PASS {opts.notebook} renders with its outputs in Chromium ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
