"""d2l_ext.pipeline: pipeline schedules on a simulated clock, checked exactly against their closed forms."""

from __future__ import annotations

from fractions import Fraction

import pytest

from d2l_ext.pipeline import Op, schedule, simulate

TIMES = [(1, 2), (2, 3), (1, 1), (3, 1)]  # (t_f, t_b): the usual backward = 2 x forward, and others


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p", [2, 4, 8])
def test_gpipe_and_1f1b_take_m_plus_p_minus_1_slots(name, p):
    for m in range(1, 17):
        for t_f, t_b in TIMES:
            timeline = simulate(schedule(name, p, m), t_f, t_b)
            assert timeline.makespan == (m + p - 1) * (t_f + t_b), (m, t_f, t_b)
            # every rank works m (t_f + t_b) ticks of it: the rest is the bubble, (p - 1) / (m + p - 1)
            assert Fraction(timeline.bubble).limit_denominator(10**6) == Fraction(p - 1, m + p - 1)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_gpipe_holds_every_micro_batch_and_1f1b_at_most_p(p):
    for m in range(1, 17):
        gpipe, one_f_one_b = simulate(schedule("gpipe", p, m)), simulate(schedule("1f1b", p, m))
        assert [gpipe.in_flight(rank) for rank in range(p)] == [m] * p
        # rank r runs p - r - 1 forwards before its first backward, then holds one more: p - r, or m if fewer
        assert [one_f_one_b.in_flight(rank) for rank in range(p)] == [min(p - rank, m) for rank in range(p)]


@pytest.mark.parametrize("v", [2, 3])
@pytest.mark.parametrize("p", [2, 4, 8])
def test_interleaving_divides_the_bubble_by_v(p, v):
    for m in range(p, 17, p):
        for t_f, t_b in TIMES[:3]:  # per chunk: a v-th of a stage's work
            timeline = simulate(schedule("interleaved", p, m, v), t_f, t_b, v)
            assert timeline.makespan == (m * v + p - 1) * (t_f + t_b), (m, t_f, t_b)
            plain = simulate(schedule("1f1b", p, m), v * t_f, v * t_b)  # the same model, one chunk per rank
            idle, plain_idle = (t.makespan - m * v * (t_f + t_b) for t in (timeline, plain))
            assert idle * v == plain_idle


@pytest.mark.parametrize("p", [2, 4, 8])
def test_zero_bubble_h1_hides_the_weight_gradients_in_1f1b_bubbles(p):
    # the paper's assumption: computing the weights' gradients takes no longer than a forward or a backward
    for m in range(p, 17):
        for t_f, t_b, t_w in [(1, 1, 1), (2, 2, 1), (1, 2, 1), (3, 2, 2), (2, 3, 2)]:
            timeline = simulate(schedule("zb-h1", p, m), t_f, t_b, t_w=t_w)
            assert timeline.makespan == m * (t_f + t_b + t_w) + (p - 1) * (t_f + t_b - t_w), (m, t_f, t_b, t_w)
            one_f_one_b = simulate(schedule("1f1b", p, m), t_f, t_b + t_w)  # the same work, backward unsplit
            assert one_f_one_b.makespan - timeline.makespan == 2 * (p - 1) * t_w  # W off both ends
            # the inputs each W needs are held until it runs: p micro-batches on every rank, 1F1B's first rank's
            assert [timeline.in_flight(rank) for rank in range(p)] == [p] * p
            ops = sorted((slot.op for slot in timeline.lanes[p - 1]), key=repr)
            assert ops == sorted((Op(k, i) for k in "FBW" for i in range(m)), key=repr)


def test_each_rank_runs_each_operation_once_in_an_order_that_respects_the_data():
    timeline = simulate(schedule("interleaved", 4, 8, 2), 1, 2, v=2)
    for rank, lane in enumerate(timeline.lanes):
        ops = [slot.op for slot in lane]
        assert sorted(ops, key=repr) == sorted({Op(k, i, c) for k in "FB" for i in range(8) for c in range(2)},
                                               key=repr)
        assert all(a.end <= b.start for a, b in zip(lane, lane[1:], strict=False)), rank


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="8 is not a multiple of 3"):
        schedule("interleaved", 3, 8, 2)
    with pytest.raises(ValueError, match="unknown schedule 'zb'"):
        schedule("zb", 2, 4)
    with pytest.raises(ValueError, match="use 'interleaved' for v > 1"):
        schedule("1f1b", 2, 4, v=2)
    with pytest.raises(ValueError, match="zb-h1 needs at least as many micro-batches as stages: 3 < 4"):
        schedule("zb-h1", 4, 3)
    with pytest.raises(ValueError, match="at least 1"):
        schedule("gpipe", 0, 4)
    with pytest.raises(ValueError, match="deadlocks"):  # rank 0 waits for a backward that needs its forward
        simulate([[Op("B", 0), Op("F", 0)], [Op("F", 0), Op("B", 0)]])


def test_the_lanes_are_drawn_one_bar_per_operation(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from d2l_ext.pipeline import plot_schedule

    timeline = simulate(schedule("1f1b", 4, 8), 1, 2)
    ax = plot_schedule(timeline)
    assert len(ax.patches) == 4 * 2 * 8  # a bar for each F and B of each rank
    assert [label.get_text() for label in ax.get_yticklabels()] == ["rank 3", "rank 2", "rank 1", "rank 0"]
    assert ax.get_title() == "33 ticks, bubble 27.3%"  # (8 + 3) x 3 ticks; 3 / 11 idle
    ax.figure.savefig(tmp_path / "lanes.png")
