"""d2l_ext.commcost: the ring all-reduce's sums and bytes, the cost model's arithmetic, the fit, bad input."""

from __future__ import annotations

import queue
import threading

import pytest
import torch

from d2l_ext import commcost


def run_ring(world_size: int, numel: int) -> tuple[list[torch.Tensor], list[torch.Tensor], list[int]]:
    """Run ring_all_reduce on ``world_size`` threads joined by queues; return inputs, results, bytes sent."""
    torch.manual_seed(world_size)
    inputs = [torch.randn(numel) for _ in range(world_size)]
    results = [x.clone() for x in inputs]
    links = {(a, b): queue.Queue() for a in range(world_size) for b in range(world_size)}
    sent = [0] * world_size
    errors = []

    def rank_main(rank: int) -> None:
        def exchange(outgoing, to, incoming, source):
            links[rank, to].put(outgoing.clone())
            incoming.copy_(links[source, rank].get(timeout=10))

        try:
            sent[rank] = commcost.ring_all_reduce(results[rank], rank, world_size, exchange)
        except Exception as error:  # reported below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    return inputs, results, sent


def test_a_tensor_that_does_not_divide_is_summed_in_uneven_chunks():
    inputs, results, sent = run_ring(3, 10)  # chunks of 4, 3 and 3 numbers
    for result in results:
        torch.testing.assert_close(result, torch.stack(inputs).sum(0))
    assert sum(sent) == 2 * 2 * 10 * 4  # each chunk is sent twice round the ring, 2 x (n - 1) sends of each


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_the_ring_sums_and_each_rank_sends_exactly_2_n_minus_1_over_n_of_the_bytes(world_size):
    numel = 12 * 5
    inputs, results, sent = run_ring(world_size, numel)
    total = torch.stack(inputs).sum(0)
    for result in results:
        torch.testing.assert_close(result, total)
    size = numel * 4
    assert sent == [2 * (world_size - 1) * size // world_size] * world_size
    assert sent[0] == commcost.bytes_sent_per_rank("all_reduce", world_size, size)


def test_bus_bandwidth_is_algorithm_bandwidth_times_the_bus_factor():
    algbw, busbw = commcost.algbw_busbw("all_reduce", 4, 8e6, 0.002)
    assert (algbw, busbw) == (4e9, 6e9)  # 2(4 - 1)/4 = 1.5
    assert commcost.algbw_busbw("all_gather", 8, 8e6, 0.002)[1] == 3.5e9  # (8 - 1)/8


def test_the_model_adds_latency_per_step_and_bytes_over_bandwidth():
    assert commcost.collective_seconds("all_reduce", 2, 1e6, alpha=1e-5, beta=1e9) == pytest.approx(2e-5 + 1e-3)
    assert commcost.ring_steps("reduce_scatter", 4) == 3


def test_the_fit_recovers_the_parameters_that_made_the_times():
    sizes = [2**k for k in range(10, 27, 2)]
    times = [commcost.collective_seconds("all_gather", 2, s, alpha=5e-5, beta=2e9) for s in sizes]
    alpha, beta = commcost.fit_alpha_beta("all_gather", 2, sizes, times)
    assert alpha == pytest.approx(5e-5, rel=1e-9)
    assert beta == pytest.approx(2e9, rel=1e-9)


def test_a_negative_latency_is_refitted_through_zero():
    sizes, times = [1e3, 1e6, 2e6], [1e-7, 1e-3, 2.1e-3]
    alpha, beta = commcost.fit_alpha_beta("all_reduce", 2, sizes, times)
    assert alpha == 0.0 and beta > 0


def test_exposed_communication_is_what_computation_does_not_cover():
    assert commcost.exposed_seconds([3.0, 1.0, 2.5], [2.0, 2.0, 2.5]) == [1.0, 0.0, 0.0]


@pytest.mark.parametrize("call, message", [
    (lambda: commcost.fit_alpha_beta("all_reduce", 2, [1e6], [1e-3]), "at least 2 distinct sizes"),
    (lambda: commcost.fit_alpha_beta("all_reduce", 2, [1e6, 2e6], [2e-3, 1e-3]), "do not grow"),
    (lambda: commcost.bytes_sent_per_rank("gather", 2, 8), "all_reduce, all_gather"),
    (lambda: commcost.bytes_sent_per_rank("all_reduce", 1, 8), "at least 2 ranks"),
    (lambda: commcost.bytes_sent_per_rank("all_reduce", 2, 0), "must be positive"),
    (lambda: commcost.ring_all_reduce(torch.zeros(4), 2, 2, print), "a rank among them"),
])
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def exposed_by_recurrence(compute: list[float], comm: list[float]) -> float:
    """One bucket per layer, by hand: all-reduce k starts when layer k's backward and all-reduce k - 1 are done."""
    backward_end = comm_end = 0.0
    for work, talk in zip(compute, comm, strict=True):
        backward_end += work
        comm_end = max(backward_end, comm_end) + talk
    return comm_end - backward_end


@pytest.mark.parametrize("compute, comm", [
    ([4.0, 4.0, 4.0], [1.0, 1.0, 1.0]),  # hidden but the last
    ([2.0, 2.0, 2.0, 2.0], [3.0, 3.0, 3.0, 3.0]),  # a backlog builds up
    ([1.0], [5.0]),  # one bucket: nothing to hide behind
])
def test_the_exposed_communication_is_what_the_schedule_says_exactly(compute, comm):
    exposed = commcost.exposed_after_backward(compute, [1] * len(compute), comm)
    assert exposed == exposed_by_recurrence(compute, comm)


def test_without_a_backlog_only_the_last_bucket_is_exposed():
    compute, comm = [4.0, 2.0, 3.0], [1.0, 1.0, 2.0]
    assert commcost.exposed_seconds(comm[:-1], compute[1:]) == [0.0, 0.0]  # each hides behind the next backward
    assert commcost.exposed_after_backward(compute, [1, 1, 1], comm) == comm[-1]
    assert commcost.exposed_after_backward(compute, [3], [4.0]) == 4.0  # one bucket: all of it


@pytest.mark.parametrize("compute, comm", [
    ([4.0, 4.0, 4.0], [1.0, 1.0, 1.0]),
    ([2.0, 2.0, 2.0, 2.0], [3.0, 3.0, 3.0, 3.0]),
    ([1.0], [5.0]),
])
def test_the_simulated_device_exposes_what_the_schedule_says(compute, comm):
    buckets = [(f"all-reduce {k}", seconds, k) for k, seconds in enumerate(comm)]
    device = commcost.simulate_backward(compute, after=buckets)
    assert device.now() - sum(compute) == commcost.exposed_after_backward(compute, [1] * len(compute), comm)
    lanes = {span.lane for span in device.spans()}
    assert lanes == {"host", "compute", "comm"}


def test_fsdp_waits_for_the_first_all_gather_and_the_last_reduce_scatter_only_when_each_hides():
    # by hand: AG0 0-1; B0 1-3; AG1 1-2 (prefetched); RS0 3-4; B1 3-5; AG2 4-5; RS1 5-6; B2 5-7; RS2 7-8
    device = commcost.simulate_backward([2.0, 2.0, 2.0], after=[(f"RS{k}", 1.0, k) for k in range(3)],
                                        before=[(f"AG{k}", 1.0, k) for k in range(3)])
    spans = {span.name: (span.start, span.end) for span in device.spans() if span.lane != "host"}
    assert spans["backward 1"] == (3.0, 5.0) and spans["AG2"] == (4.0, 5.0) and spans["RS2"] == (7.0, 8.0)
    assert device.now() - 6.0 == 2.0  # exposed: the first all-gather and the last reduce-scatter


def test_a_collective_must_name_a_layer_of_the_pass():
    with pytest.raises(ValueError, match="layers 0 to 1"):
        commcost.simulate_backward([1.0, 1.0], after=[("all-reduce", 1.0, 2)])


def test_ddps_first_bucket_is_the_size_torch_uses():
    import torch.distributed as dist

    assert commcost.DDP_FIRST_BUCKET_BYTES == vars(dist)["_DEFAULT_FIRST_BUCKET_BYTES"]  # private in torch


def test_broadcast_sends_the_whole_tensor_so_its_busbw_is_its_algbw():
    assert commcost.ring_steps("broadcast", 4) == 3
    assert commcost.bytes_sent_per_rank("broadcast", 4, 1e6) == 1e6
    assert commcost.algbw_busbw("broadcast", 8, 8e6, 0.002) == (4e9, 4e9)
    sizes = [2**k for k in range(10, 23, 2)]
    times = [commcost.collective_seconds("broadcast", 2, s, alpha=3e-4, beta=5e8) for s in sizes]
    alpha, beta = commcost.fit_alpha_beta("broadcast", 2, sizes, times)
    assert (alpha, beta) == (pytest.approx(3e-4, rel=1e-9), pytest.approx(5e8, rel=1e-9))


@pytest.mark.parametrize("collective", commcost.COLLECTIVES)
def test_a_fit_to_noisy_times_never_gives_a_negative_latency_and_its_model_grows_with_the_size(collective):
    # chapter 10.5 fits noisy timings: whatever they are, the model it predicts with must be a cost (this was a
    # notebook cell, teaching review 3.7)
    generator = torch.Generator().manual_seed(0)
    sizes = [2**k for k in range(10, 23, 2)]
    for _ in range(20):
        noise = 1 + 0.5 * torch.rand(len(sizes), generator=generator)
        times = [commcost.collective_seconds(collective, 2, s, 3e-4, 4e8) * float(f)
                 for s, f in zip(sizes, noise, strict=True)]
        alpha, beta = commcost.fit_alpha_beta(collective, 2, sizes, times)
        assert alpha >= 0 and beta > 0
        model = [commcost.collective_seconds(collective, 2, s, alpha, beta) for s in (1e3, 1e6, 1e8)]
        assert model == sorted(model)
