"""python -m d2l_ext.doctor: on this machine (no GPU) and with a GPU that torch is made to report."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from d2l_ext import doctor
from tests.helpers import fake_accelerator


def write_chapter(folder, cells):
    folder.mkdir(exist_ok=True)
    notebook = {"cells": [{"cell_type": kind, "source": source, "metadata": {}} for kind, source in cells],
                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (folder / "09_demo.ipynb").write_text(json.dumps(notebook))


@pytest.mark.launches
def test_runs_as_a_module_on_this_machine():
    done = subprocess.run([sys.executable, "-m", "d2l_ext.doctor"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"torch {torch.__version__}" in done.stdout
    assert "01_devices:" in done.stdout and "06_multi_gpu:" in done.stdout


def test_without_a_gpu(monkeypatch, tmp_path):
    fake_accelerator(monkeypatch, None, 0)
    write_chapter(tmp_path, [("markdown", "## 9.1 Anywhere"), ("code", "x = 1"),
                             ("markdown", "## 9.2 One GPU"), ("code", "if d2l_ext.needs_gpus(1):\n    pass"),
                             ("markdown", "## 9.3 Two CUDA GPUs"), ("code", 'if d2l_ext.needs_gpus(2, kind="cuda"):')])
    text = doctor.report(tmp_path)
    assert "accelerators: none usable" in text
    assert "09_demo: runs, except 2 section(s) with cells that skip:" in text
    assert "- 9.2 One GPU: needs 1 GPU\n" in text + "\n"
    assert "- 9.3 Two CUDA GPUs: needs 2 CUDA (NVIDIA, or AMD with ROCm) GPUs" in text
    assert "9.1 Anywhere" not in text


def test_with_one_cuda_gpu(monkeypatch, tmp_path):
    fake_accelerator(monkeypatch, "cuda", 1)
    props = SimpleNamespace(name="Tesla T4", total_memory=15 * 2**30, major=7, minor=5, multi_processor_count=40)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    write_chapter(tmp_path, [("markdown", "## 9.2 One GPU"), ("code", "if d2l_ext.needs_gpus(1):"),
                             ("markdown", "## 9.3 Two GPUs"), ("code", "if d2l_ext.needs_gpus(2):")])
    text = doctor.report(tmp_path)
    assert "accelerators: 1\n  cuda:0 Tesla T4, 15.0 GiB, compute capability 7.5, 40 SMs" in text
    assert "9.2 One GPU" not in text  # runs here
    assert "- 9.3 Two GPUs: needs 2 GPUs" in text


def test_an_apple_gpu_skips_cuda_only_cells(monkeypatch, tmp_path):
    fake_accelerator(monkeypatch, "mps", 1)
    write_chapter(tmp_path, [("markdown", "## 9.4 Streams"), ("code", 'if d2l_ext.needs_gpus(1, kind="cuda"):'),
                             ("markdown", "## 9.5 Any GPU"), ("code", "if d2l_ext.needs_gpus(1):")])
    text = doctor.report(tmp_path)
    assert "mps:0 (Apple MPS)" in text
    assert "- 9.4 Streams: needs 1 CUDA (NVIDIA, or AMD with ROCm) GPU" in text
    assert "9.5 Any GPU" not in text


def test_each_chapter_shows_its_measured_memory(monkeypatch, tmp_path):
    write_chapter(tmp_path, [("markdown", "## 9.1 Anywhere"), ("code", "x = 1")])
    peaks = tmp_path / "peaks.json"
    peaks.write_text(json.dumps({"measured": "2026-11-27", "notebooks": {
        "09_demo.ipynb": {"kernel_peak_bytes": 900_000_000, "tree_peak_bytes": 1_700_000_000, "passes": True}}}))
    monkeypatch.setattr(doctor.psutil, "virtual_memory", lambda: SimpleNamespace(available=8 * 10**9))
    lines = doctor.chapter_lines(tmp_path, peaks)
    assert lines == ["  09_demo: every section runs here",
                     "    memory: kernel 858 MiB, 1,621 MiB with the processes it starts "
                     "(make check-memory, 2026-11-27)"]
    # a machine with less available than the chapter needs is told so
    monkeypatch.setattr(doctor.psutil, "virtual_memory", lambda: SimpleNamespace(available=1_500_000_000))
    assert doctor.chapter_lines(tmp_path, peaks)[1].endswith(
        "; only 1,431 MiB is available now: close other notebooks or programs first")
    # unmeasured (or no file): no memory line
    assert doctor.chapter_lines(tmp_path, tmp_path / "absent.json") == ["  09_demo: every section runs here"]


def test_the_course_chapters_have_measured_memory():
    lines = doctor.chapter_lines()
    chapters = [line for line in lines if line.startswith("  ") and not line.startswith("    ")]
    memory = [line for line in lines if line.startswith("    memory: kernel ")]
    assert len(memory) == len(chapters) > 0, "run: make check-memory CHECK_MEMORY_ARGS=--record"
