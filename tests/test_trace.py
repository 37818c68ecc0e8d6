"""d2l_ext.trace: read a real profiler trace (written to a temporary folder), a GPU-shaped one, and draw both."""

from __future__ import annotations

import json
import os

import matplotlib
import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from d2l_ext import trace

READS_NOTEBOOKS = False  # no notebook, edition or markdown file: tools/result_cache.py keys it on code only

matplotlib.use("Agg")
os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # the profiler's C++ library logs its start and stop otherwise


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory) -> list[trace.TraceEvent]:
    """A tiny real trace: three labelled steps of a matrix product and a .item()."""
    path = tmp_path_factory.mktemp("trace") / "trace.json"
    x = torch.ones(16, 16)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            with record_function("step"):
                with record_function("compute"):
                    y = x @ x
                y.sum().item()
    prof.export_chrome_trace(str(path))
    return trace.read_chrome_trace(path)


def test_real_trace_has_the_labels_and_operators(cpu_trace):
    names = [e.name for e in cpu_trace]
    assert names.count("step") == 3 and names.count("compute") == 3
    assert names.count("aten::mm") == 3 and names.count("aten::item") == 3
    assert all(e.duration >= 0 and e.start >= 0 for e in cpu_trace)
    assert min(e.start for e in cpu_trace) == 0.0
    assert [e.start for e in cpu_trace] == sorted(e.start for e in cpu_trace)


def test_real_trace_on_the_cpu_has_one_host_lane(cpu_trace):
    assert list(trace.lanes(cpu_trace)) == ["host thread 0"]
    steps = [e for e in cpu_trace if e.name == "step"]
    inner = [e for e in cpu_trace if e.name == "compute"]
    for step, compute in zip(steps, inner, strict=True):  # a range nests inside the range that opened it
        assert step.start <= compute.start and compute.end <= step.end


def test_busy_fraction_is_the_union_of_the_intervals():
    def event(start, duration):
        return trace.TraceEvent("op", "cpu_op", "host thread 0", start, duration)

    events = [event(0, 2), event(1, 2), event(6, 2)]  # covers 0-3 and 6-8 of 0-8
    assert trace.busy_fraction(events) == pytest.approx(5 / 8)
    assert trace.busy_fraction(events, start=0, end=10) == pytest.approx(5 / 10)
    assert trace.busy_fraction(events, start=2, end=7) == pytest.approx(2 / 5)  # 2-3 and 6-7
    assert trace.busy_fraction([]) == 0.0


def test_device_events_get_a_lane_per_stream_and_host_threads_are_renumbered(tmp_path):
    # the shape of a CUDA trace (kineto's output): kernels on pid = GPU index, tid = stream
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "step", "pid": 4242, "tid": 999, "ts": 100.0, "dur": 50.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 4242, "tid": 999, "ts": 105.0, "dur": 10.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 4242, "tid": 999, "ts": 110.0,
         "dur": 3.0},
        {"ph": "X", "cat": "cpu_op", "name": "autograd::engine", "pid": 4242, "tid": 1001, "ts": 120.0,
         "dur": 5.0},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 115.0, "dur": 20.0,
         "args": {"device": 0, "stream": 7}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH", "pid": 0, "tid": "stream 13", "ts": 140.0,
         "dur": 4.0, "args": {"device": 0}},
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "x", "ts": 90.0,
         "dur": 80.0},
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}},
    ]
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"traceEvents": events}))
    read = trace.read_chrome_trace(path)
    assert len(read) == 6  # the span on a made-up process and the metadata are left out
    assert list(trace.lanes(read)) == ["host thread 0", "host thread 1", "GPU 0 stream 13", "GPU 0 stream 7"]
    gemm = next(e for e in read if e.name == "gemm")
    assert (gemm.lane, gemm.start, gemm.end) == ("GPU 0 stream 7", 15.0, 35.0)
    device = [e for e in read if e.lane.startswith("GPU")]
    assert trace.busy_fraction(device, start=0, end=50) == pytest.approx((20 + 4) / 50)


def test_plot_timeline_draws_a_row_per_lane_and_labels_the_ranges(cpu_trace):
    import matplotlib.pyplot as plt

    ax = trace.plot_timeline(cpu_trace, title="three steps")
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert "host thread 0: operators" in labels and "host thread 0: record_function" in labels
    assert "ranges inside (level 2)" in labels  # "compute" inside "step"
    assert {t.get_text() for t in ax.texts} >= {"step"}
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend[0] == "operator (host)" and sorted(legend[1:]) == ["compute", "step"]  # every range named
    assert ax.get_title() == "three steps" and ax.get_xlim()[0] == 0
    plt.close(ax.figure)
    empty = trace.plot_timeline([], title=None)
    assert empty.get_title() == "no events"
    plt.close(empty.figure)


# A trace recorded on a CUDA GPU (a Quadro GP100) by torch.profiler: five SGD steps, each with the optimizer's
# own record_function ranges. Source: facebookresearch/HolisticTraceAnalysis (MIT licence), commit 23eb7d5,
# tests/data/with_gpu_user_annotation/step_based_trace_2543932.json.gz; copied unchanged.
GPU_TRACE = os.path.join(os.path.dirname(__file__), "data", "traces", "gp100_sgd_steps.json.gz")
STEP = "Optimizer.step#SGD.step"


@pytest.fixture(scope="module")
def gpu_trace() -> list[trace.TraceEvent]:
    return trace.read_chrome_trace(GPU_TRACE)


def test_a_recorded_gpu_trace_has_host_lanes_and_a_stream(gpu_trace):
    # host thread 1: autograd's thread for the backward pass on CUDA
    assert list(trace.lanes(gpu_trace)) == ["host thread 0", "host thread 1", "GPU 0 stream 7"]
    categories = {e.category for e in gpu_trace if e.lane.startswith("GPU")}
    assert categories == {"kernel", "gpu_memcpy", "gpu_user_annotation"}


def test_each_range_is_counted_once_on_a_gpu(gpu_trace):
    by_name = [e for e in gpu_trace if e.name == STEP]
    assert len(by_name) == 10  # 5 steps: each range is also copied onto the stream (N3)
    assert {e.lane for e in by_name} == {"host thread 0", "GPU 0 stream 7"}
    steps = trace.ranges(gpu_trace, STEP)
    assert len(steps) == 5 and {e.lane for e in steps} == {"host thread 0"}
    assert len(trace.ranges(gpu_trace)) == 10  # the steps and the five zero_grad ranges


def test_the_device_is_busy_only_where_it_works(gpu_trace):
    steps = trace.ranges(gpu_trace, STEP)
    on_device = [e for e in gpu_trace if e.lane.startswith("GPU")]
    work = trace.device_work(gpu_trace)
    assert len(on_device) - len(work) == 10 and all(e.category in ("kernel", "gpu_memcpy") for e in work)
    busy = trace.busy_fraction(work, steps[0].start, steps[-1].end)
    inflated = trace.busy_fraction(on_device, steps[0].start, steps[-1].end)
    assert round(busy, 3) == 0.037 and round(inflated, 3) == 0.108  # the ranges' copies tripled it (N2)


def test_host_rows_leave_out_device_copies_of_ranges():
    from torch.profiler import DeviceType

    class Row:  # what key_averages() returns on a GPU: a range has a host row and a device row
        def __init__(self, key, device_type, is_user_annotation):
            self.key, self.device_type, self.is_user_annotation = key, device_type, is_user_annotation

    rows = [Row("train step", DeviceType.CPU, True), Row("train step", DeviceType.CUDA, True),
            Row("aten::mm", DeviceType.CPU, False), Row("volta_sgemm", DeviceType.CUDA, False)]
    assert [(r.key, r.device_type) for r in trace.host_rows(rows)] == [("train step", DeviceType.CPU),
                                                                        ("aten::mm", DeviceType.CPU)]
    kept = trace.without_device_ranges(rows)  # the kernels stay: the device-time table is about them
    assert [(r.key, r.device_type) for r in kept] == [("train step", DeviceType.CPU), ("aten::mm", DeviceType.CPU),
                                                      ("volta_sgemm", DeviceType.CUDA)]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("step"):
            torch.ones(4).sum()
    averages = prof.key_averages()
    table = trace.without_device_ranges(averages)
    assert type(table) is type(averages) and [r.key for r in table] == [r.key for r in averages]  # no GPU rows
    assert "step" in table.table(sort_by="self_cpu_time_total")
