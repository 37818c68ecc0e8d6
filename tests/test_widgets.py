"""d2l_ext/widgets.py: the models behind the sliders, and the sliders themselves (ipywidgets 8 in make test,
ipywidgets 7.7.1, Colab's, in make test-colab)."""

from __future__ import annotations

import matplotlib
import pytest

from d2l_ext import widgets

READS_NOTEBOOKS = False  # no notebook, edition or markdown file: tools/result_cache.py keys it on code only

matplotlib.use("Agg")


def test_a_copy_costs_its_fixed_cost_plus_its_bytes_at_the_bandwidth():
    assert widgets.copy_time_ms(1, 10, 10) == pytest.approx(0.01 + 0.1)  # 10 us + 1e6 B / 1e10 B/s
    assert widgets.copy_time_ms(0, 10, 10) == pytest.approx(0.01)
    numbers = widgets.copy_model(1, 10, 10, draw=False)
    assert numbers["effective_gb_s"] == pytest.approx(1 / 0.11)  # 1 MB in 0.11 ms
    assert numbers["half_bandwidth_mb"] == pytest.approx(0.1)  # 10 us x 10 GB/s = 100 kB
    # at that size the copy runs at half the bandwidth
    assert widgets.copy_model(0.1, 10, 10, draw=False)["effective_gb_s"] == pytest.approx(5)


def test_the_simulated_loop_takes_the_times_chapter_4_predicts():
    # sum on the device: steps x max(host, kernel) + min(host, kernel); .item() every step: steps x (host + kernel)
    assert widgets.queue_model(3, 4, 4, draw=False) == pytest.approx({False: 19.0, True: 28.0})
    assert widgets.queue_model(8, 0.8, 8, draw=False) == pytest.approx({False: 64.8, True: 70.4})
    _, spans = widgets.simulated_loop(3, 4, 4, item_every_step=True)
    assert sum(s.kind == "waiting" for s in spans) == 4  # the host waits once a step


@pytest.mark.parametrize(("call", "argument"), [
    (lambda: widgets.copy_time_ms(1, -1, 10), "bandwidth_gb_s"),
    (lambda: widgets.copy_time_ms(1, 0, 10), "bandwidth_gb_s"),
    (lambda: widgets.copy_time_ms(-1, 10, 10), "megabytes"),
    (lambda: widgets.copy_time_ms(1, 10, -5), "latency_us"),
    (lambda: widgets.simulated_loop(3, 4, 0, False), "steps"),
    (lambda: widgets.simulated_loop(3, 4, 2.5, False), "steps"),  # pyright: ignore[reportArgumentType]
    (lambda: widgets.simulated_loop(-3, 4, 4, False), "host_ms"),
    (lambda: widgets.simulated_loop(3, -4, 4, False), "kernel_ms"),
])
def test_an_impossible_value_raises_naming_its_argument(call, argument):
    with pytest.raises(ValueError, match=argument):
        call()


def test_moving_a_slider_redraws_the_model_with_the_new_settings():
    pytest.importorskip("ipywidgets")
    panel = widgets.slider_panel(lambda **values: widgets.queue_model(**values, draw=False),
                                 host_ms=widgets.Slider(3.0, 0.0, 10.0, 0.5), kernel_ms=widgets.Slider(4.0, 0.0, 10.0),
                                 steps=widgets.Slider(4, 1, 16), item_every_step=widgets.Slider(False))
    assert panel is not None
    controls = panel.controls
    assert type(controls["steps"]).__name__ == "IntSlider" and type(controls["item_every_step"]).__name__ == "Checkbox"
    assert panel.last is None  # nothing moved yet: the static default output is the chapter's own call
    controls["host_ms"].value = 8.0
    assert panel.last == pytest.approx({False: 36.0, True: 48.0})  # 4 x 8 + 4; 4 x (8 + 4)
    controls["steps"].value = 8
    controls["kernel_ms"].value = 0.8
    assert panel.last == pytest.approx({False: 64.8, True: 70.4})
    controls["steps"].value = 1000  # beyond the slider: clamped to its end
    assert controls["steps"].value == 16
    controls["host_ms"].value = -1.0
    assert controls["host_ms"].value == 0.0


def test_a_log_slider_moves_in_powers_of_ten():
    pytest.importorskip("ipywidgets")
    panel = widgets.slider_panel(lambda **values: widgets.copy_model(**values, draw=False),
                                 megabytes=widgets.Slider(1.0, 0.001, 1000.0, 0.5, log=True),
                                 bandwidth_gb_s=widgets.Slider(10.0, 1.0, 64.0),
                                 latency_us=widgets.Slider(10.0, 0.0, 100.0))
    assert panel is not None
    assert type(panel.controls["megabytes"]).__name__ == "FloatLogSlider"
    panel.controls["megabytes"].value = 0.1
    assert isinstance(panel.last, dict) and panel.last["effective_gb_s"] == pytest.approx(5)  # half of b at a x b
    panel.controls["megabytes"].value = 1e6
    assert panel.controls["megabytes"].value == pytest.approx(1000.0)
