"""d2l_ext.timing: measure (warm-up, accelerator synchronization, sane statistics), bandwidth, measure_copy."""

import time

import pytest
import torch

import d2l_ext
import d2l_ext.timing

READS_NOTEBOOKS = False  # no notebook, edition or markdown file: tools/result_cache.py keys it on code only


def test_measure_counts_the_work_and_warms_up():
    calls = []

    def work():
        calls.append(1)
        time.sleep(0.002)

    m = d2l_ext.measure(work, min_run_time=0.05)
    assert m.median >= 0.002  # a sleep cannot take less than asked
    assert m.median < 0.5
    assert len(calls) > 2  # the warm-up call and the measured ones


def test_measure_synchronizes_the_accelerator(monkeypatch):
    # torch.utils.benchmark's timer synchronizes whatever accelerator torch reports
    synced = []
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda *a: synced.append(1))
    d2l_ext.measure(lambda: None, min_run_time=0.01)
    assert len(synced) >= 2  # before and after the timed block, at least


def test_measure_sets_the_thread_count():
    seen = []
    d2l_ext.measure(lambda: seen.append(torch.get_num_threads()), num_threads=1, min_run_time=0.01)
    assert seen[-1] == 1


def test_bandwidth_is_bytes_over_the_median_time():
    measurement = d2l_ext.timing.measure(lambda: time.sleep(0.001), min_run_time=0.02)
    assert d2l_ext.timing.bandwidth(1000, measurement) == 1000 / measurement.median
    assert d2l_ext.timing.bandwidth(0, measurement) == 0


def test_measure_copy_copies_the_requested_bytes_with_the_requested_mode(monkeypatch):
    copies = []
    copy = torch.Tensor.copy_

    def recording_copy(dst, src, non_blocking=False):
        copies.append((dst.numel(), dst.dtype, src.device.type, dst.device.type, non_blocking))
        return copy(dst, src, non_blocking=non_blocking)

    monkeypatch.setattr(torch.Tensor, "copy_", recording_copy)
    for non_blocking in (False, True):
        copies.clear()
        m = d2l_ext.timing.measure_copy(4096, "cpu", "cpu", non_blocking=non_blocking, min_run_time=0.01)
        assert m.median > 0
        assert "4096 bytes cpu -> cpu" in m.label
        assert len(copies) > 2  # the warm-up copy and the measured ones
        assert set(copies) == {(4096, torch.uint8, "cpu", "cpu", non_blocking)}


def test_measure_copy_pins_only_the_host_side(monkeypatch):
    # without a GPU, pinning raises: record what is asked for and allocate plain CPU memory instead
    requests = []

    def allocator(real):
        def allocate(n, *, dtype, device, pin_memory):
            requests.append((torch.device(device).type, pin_memory))
            return real(n, dtype=dtype)
        return allocate

    monkeypatch.setattr(torch, "ones", allocator(torch.ones))
    monkeypatch.setattr(torch, "empty", allocator(torch.empty))
    d2l_ext.timing.measure_copy(64, "cpu", "cuda:0", pinned=True, min_run_time=0.01)
    assert requests == [("cpu", True), ("cuda", False)]  # source, then destination
    requests.clear()
    d2l_ext.timing.measure_copy(64, "cuda:0", "cpu", pinned=True, min_run_time=0.01)
    assert requests == [("cuda", False), ("cpu", True)]
    requests.clear()
    d2l_ext.timing.measure_copy(64, "cpu", "cuda:0", min_run_time=0.01)
    assert requests == [("cpu", False), ("cuda", False)]


def test_measure_copy_refuses_to_pin_without_a_host_side():
    with pytest.raises(ValueError, match="neither side is the CPU"):
        d2l_ext.timing.measure_copy(64, "cuda:0", "cuda:1", pinned=True)


def test_measure_copy_sets_the_thread_count(monkeypatch):
    seen = []
    copy = torch.Tensor.copy_

    def recording_copy(dst, src, non_blocking=False):
        seen.append(torch.get_num_threads())
        return copy(dst, src, non_blocking=non_blocking)

    monkeypatch.setattr(torch.Tensor, "copy_", recording_copy)
    d2l_ext.timing.measure_copy(64, "cpu", "cpu", num_threads=1, min_run_time=0.01)
    assert seen[-1] == 1


def test_synchronize_waits_on_accelerators_only(monkeypatch):
    synced = []
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda device=None: synced.append(device))
    d2l_ext.synchronize("cpu")
    assert synced == []  # nothing queued on the CPU, and no accelerator call without one
    d2l_ext.synchronize("cuda:1")
    assert synced == [torch.device("cuda:1")]


# N1 of the GPU review: the batch search of chapter 4 section 4.6 must stop on the device's own time, not on
# the host's launch time, or a launch-bound GPU stops it at once.
@pytest.mark.parametrize(("device", "issued", "done", "covers"), [
    ("cpu", 0.0006, 0.0006, True),      # the CPU: the whole step is the device's work
    ("cpu", 0.0004, 0.0004, False),
    ("cuda", 0.0005, 0.0006, False),    # launch-bound GPU: done is mostly the launches
    ("cuda", 0.0005, 0.0009, False),    # D = 0.9 ms < H + L = 1.0 ms
    ("cuda", 0.0005, 0.0011, True),     # D >= H + L: the device sets the pace
    ("mps", 0.0002, 0.0008, True),
])
def test_the_device_covers_the_host_only_beyond_its_launches(device, issued, done, covers):
    assert d2l_ext.device_covers_host(device, issued, done, 0.0005) is covers


def test_host_work_outlasts_the_launches_on_a_gpu():
    assert d2l_ext.host_seconds_for("cpu", 0.003) == 0.0005
    assert d2l_ext.host_seconds_for("cuda", 0.0001) == 0.0005
    assert d2l_ext.host_seconds_for(torch.device("cuda", 0), 0.0006) == pytest.approx(0.0012)
