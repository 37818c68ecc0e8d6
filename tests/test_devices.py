"""d2l_ext's device functions, with what torch reports controlled (never the machine's own hardware)."""

import subprocess

import pytest
import torch

import d2l_ext
from d2l_ext import guard
from tests.helpers import fake_accelerator

READS_NOTEBOOKS = False  # no notebook, edition or markdown file: tools/result_cache.py keys it on code only


def old_torch(monkeypatch, cuda: int = 0, mps: bool = False) -> None:
    """Hide torch.accelerator (torch < 2.6) and control torch.cuda and torch.backends.mps instead."""
    monkeypatch.delattr(torch, "accelerator", raising=False)  # called twice in one test
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: cuda)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)


def test_cpu_and_gpu_names():
    assert d2l_ext.cpu() == torch.device("cpu")
    # like d2l, gpu(i) only names a device; without an accelerator the name is CUDA's
    assert d2l_ext.gpu(3).index == 3


def test_no_accelerator(monkeypatch):
    fake_accelerator(monkeypatch, None, 0)
    assert d2l_ext.accelerator_type() is None
    assert d2l_ext.num_gpus() == 0
    assert d2l_ext.try_gpu() == torch.device("cpu")
    assert d2l_ext.try_all_gpus() == [torch.device("cpu")]  # d2l-en returns [] here
    assert d2l_ext.gpu(1) == torch.device("cuda:1")


@pytest.mark.parametrize("kind", ["cuda", "mps", "xpu"])
def test_one_gpu_of_each_vendor(monkeypatch, kind):
    fake_accelerator(monkeypatch, kind, 1)
    assert d2l_ext.accelerator_type() == kind
    assert d2l_ext.num_gpus() == 1
    assert d2l_ext.try_gpu() == torch.device(f"{kind}:0")
    assert d2l_ext.try_gpu(1) == torch.device("cpu")
    assert d2l_ext.try_all_gpus() == [torch.device(f"{kind}:0")]


def test_four_gpus(monkeypatch):
    fake_accelerator(monkeypatch, "cuda", 4)
    assert d2l_ext.try_gpu(3) == torch.device("cuda:3")
    assert d2l_ext.try_gpu(4) == torch.device("cpu")
    assert d2l_ext.try_all_gpus() == [torch.device(f"cuda:{i}") for i in range(4)]


def test_torch_without_accelerator_module(monkeypatch):
    old_torch(monkeypatch, cuda=2)
    assert d2l_ext.accelerator_type() == "cuda"
    assert d2l_ext.try_all_gpus() == [torch.device("cuda:0"), torch.device("cuda:1")]
    old_torch(monkeypatch, cuda=0, mps=True)
    assert d2l_ext.accelerator_type() == "mps"
    assert d2l_ext.try_gpu() == torch.device("mps:0")
    old_torch(monkeypatch, cuda=0, mps=False)
    assert d2l_ext.try_all_gpus() == [torch.device("cpu")]


@pytest.mark.parametrize(
    ("kind", "count", "needed", "needed_kind", "runs"),
    [
        (None, 0, 1, None, False),
        ("cuda", 1, 1, None, True),
        ("cuda", 1, 2, None, False),
        ("cuda", 2, 2, None, True),
        ("cuda", 8, 2, "cuda", True),
        ("mps", 1, 1, None, True),
        ("mps", 1, 1, "cuda", False),  # a CUDA-only cell (streams, nvidia-smi) skips on a Mac
        ("xpu", 2, 2, "xpu", True),
    ],
)
def test_needs_gpus_decides_and_explains(monkeypatch, capsys, kind, count, needed, needed_kind, runs):
    fake_accelerator(monkeypatch, kind, count)
    monkeypatch.setattr(guard, "unusable_driver", lambda: None)  # whatever driver this machine has
    assert d2l_ext.needs_gpus(needed, kind=needed_kind) is runs
    printed = capsys.readouterr().out
    if runs:
        assert printed == ""
    else:
        assert printed.count("\n") == 1  # one line
        assert printed.startswith(f"Skipped: this cell needs {needed} GPU")
        assert ("no GPU" if count == 0 else f"has {count} ") in printed
        assert "Colab" in printed


def test_skip_message_wording():
    assert guard.skip_message(1, 0, None) == (
        "Skipped: this cell needs 1 GPU; this machine has no GPU. "
        "To get one on Colab: Runtime > Change runtime type > T4 GPU."
    )
    two = guard.skip_message(2, 1, "cuda")
    assert "needs 2 GPUs; this machine has 1 CUDA (NVIDIA, or AMD with ROCm) GPU." in two
    assert "Colab offers only one GPU" in two
    assert "of type Apple MPS" in guard.skip_message(1, 1, "cuda", kind="mps")


T4_LISTED = "GPU 0: Tesla T4 (UUID: GPU-5a1e0c2f-0000-0000-0000-000000000000)\n"


def fake_nvidia_smi(monkeypatch, present: bool = True, returncode: int = 0, stdout: str = "",
                    hangs: bool = False) -> list[list[str]]:
    """Control what ``nvidia-smi -L`` does for d2l_ext.guard; return the list of commands it was asked to run."""
    calls: list[list[str]] = []

    def run(command, **kwargs):
        calls.append(command)
        if hangs:
            raise subprocess.TimeoutExpired(command, kwargs["timeout"])
        return subprocess.CompletedProcess(command, returncode, stdout=stdout, stderr="")

    monkeypatch.setattr(guard.shutil, "which",
                        lambda name: "/usr/bin/nvidia-smi" if present and name == "nvidia-smi" else None)
    monkeypatch.setattr(guard.subprocess, "run", run)
    return calls


def torch_built_for_cuda_without_a_gpu(monkeypatch) -> None:
    """A CUDA build of torch that finds no GPU, with no GPU hidden on purpose."""
    fake_accelerator(monkeypatch, None, 0)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_a_driver_that_torch_cannot_use_is_named_not_called_no_gpu(monkeypatch, capsys):
    # a T4 box on an older driver than the torch build's CUDA needs: nvidia-smi lists the T4, torch finds nothing
    torch_built_for_cuda_without_a_gpu(monkeypatch)
    calls = fake_nvidia_smi(monkeypatch, stdout=T4_LISTED)
    assert guard.unusable_driver() == guard.UnusableDriver("GPU 0: Tesla T4", "13.0")
    assert calls[0] == ["/usr/bin/nvidia-smi", "-L"]
    assert d2l_ext.needs_gpus(1) is False
    printed = capsys.readouterr().out
    assert printed.count("\n") == 1 and "no GPU" not in printed
    assert ("nvidia-smi lists a GPU (GPU 0: Tesla T4), but PyTorch, built for CUDA 13.0, cannot use it: "
            "the NVIDIA driver is most likely older than CUDA 13.0 needs") in printed
    assert "UUID" not in printed
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # one GPU chosen: the driver is still to blame
    assert guard.unusable_driver() == guard.UnusableDriver("GPU 0: Tesla T4", "13.0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # GPUs hidden on purpose: the driver is not to blame
    assert guard.unusable_driver() is None


@pytest.mark.parametrize(
    "nvidia_smi",
    [
        {"present": False},  # no driver at all
        {"returncode": 9, "stdout": "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."},
        {"returncode": 6, "stdout": "No devices were found\n"},  # a container image with the tools, no GPU
        {"returncode": 0, "stdout": ""},  # runs, lists nothing
        {"hangs": True},  # stuck: given up after the timeout
    ],
    ids=["absent", "fails", "no-devices", "lists-nothing", "times-out"],
)
def test_the_driver_is_blamed_only_for_a_gpu_that_nvidia_smi_lists(monkeypatch, capsys, nvidia_smi):
    torch_built_for_cuda_without_a_gpu(monkeypatch)
    calls = fake_nvidia_smi(monkeypatch, **nvidia_smi)
    assert guard.unusable_driver() is None
    assert d2l_ext.needs_gpus(1) is False
    assert "this machine has no GPU" in capsys.readouterr().out
    assert len(calls) == (0 if nvidia_smi.get("present") is False else 2)  # nothing run without the binary


def test_nvidia_smi_is_not_run_when_torch_has_a_gpu_or_no_cuda(monkeypatch):
    torch_built_for_cuda_without_a_gpu(monkeypatch)
    calls = fake_nvidia_smi(monkeypatch, stdout=T4_LISTED)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # torch uses the GPU: nothing to blame
    assert guard.unusable_driver() is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)  # a CPU-only build: no driver can help it
    assert guard.unusable_driver() is None
    assert calls == []


def test_nvidia_smi_is_given_a_short_timeout(monkeypatch):
    torch_built_for_cuda_without_a_gpu(monkeypatch)
    seen = {}

    def run(command, **kwargs):
        seen.update(kwargs)
        return subprocess.CompletedProcess(command, 0, stdout=T4_LISTED, stderr="")

    monkeypatch.setattr(guard.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(guard.subprocess, "run", run)
    assert guard.unusable_driver() is not None
    assert 0 < seen["timeout"] <= 10
