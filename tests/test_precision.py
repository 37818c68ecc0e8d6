"""d2l_ext.precision, with what torch reports about the hardware controlled (never the machine's own)."""

import pytest
import torch

from d2l_ext import autocast_dtype, needs_grad_scaler


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
    assert autocast_dtype("cuda") == expected
    assert asked == {"including_emulation": False}


@pytest.mark.parametrize(("macos_14", "expected"), [(True, torch.bfloat16), (False, torch.float16)])
def test_mps_uses_bfloat16_from_macos_14(monkeypatch, macos_14, expected):
    def is_macos_or_newer(major, minor):
        return macos_14 and (major, minor) <= (14, 0)

    monkeypatch.setattr(torch.backends.mps, "is_macos_or_newer", is_macos_or_newer)
    assert autocast_dtype("mps") == expected


def test_only_float16_needs_a_scaler():
    assert needs_grad_scaler(torch.float16)
    assert not needs_grad_scaler(torch.bfloat16)
    assert not needs_grad_scaler(None)  # no autocast
