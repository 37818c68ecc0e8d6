"""d2l_ext.simqueue: the simulated device queue on a virtual clock (every time exact, nothing sleeps).

Each expected time below is worked out by hand from the model's rules (the module docstring), not read off a run.
"""

import time

import matplotlib
import pytest

import d2l_ext
from d2l_ext.simqueue import SimulatedDevice, plot_timeline

READS_NOTEBOOKS = False  # no notebook, edition or markdown file: tools/result_cache.py keys it on code only

matplotlib.use("Agg")


@pytest.fixture
def sim():
    with SimulatedDevice() as device:
        yield device


def ms(span_or_seconds) -> float:
    seconds = span_or_seconds if isinstance(span_or_seconds, float) else span_or_seconds.duration
    return round(seconds * 1e3, 6)


def test_launch_returns_at_once_and_synchronize_waits_for_the_kernel(sim):
    result = sim.launch(0.2, "slow")
    assert sim.now() == 0.0 and not result.query()  # the host has not moved; the kernel runs until 200 ms
    sim.synchronize()
    assert sim.now() == 0.2 and result.query()
    waiting = [s for s in sim.spans() if s.kind == "waiting"]
    assert [(s.name, s.start_ns, s.end_ns) for s in waiting] == [("synchronize", 0, 200_000_000)]


def test_costs_no_wall_time():
    start = time.perf_counter()
    with SimulatedDevice(launch_seconds=1.0) as device:
        for _ in range(100):
            device.launch(10.0)
        device.synchronize()
        assert device.now() == 1001.0  # 100 launches of 1 s; the last kernel starts at 100 s, after 99 x 10 s
    assert time.perf_counter() - start < 0.5  # 1001 simulated seconds; a sleeping model would take them


def test_one_engine_runs_its_queue_in_order_back_to_back(sim):
    for i in range(3):
        sim.launch(0.01, f"k{i}")
    sim.synchronize()
    kernels = [s for s in sim.spans() if s.kind == "kernel"]
    assert [(k.name, k.start_ns, k.end_ns) for k in kernels] == [
        ("k0", 0, 10_000_000), ("k1", 10_000_000, 20_000_000), ("k2", 20_000_000, 30_000_000)]


def test_a_kernel_starts_when_issued_if_the_engine_is_idle():
    with SimulatedDevice(launch_seconds=0.001) as device:
        device.host_work(0.005)
        device.launch(0.002, "late")
        kernel = next(s for s in device.spans() if s.kind == "kernel")
        assert (kernel.start_ns, kernel.end_ns) == (6_000_000, 8_000_000)  # 5 ms of host work + 1 ms launch


def test_launch_bound_and_compute_bound_loops():
    for kernel, expected_done in ((0.0002, 10.2), (0.005, 51.0)):
        with SimulatedDevice(launch_seconds=0.001) as device:
            for _ in range(10):
                device.launch(kernel)
            issued = device.now()
            device.synchronize()
            assert (ms(issued), ms(device.now())) == (10.0, expected_done)


def test_item_waits_for_the_value_and_only_as_long_as_needed(sim):
    loss = sim.launch(0.02, "loss", value=0.25)
    sim.host_work(0.005)
    assert loss.item() == 0.25
    assert sim.now() == 0.02
    assert [ms(s) for s in sim.spans() if s.kind == "waiting"] == [15.0]  # 20 ms kernel minus 5 ms of host work
    assert loss.item() == 0.25 and ms(sim.now()) == 20.0  # already there: no second wait
    assert len([s for s in sim.spans() if s.kind == "waiting"]) == 1


def test_addition_runs_on_the_device(sim):
    total = sim.launch(0.0, value=1.0)
    for value in (2.0, 3.0):
        total = total + sim.launch(0.01, value=value)
    assert total.item() == 6.0
    assert sum(s.name == "add" for s in sim.spans() if s.kind == "kernel") == 2
    assert sim.launch(0.0, value=lambda: 7.0).item() == 7.0  # a value given as a function


def test_two_engines_overlap_and_after_orders_them(sim):
    copy = sim.launch(0.04, "copy", engine="copy")
    sim.launch(0.04, "independent")
    dependent = sim.launch(0.01, "dependent", after=[copy])
    sim.synchronize()
    spans = {s.name: s for s in sim.spans() if s.lane != "host"}
    assert spans["copy"].lane == "copy" and spans["copy"].kind == "copy"
    assert (spans["independent"].start_ns, spans["copy"].start_ns) == (0, 0)  # side by side
    assert spans["dependent"].start_ns == 40_000_000  # after the copy, and after "independent" on its engine
    assert dependent.query() and ms(sim.now()) == 50.0
    sim.launch(0.0, "upload", kind="copy")  # a copy on the compute engine
    assert next(s for s in sim.spans() if s.name == "upload").kind == "copy"


def test_after_delays_a_kernel_on_an_idle_engine(sim):
    product = sim.launch(0.03, "product")
    result = sim.launch(0.01, "download", engine="copy", after=[product])
    assert result._ready_ns == 40_000_000  # waits for the product, although the copy engine is idle


def test_events_time_the_device_work(sim):
    sim.launch(0.01, "earlier")
    start = sim.record_event()
    sim.launch(0.03)
    end = sim.record_event()
    assert not end.query()  # the device reaches it at 40 ms; the host is at 0
    with pytest.raises(RuntimeError):
        start.elapsed_time(end)
    end.synchronize()
    assert ms(sim.now()) == 40.0
    assert start.elapsed_time(end) == 30.0  # the earlier kernel is not inside the two events
    assert all(s.kind != "event" for s in sim.spans())


def test_an_event_on_an_idle_engine_takes_the_host_clock(sim):
    sim.host_work(0.004)
    event = sim.record_event("copy")
    assert event.query() and event.item() == 0.004


def test_launch_cost_and_host_work_are_recorded():
    with SimulatedDevice(launch_seconds=0.01) as device:
        device.launch(0.0)
        device.host_work(0.02, "logging")
        kinds = {s.kind: s for s in device.spans()}
        assert ms(kinds["launch"]) == 10.0
        assert kinds["host work"].name == "logging" and ms(kinds["host work"]) == 20.0
        assert ms(device.now()) == 30.0


def test_training_loop_matches_its_formulas():
    """.item() every step: steps x (host + device); summed on the device: steps x max(host, device) + min."""
    for host, device_time in ((0.002, 0.004), (0.008, 0.004), (0.004, 0.004)):
        for item_every_step in (True, False):
            with SimulatedDevice() as device:
                total = device.launch(0.0, value=0.0)
                for _ in range(8):
                    device.host_work(host)
                    loss = device.launch(device_time, value=1.0)
                    total = loss if item_every_step else total + loss
                    if item_every_step:
                        loss.item()
                total.item()
                expected = (8 * (host + device_time) if item_every_step
                            else 8 * max(host, device_time) + min(host, device_time))
                assert ms(device.now()) == ms(expected), (host, device_time, item_every_step)


def test_bad_input(sim):
    with pytest.raises(ValueError, match="engine"):
        sim.launch(0.0, engine="tensor cores")
    with pytest.raises(ValueError, match="engine"):
        sim.record_event("tensor cores")
    with pytest.raises(ValueError, match="negative"):
        sim.launch(-0.001)
    with pytest.raises(ValueError, match="negative"):
        sim.host_work(-1.0)


def test_clear_restarts_the_clock(sim):
    sim.launch(0.01)
    sim.clear()
    assert sim.spans() == [] and sim.now() == 0.0
    sim.launch(0.01, "again")
    assert next(s for s in sim.spans() if s.kind == "kernel").start_ns == 0


def test_plot_timeline_draws_a_bar_per_span(sim):
    sim.launch(0.01, engine="copy")
    sim.launch(0.01).item()
    sim.launch(0.0, "instant")  # drawn as a tick
    sim.synchronize()
    spans = sim.spans()
    ax = plot_timeline(spans, title="t")
    bars = sum(len(collection.get_paths()) for collection in ax.collections)
    assert bars == len(spans)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["host", "simulated compute", "simulated copy"]
    assert ax.get_legend() is not None and ax.get_xlabel() == "simulated ms"


def test_exported():
    assert d2l_ext.SimulatedDevice is SimulatedDevice
    assert d2l_ext.plot_simulated_timeline is plot_timeline
