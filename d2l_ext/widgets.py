"""Sliders where a learner would rather play than read: two models and a panel that redraws them.

Each model is a plain function that prints its numbers and draws a figure, so a chapter first calls it with
the default settings: that output is static, compared by the tests and shown by any static rendering. Then
`slider_panel` adds sliders (ipywidgets, in JupyterLab, Colab and Binder) that call the same function again
whenever one moves. ipywidgets clamps a slider's value to its range; the models raise ValueError naming the
argument for values no slider can give (a negative bandwidth, zero steps).

- `copy_model(megabytes, bandwidth_gb_s, latency_us)`: the time of one copy, a fixed cost plus bytes at a
  bandwidth (chapter 3);
- `queue_model(host_ms, kernel_ms, steps, item_every_step)`: a training loop on the simulated device
  (`SimulatedDevice`), its timeline and the loop's time with and without `.item()` every step (chapter 4).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .simqueue import SimulatedDevice, Span, plot_timeline


def _check(name: str, value: float, low: float, strict: bool = False) -> None:
    """Raise ValueError naming the argument when ``value`` is below ``low`` (or equal, when ``strict``)."""
    if value < low or (strict and value == low):
        raise ValueError(f"{name} must be {'>' if strict else '>='} {low:g}, got {value!r}")


def copy_time_ms(megabytes: float, bandwidth_gb_s: float, latency_us: float) -> float:
    """Return the time (ms) of one copy of ``megabytes`` MB: a fixed ``latency_us`` plus the bytes at
    ``bandwidth_gb_s`` GB/s (1 MB = 1e6 bytes, 1 GB = 1e9 bytes)."""
    _check("megabytes", megabytes, 0)
    _check("bandwidth_gb_s", bandwidth_gb_s, 0, strict=True)
    _check("latency_us", latency_us, 0)
    return latency_us / 1e3 + megabytes * 1e6 / (bandwidth_gb_s * 1e9) * 1e3


def copy_model(megabytes: float = 1.0, bandwidth_gb_s: float = 12.0, latency_us: float = 10.0,
               draw: bool = True) -> dict[str, float]:
    """Print the time and effective bandwidth of one copy under the model of `copy_time_ms`, draw time and
    effective bandwidth against size with this copy marked, and return the printed numbers."""
    time_ms = copy_time_ms(megabytes, bandwidth_gb_s, latency_us)
    effective = megabytes * 1e6 / (time_ms / 1e3) / 1e9 if megabytes else 0.0
    half_size_mb = latency_us * 1e-6 * bandwidth_gb_s * 1e9 / 1e6  # where the fixed cost equals the bytes' time
    # "model" before each unit: these numbers are exact, and the tests' duration and bandwidth rules leave them
    print(f"model: {megabytes:g} MB at b = {bandwidth_gb_s:g} model GB/s with a = {latency_us:g} model us: "
          f"{time_ms:.4f} model ms, {effective:.2f} model GB/s ({effective / bandwidth_gb_s:.0%} of b)")
    print(f"a copy reaches half of b at a x b = {half_size_mb:.3g} MB")
    if draw:
        import matplotlib.pyplot as plt  # here, so that the numbers need no matplotlib

        sizes = [2.0**k / 1e6 for k in range(10, 31)]  # 1 KiB to 1 GiB, in MB
        rates = [s * 1e6 / (copy_time_ms(s, bandwidth_gb_s, latency_us) / 1e3) / 1e9 for s in sizes]
        fig, ax = plt.subplots(figsize=(5.5, 3))
        ax.plot(sizes, rates, "-", label="effective bandwidth")
        ax.axhline(bandwidth_gb_s, color="grey", linestyle="--", linewidth=1, label="bandwidth b")
        if megabytes:
            ax.plot([megabytes], [effective], "o", color="C3", label="this copy")
        ax.set(xscale="log", yscale="log", xlabel="MB per copy", ylabel="GB/s",
               title="model: time = latency + bytes / bandwidth")
        ax.legend(fontsize=8, loc="lower right")
        fig.tight_layout()
    return {"time_ms": time_ms, "effective_gb_s": effective, "half_bandwidth_mb": half_size_mb}


def simulated_loop(host_ms: float, kernel_ms: float, steps: int, item_every_step: bool) -> tuple[float, list[Span]]:
    """Run chapter 4's training-like loop on a fresh `SimulatedDevice` and return (loop time in simulated ms,
    the recorded spans): each step spends ``host_ms`` of host work and queues a ``kernel_ms`` kernel; its loss
    is read with ``.item()`` every step, or summed on the device and read once at the end."""
    _check("host_ms", host_ms, 0)
    _check("kernel_ms", kernel_ms, 0)
    if int(steps) != steps or steps < 1:
        raise ValueError(f"steps must be a whole number >= 1, got {steps!r}")
    with SimulatedDevice() as sim:
        total = sim.launch(0.0, "zeros", value=0.0)
        for step in range(int(steps)):
            sim.host_work(host_ms / 1e3, "Python work")
            loss = sim.launch(kernel_ms / 1e3, f"step {step}", value=1 / (step + 1))
            if item_every_step:
                loss.item()  # the host waits for this step's kernel
            else:
                total = total + loss  # queued on the device: no waiting
        if not item_every_step:
            total.item()
        return sim.now() * 1e3, sim.spans()


def queue_model(host_ms: float = 3.0, kernel_ms: float = 4.0, steps: int = 4, item_every_step: bool = False,
                draw: bool = True) -> dict[bool, float]:
    """Print the simulated loop's time with and without `.item()` every step, draw the timeline of the chosen
    one, and return both times (simulated ms) keyed by ``item_every_step``."""
    times = {every: simulated_loop(host_ms, kernel_ms, steps, every)[0] for every in (False, True)}
    for every, ms in times.items():
        mark = "  <- drawn" if every == item_every_step else ""
        name = ".item() every step" if every else "sum on the device"
        print(f"{steps} steps of host {host_ms:g} + kernel {kernel_ms:g} simulated ms, {name:<18}: "
              f"{ms:7.2f} simulated ms{mark}")
    if draw:
        _, spans = simulated_loop(host_ms, kernel_ms, steps, item_every_step)
        plot_timeline(spans, title=".item() every step: the host waits for each kernel" if item_every_step
                      else "sum on the device: host work and kernels overlap")
    return times


@dataclass(frozen=True)
class Slider:
    """One control of a panel: a number between ``low`` and ``high`` (a whole number when all three are ints),
    or a checkbox when ``default`` is a bool."""

    default: float | bool
    low: float = 0
    high: float = 1
    step: float | None = None
    description: str = ""
    log: bool = False  # a slider on a log scale (powers of ten between low and high, which must be > 0)


class SliderPanel:
    """Controls that call a model again, into their own output area, whenever one of them moves."""

    def __init__(self, box: Any, controls: dict[str, Any]) -> None:
        self.box = box  # the ipywidgets VBox: the controls, then the output area
        self.controls = controls  # name -> slider or checkbox
        self.last: object = None  # what the model returned when a control last moved


def slider_panel(model: Callable[..., object], **controls: Slider) -> SliderPanel | None:
    """Return a panel of ``controls`` (ipywidgets sliders and checkboxes) that calls ``model(**values)`` again
    whenever one moves; None where ipywidgets is not installed."""
    try:
        import ipywidgets
    except ImportError:
        return None
    widgets: dict[str, Any] = {}
    for name, control in controls.items():
        label = control.description or name
        if isinstance(control.default, bool):
            widgets[name] = ipywidgets.Checkbox(value=control.default, description=label)
        elif control.log:
            widgets[name] = ipywidgets.FloatLogSlider(value=control.default, base=10, min=math.log10(control.low),
                                                      max=math.log10(control.high), step=control.step or 0.1,
                                                      description=label)
        elif all(isinstance(v, int) for v in (control.default, control.low, control.high)):
            widgets[name] = ipywidgets.IntSlider(value=int(control.default), min=int(control.low),
                                                 max=int(control.high), step=int(control.step or 1),
                                                 description=label)
        else:
            widgets[name] = ipywidgets.FloatSlider(value=control.default, min=control.low, max=control.high,
                                                   step=control.step or (control.high - control.low) / 100,
                                                   description=label)
    output = ipywidgets.Output()
    panel = SliderPanel(ipywidgets.VBox([*widgets.values(), output]), widgets)

    def redraw(_change: object = None) -> None:
        import matplotlib.pyplot as plt

        output.clear_output(wait=True)
        with output:
            panel.last = model(**{name: widget.value for name, widget in widgets.items()})
            plt.show()

    for widget in widgets.values():
        widget.observe(redraw, names="value")
    return panel


def show_panel(panel: SliderPanel | None,
               text: str = "Sliders: move one to redraw the model above with new settings.") -> None:
    """Display ``panel`` with a fixed plain-text form (the same on ipywidgets 7 and 8, so stored outputs hold),
    or say how to get sliders where ipywidgets is missing."""
    from IPython.display import display

    if panel is None:
        print("(sliders need ipywidgets: pip install ipywidgets)")
        return
    view = {"version_major": 2, "version_minor": 0, "model_id": panel.box.model_id}
    display({"text/plain": text, "application/vnd.jupyter.widget-view+json": view}, raw=True)
