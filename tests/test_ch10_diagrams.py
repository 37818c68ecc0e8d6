"""Chapter 10's drawings (d2l_ext.diagrams_perf): the alpha-beta figure draws the fit it is given, and the overlap
figure drops the host's lane and names every collective."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from d2l_ext import commcost, diagrams_perf  # noqa: E402


def test_the_fitted_line_is_the_model_at_every_measured_size():
    times = {"all_gather": [(1024, 3e-4), (1 << 20, 2e-3)]}
    fits = {"all_gather": (2.5e-4, 5e8)}
    rows = diagrams_perf.alpha_beta_lines(times, fits)["all_gather"]
    assert [(s, t) for s, t, _ in rows] == times["all_gather"]
    assert rows[1][2] == pytest.approx(2.5e-4 + (1 << 19) / 5e8)
    ax = diagrams_perf.plot_alpha_beta(times, fits)
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log") and len(ax.lines) == 2
    plt.close("all")


def test_the_overlap_figure_has_no_host_lane_and_names_each_collective():
    gather = [(f"all-gather {k}", 1e-3, k) for k in range(2)]
    scatter = [(f"reduce-scatter {k}", 1e-3, k) for k in range(2)]
    cases = {"DDP": commcost.simulate_backward([1e-3, 1e-3], [("all-reduce", 3e-3, 1)]),
             "FSDP": commcost.simulate_backward([0.05, 0.05], scatter, gather)}
    _, axes = plt.subplots(2, 1)
    labels = diagrams_perf.plot_overlap(cases, axes)
    assert labels == [["all-reduce"], ["AG 0", "AG 1", "RS 0", "RS 1"]]  # FSDP's are narrow: two letters
    for ax in axes:
        assert [t.get_text() for t in ax.get_yticklabels()] == ["simulated compute", "simulated comm"]
    plt.close("all")
