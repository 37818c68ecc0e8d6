"""d2l_ext.measure: warm-up, accelerator synchronization, sane statistics."""

import time

import torch

import d2l_ext


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
