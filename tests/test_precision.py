"""d2l_ext.precision, with what torch reports about the hardware controlled (never the machine's own)."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from d2l_ext import autocast_dtype, needs_grad_scaler, saved_tensor_bytes, tf32_missing

READS_NOTEBOOKS = False  # no notebook, edition or markdown file: tools/result_cache.py keys it on code only


def test_cpu_autocasts_to_bfloat16():
    assert autocast_dtype("cpu") == torch.bfloat16


@pytest.mark.parametrize(("native_bfloat16", "expected"), [(True, torch.bfloat16), (False, torch.float16)])
def test_cuda_uses_bfloat16_only_where_native(monkeypatch, native_bfloat16, expected):
    asked = {}

    def is_bf16_supported(including_emulation=True):
        asked["including_emulation"] = including_emulation
        # a T4 emulates bfloat16: it answers True unless emulation is excluded
        return native_bfloat16 or including_emulation

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", is_bf16_supported)
    monkeypatch.setattr(torch.version, "hip", None)  # an NVIDIA build
    assert autocast_dtype("cuda") == expected
    assert asked == {"including_emulation": False}


# GPU review m11: ROCm's is_bf16_supported() is True on every AMD GPU, so the architecture decides
@pytest.mark.parametrize(("arch", "expected"), [
    ("gfx906:sramecc+:xnack-", torch.float16),  # MI50: no bfloat16 matrix instructions
    ("gfx1030", torch.float16),                 # RDNA 2 (RX 6800)
    ("gfx90a:sramecc+:xnack-", torch.bfloat16),  # MI210/MI250
    ("gfx942:sramecc+:xnack-", torch.bfloat16),  # MI300X
    ("gfx1100", torch.bfloat16),                # RDNA 3 (RX 7900)
])
def test_rocm_uses_bfloat16_only_on_architectures_with_it(monkeypatch, arch, expected):
    monkeypatch.setattr(torch.version, "hip", "6.4.0")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(gcnArchName=arch))
    assert autocast_dtype("cuda") == expected


@pytest.mark.parametrize(("macos_14", "expected"), [(True, torch.bfloat16), (False, torch.float16)])
def test_mps_uses_bfloat16_from_macos_14(monkeypatch, macos_14, expected):
    def is_macos_or_newer(major, minor):
        return macos_14 and (major, minor) <= (14, 0)

    monkeypatch.setattr(torch.backends.mps, "is_macos_or_newer", is_macos_or_newer)
    assert autocast_dtype("mps") == expected


# GPU review n3: chapter 8.5's TF32 cell says why its two lines can match
@pytest.mark.parametrize(("capability", "expected"), [((7, 5), "compute capability 7.5"), ((8, 0), None),
                                                      ((9, 0), None)])
def test_tf32_is_missing_before_ampere(monkeypatch, capability, expected):
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=0: capability)
    reason = tf32_missing()
    assert reason == expected if expected is None else (reason or "").startswith(expected)


# GPU review m4: torch's own is_tf32_supported() where it exists (torch 2.14: gfx94 and gfx95), the same list on
# an older torch without it; HIPBLASLT_ALLOW_TF32 is still asked for, as an expectation not verified on 2.14
def on_rocm(monkeypatch, arch: str, variable: str | None, torch_answer: bool | None, current: int = 0) -> None:
    """Make torch report a ROCm GPU of ``arch``; ``torch_answer`` None: a torch without is_tf32_supported."""
    monkeypatch.setattr(torch.version, "hip", "6.4.0")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=0: SimpleNamespace(gcnArchName=arch))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
    if torch_answer is None:
        monkeypatch.delattr(torch.cuda, "is_tf32_supported", raising=False)
    else:
        monkeypatch.setattr(torch.cuda, "is_tf32_supported", lambda: torch_answer)
    if variable is None:
        monkeypatch.delenv("HIPBLASLT_ALLOW_TF32", raising=False)
    else:
        monkeypatch.setenv("HIPBLASLT_ALLOW_TF32", variable)


@pytest.mark.parametrize(("arch", "variable", "torch_answer", "expected"), [
    ("gfx942:sramecc+:xnack-", None, True, "on ROCm, TF32 needs HIPBLASLT_ALLOW_TF32=1"),
    ("gfx942:sramecc+:xnack-", "1", True, None),
    ("gfx950:sramecc+:xnack-", "1", True, None),  # MI350: the review found it called "no TF32"
    ("gfx90a:sramecc+:xnack-", "1", False, "this AMD GPU (gfx90a) has no TF32"),
    ("gfx942:sramecc+:xnack-", "1", False, "this AMD GPU (gfx942) has no TF32"),  # torch's answer wins
    ("gfx942:sramecc+:xnack-", "1", None, None),  # an older torch: the same list, by architecture
    ("gfx950:sramecc+:xnack-", "1", None, None),
    ("gfx90a:sramecc+:xnack-", "1", None, "this AMD GPU (gfx90a) has no TF32"),
    ("gfx942:sramecc+:xnack-", None, None, "on ROCm, TF32 needs HIPBLASLT_ALLOW_TF32=1"),
])
def test_tf32_on_rocm_asks_torch_then_hipblaslts_variable(monkeypatch, arch, variable, torch_answer, expected):
    on_rocm(monkeypatch, arch, variable, torch_answer)
    reason = tf32_missing()
    assert reason == expected if expected is None else (reason or "").startswith(expected)


def test_tf32_on_another_rocm_gpu_than_the_current_one_goes_by_its_architecture(monkeypatch):
    # is_tf32_supported() answers for the current device: GPU 1 of an MI300X box is judged by its own arch
    on_rocm(monkeypatch, "gfx942:sramecc+:xnack-", "1", torch_answer=False, current=0)
    assert tf32_missing(1) is None
    assert (tf32_missing(0) or "").startswith("this AMD GPU (gfx942) has no TF32")


def test_only_float16_needs_a_scaler():
    assert needs_grad_scaler(torch.float16)
    assert not needs_grad_scaler(torch.bfloat16)
    assert not needs_grad_scaler(None)  # no autocast


def test_saved_tensor_bytes_counts_activations_and_parameters_once_each():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    X, y = torch.randn(16, 4), torch.randint(0, 3, (16,))

    def forward(dtype=None):
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            return nn.functional.cross_entropy(net(X), y)

    float32 = saved_tensor_bytes(forward)
    # X (16x4), ReLU's output, also the 2nd layer's input (16x8, once), the log-softmax (16x3), the labels
    # (16 int64) and the loss's total weight (a float32 scalar); the 2nd layer's weight (8x3) is a parameter
    assert float32 == {"activations": 4 * (16 * 4 + 16 * 8 + 16 * 3) + 8 * 16 + 4, "parameters": 4 * 8 * 3}
    bfloat16 = saved_tensor_bytes(lambda: forward(torch.bfloat16))
    # the layers' inputs in 2 bytes, the loss's in float32; the 16-bit copy of the weight counts as a parameter
    assert bfloat16 == {"activations": 2 * (16 * 4 + 16 * 8) + 4 * 16 * 3 + 8 * 16 + 4, "parameters": 2 * 8 * 3}


def test_saved_tensor_bytes_counts_a_view_by_its_own_size():
    layer, inputs = nn.Linear(4, 2), torch.randn(100, 4)
    assert saved_tensor_bytes(lambda: layer(inputs[:10]).sum())["activations"] == 10 * 4 * 4


def test_saved_tensor_bytes_is_zero_without_autograd():
    with torch.no_grad():
        assert saved_tensor_bytes(lambda: nn.Linear(4, 4)(torch.randn(2, 4))) == {"activations": 0, "parameters": 0}
