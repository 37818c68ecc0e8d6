"""Open a chapter notebook in JupyterLab in a real (headless Chromium) browser and check that it renders.

How to run (needs Chromium, make browser-deps, and the book's environment, which has Playwright):

    .venv-book/bin/python -m tools.browser.lab                       # 01_devices.ipynb -> build/browser-check.png
    .venv-book/bin/python -m tools.browser.lab --notebook 03_copying.ipynb --expect "GB/s" --output /tmp/lab.png

What it does and checks:

1. starts JupyterLab through the real `make -s lab` target on 127.0.0.1, a free port and a random token (own
   process group, temporary JUPYTER_CONFIG_DIR/JUPYTER_RUNTIME_DIR), and waits until GET /api/contents/
   answers with that token;
2. loads http://127.0.0.1:PORT/lab/tree/NOTEBOOK?token=TOKEN in headless Chromium (Playwright), waiting until
   the DOM holds the notebook panel, JupyterLab's output areas (`jp-OutputArea-output`) and a text known to be in
   the notebook's stored outputs (default: "device(type='cpu')" for 01_devices.ipynb);
3. checks that JupyterLab's news toast is absent and that closing a notebook shuts its kernel down (the
   settings in binder/overrides.json);
4. takes a screenshot and checks with Pillow that it
   is not blank: at least --min-ink of its pixels are not white (JupyterLab's loading splash is ~1 %);
5. stops JupyterLab (SIGTERM to its process group, then SIGKILL), ends any process it left (kernels run
   in their own session), and checks that nothing is left and the port is free.

Exit status 0 when all checks pass, 1 with a message otherwise.

Why this module: no library starts the course's own `make lab` and checks its settings (the news toast, kernels
shut down on close); Playwright (tools/browser/chromium.py) drives the browser.
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

from tools import REPO
from tools.browser.chromium import INSTALL_HINT, find_chromium, free_port, ink_share, open_browser

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
        width, height = (int(x) for x in opts.window_size.split(","))
        opts.output.parent.mkdir(parents=True, exist_ok=True)
        opts.output.unlink(missing_ok=True)
        with open_browser(browser) as chromium:
            tab = chromium.new_page(viewport={"width": width, "height": height})
            rendering = time.monotonic()
            try:  # JupyterLab draws the notebook after its scripts load: wait for the outputs, not a fixed time
                tab.goto(url, wait_until="load", timeout=opts.timeout * 1000)
                tab.wait_for_selector(".jp-OutputArea-output", timeout=opts.timeout * 1000)
                tab.get_by_text(expected).first.wait_for(timeout=opts.timeout * 1000)
            except Exception as err:  # Playwright's TimeoutError: say what is missing below
                print(f"..  {type(err).__name__}: {str(err).splitlines()[0]}", flush=True)
            dom = tab.content()
            missing = rendered(dom, expected)
            if missing:
                raise CheckFailed(f"the notebook did not render within {opts.timeout:.0f} s: the DOM lacks "
                                  f"{', '.join(missing)}")
            outputs = dom.count("jp-OutputArea-output")
            print(f"ok  DOM ({len(dom)} chars, after {time.monotonic() - rendering:.1f} s) has the notebook panel, "
                  f"{outputs} output areas and the stored output {expected!r}", flush=True)
            if NEWS_TOAST in dom:
                raise CheckFailed(f"JupyterLab shows its news toast ({NEWS_TOAST!r}): binder/overrides.json is not "
                                  "in the environment's share/jupyter/lab/settings/")
            tab.screenshot(path=str(opts.output))
        shutdown = settings(port, token, "@jupyterlab/notebook-extension:tracker").get("kernelShutdown")
        if shutdown is not True:
            raise CheckFailed(f"closing a notebook does not shut its kernel down (kernelShutdown = {shutdown})")
        print(f"ok  no news toast in the DOM; kernelShutdown = {shutdown} (closing a tab ends its kernel)", flush=True)
        if not opts.output.is_file():
            raise CheckFailed(f"chromium wrote no screenshot to {opts.output}")
        fraction = ink_share(opts.output, white=240)
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
    parser.add_argument("--timeout", type=float, default=180, help="seconds for the notebook to render")
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
