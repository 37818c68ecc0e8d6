"""d2l_ext.simqueue: the simulated device queue (orderings and lower bounds only: robust on a loaded machine)."""

import threading
import time

import matplotlib
import pytest

import d2l_ext
from d2l_ext.simqueue import SimulatedDevice, plot_timeline

matplotlib.use("Agg")


@pytest.fixture
def sim():
    with SimulatedDevice() as device:
        yield device


def test_launch_returns_before_the_kernel_has_run(sim):
    result = sim.launch(0.03, "slow")
    sim.synchronize()
    launch = next(s for s in sim.spans() if s.kind == "launch")
    kernel = next(s for s in sim.spans() if s.kind == "kernel")
    assert launch.end <= kernel.start  # the host was done launching before the device began
    assert kernel.duration >= 0.03
    assert result.query()


def test_synchronize_waits_for_all_queued_work(sim):
    start = time.perf_counter()
    for _ in range(3):
        sim.launch(0.02)
    sim.launch(0.02, engine="copy")
    sim.synchronize()
    assert time.perf_counter() - start >= 0.06  # the compute queue alone holds 60 ms
    assert all(s.end <= sim.now() for s in sim.spans())


def test_one_engine_runs_its_queue_in_order(sim):
    for i in range(3):
        sim.launch(0.01, f"k{i}")
    sim.synchronize()
    kernels = [s for s in sim.spans() if s.kind == "kernel"]
    assert [k.name for k in kernels] == ["k0", "k1", "k2"]
    assert all(a.end <= b.start for a, b in zip(kernels, kernels[1:], strict=False))


def test_item_waits_for_the_value(sim):
    start = time.perf_counter()
    loss = sim.launch(0.02, "loss", value=0.25)
    assert loss.item() == 0.25
    assert time.perf_counter() - start >= 0.02
    assert any(s.kind == "waiting" for s in sim.spans())


def test_addition_runs_on_the_device(sim):
    total = sim.launch(0.0, value=1.0)
    for value in (2.0, 3.0):
        total = total + sim.launch(0.01, value=value)
    assert total.item() == 6.0
    assert sum(s.name == "add" for s in sim.spans() if s.kind == "kernel") == 2


def test_two_engines_overlap_and_after_orders_them(sim):
    copy = sim.launch(0.04, "copy", engine="copy")
    sim.launch(0.04, "independent")
    dependent = sim.launch(0.01, "dependent", after=[copy])
    sim.synchronize()
    spans = {s.name: s for s in sim.spans() if s.lane != "host"}
    assert spans["copy"].lane == "copy" and spans["copy"].kind == "copy"
    assert spans["independent"].start < spans["copy"].end  # ran beside the copy, not after it
    assert spans["dependent"].start >= spans["copy"].end
    assert sim.launch(0.0, "upload", kind="copy") and sim.spans()  # a copy on the compute engine
    sim.synchronize()
    assert next(s for s in sim.spans() if s.name == "upload").kind == "copy"
    assert dependent.query()


def test_events_time_the_device_work(sim):
    gate = threading.Event()
    start = sim.record_event()
    sim.launch(0.0, "blocked", value=lambda: float(gate.wait()))  # holds the queue until the gate opens
    sim.launch(0.03)
    end = sim.record_event()
    with pytest.raises(RuntimeError):  # the end event cannot have been reached yet
        start.elapsed_time(end)
    assert not end.query()
    gate.set()
    end.synchronize()
    assert start.elapsed_time(end) >= 30.0
    assert all(s.kind != "event" for s in sim.spans())


def test_launch_cost_and_host_work_are_recorded(sim):
    device = SimulatedDevice(launch_seconds=0.01)
    try:
        device.launch(0.0)
        with device.host_work("logging"):
            time.sleep(0.01)
        kinds = {s.kind: s for s in device.spans()}
        assert kinds["launch"].duration >= 0.01
        assert kinds["host work"].name == "logging" and kinds["host work"].duration >= 0.01
    finally:
        device.close()


def test_unknown_engine_and_clear(sim):
    with pytest.raises(ValueError):
        sim.launch(0.0, engine="tensor cores")
    sim.launch(0.01)
    sim.clear()
    assert sim.spans() == [] and sim.now() < 1.0


def test_plot_timeline_draws_a_bar_per_span(sim):
    sim.launch(0.01, engine="copy")
    sim.launch(0.01).item()
    sim.synchronize()  # the copy engine may still be at work
    spans = sim.spans()
    ax = plot_timeline(spans, title="t")
    bars = sum(len(collection.get_paths()) for collection in ax.collections)
    assert bars == len(spans)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["host", "simulated compute", "simulated copy"]
    assert ax.get_legend() is not None


def test_exported():
    assert d2l_ext.SimulatedDevice is SimulatedDevice
    assert d2l_ext.plot_simulated_timeline is plot_timeline
