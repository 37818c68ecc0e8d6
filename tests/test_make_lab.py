"""`make lab` starts JupyterLab serving the notebooks: start it on 127.0.0.1, list them, stop it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import free_port

pytestmark = pytest.mark.launches  # most tests here start processes (Pythons, kernels, torchrun)

REPO = Path(__file__).resolve().parent.parent


def test_make_lab_serves_the_notebooks(tmp_path):
    port, token = free_port(), "d2l-ext-test"
    args = (f"--no-browser --ServerApp.ip=127.0.0.1 --ServerApp.port={port} "
            f"--ServerApp.port_retries=0 --IdentityProvider.token={token}")
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path), "JUPYTER_CONFIG_DIR": str(tmp_path)}
    log = open(tmp_path / "lab.log", "w+")
    lab = subprocess.Popen(["make", "-s", "lab", f"LAB_ARGS={args}"], cwd=REPO, env=env,
                           stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        listing = None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and lab.poll() is None:
            try:
                request = urllib.request.Request(f"http://127.0.0.1:{port}/api/contents/",
                                                 headers={"Authorization": f"token {token}"})
                with urllib.request.urlopen(request, timeout=5) as response:
                    listing = json.load(response)
                break
            except OSError:
                time.sleep(0.5)
        log.seek(0)
        assert listing is not None, f"JupyterLab did not answer:\n{log.read()[-3000:]}"
        names = {item["name"] for item in listing["content"]}
        expected = {p.name for p in (REPO / "notebooks").glob("*.ipynb")}
        assert expected and expected <= names
        assert "solutions" in names
        # the lab UI itself is served, not only the API
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab?token={token}", timeout=10) as response:
            assert response.status == 200 and b"JupyterLab" in response.read()
    finally:
        if lab.poll() is None:
            os.killpg(lab.pid, signal.SIGTERM)
        try:
            lab.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(lab.pid, signal.SIGKILL)
            lab.wait()
        log.close()
    with socket.socket() as s:  # nothing listens on the port any more (TIME_WAIT leftovers allowed)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
