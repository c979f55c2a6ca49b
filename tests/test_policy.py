"""policy.py: one batching policy, and the simulator and the real batcher forming the same batches with it."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infergraph_lite.core.policy import AIMD, BatchPolicy
from infergraph_lite.serving.batcher import DynamicBatcher
from infergraph_lite.simulation.queue import simulate_batching


class VirtualClock:
    """Time that moves only when the test says so, so the real batcher's decisions are reproducible.

    The batcher's worker parks in :meth:`wait` (on the batcher's condition) or in :meth:`sleep` (inside the
    batch function); each park records the virtual time at which it wants to wake.  The driver waits until
    the worker is parked, then moves time to the next event (an arrival or the worker's wake-up) and wakes it.
    """

    def __init__(self) -> None:
        self.t = 0.0
        self.deadline = math.inf
        self.generation = 0          # bumped by the driver on every step
        self.parked_generation = -1  # the step the worker last parked in
        self.state = threading.Condition()
        self.batcher_condition: threading.Condition | None = None

    def now(self) -> float:
        return self.t

    def _park(self, deadline: float) -> int:
        with self.state:
            self.deadline = deadline
            self.parked_generation = self.generation
            self.state.notify_all()
            return self.generation

    def wait(self, condition: threading.Condition, timeout: float | None) -> None:
        # Called by the worker holding `condition`: park until the driver's next step (or close()).
        self.batcher_condition = condition
        self._park(math.inf if timeout is None else self.t + timeout)
        condition.wait()

    def sleep(self, seconds: float) -> None:
        # Called by the batch function: occupy the worker until virtual time reaches now + seconds.
        end = self.t + seconds
        with self.state:
            while self.t < end:
                self.deadline = end
                self.parked_generation = self.generation
                self.state.notify_all()
                self.state.wait()

    def wait_until_parked(self) -> None:
        with self.state:
            assert self.state.wait_for(lambda: self.parked_generation == self.generation, timeout=10), "worker hung"

    def step(self, to: float) -> None:
        # Move time forward (never back) and wake the worker wherever it is parked.
        with self.state:
            self.t = max(self.t, to)
            self.generation += 1
            self.state.notify_all()
        if self.batcher_condition is not None:
            with self.batcher_condition:
                self.batcher_condition.notify_all()


def run_real_batcher(arrivals, s, max_batch_size, max_wait, window="oldest_request"):
    """Drive a real DynamicBatcher on a virtual clock through `arrivals`; return its batches."""
    clock = VirtualClock()

    def batch_fn(items):
        clock.sleep(s(len(items)))
        return items

    batcher = DynamicBatcher(batch_fn, max_batch_size, max_wait, clock=clock, window=window)
    futures = []
    clock.wait_until_parked()
    i = 0
    while i < len(arrivals):
        a = arrivals[i]
        while clock.deadline < a:  # the worker wakes (window ends, batch finishes) before this arrival
            clock.step(clock.deadline)
            clock.wait_until_parked()
        # Every request arriving at this instant is queued before the worker looks again, as in the
        # simulator, where a batch starting at t takes everything that has arrived by t.
        clock.t = max(clock.t, a)
        while i < len(arrivals) and arrivals[i] == a:
            futures.append(batcher.submit(i))
            i += 1
        clock.step(a)
        clock.wait_until_parked()
    while not all(f.done() for f in futures):
        assert math.isfinite(clock.deadline), "requests are waiting but the worker set no wake-up time"
        clock.step(clock.deadline)
        clock.wait_until_parked()
    batcher.close()
    assert [f.result() for f in futures] == list(range(len(arrivals)))
    return batcher.batches


# Service times are multiples of 0.001 and AIMD targets sit half-way between two of them: a batch that takes
# exactly the target is a tie that floating-point (a clock's end - start vs the simulator's s(b)) may break
# either way, and this test is about the policy, not about float rounding.
caps = st.one_of(st.none(), st.integers(1, 6), st.builds(
    AIMD, latency_target=st.floats(1.5, 4.0).map(lambda x: round(x, 3) + 0.0005), increase=st.integers(1, 2),
    decrease=st.sampled_from([0.25, 0.5]), cap=st.integers(1, 3), max_size=st.integers(3, 8)))


@settings(max_examples=60)
@given(
    gaps=st.lists(st.floats(0.0, 3.0), min_size=2, max_size=40),
    cap=caps,
    max_wait=st.sampled_from([0.0, 0.5, 1.7, 4.0]),
    alpha=st.floats(0.2, 2.0).map(lambda x: round(x, 3)),
    beta=st.floats(0.0, 0.6).map(lambda x: round(x, 3)),
    window=st.sampled_from(["oldest_request", "first_pick"]),
)
def test_real_batcher_on_a_virtual_clock_forms_the_simulators_batches(gaps, cap, max_wait, alpha, beta, window):
    arrivals = np.round(np.cumsum(gaps), 6)  # rounded: float sums must not depend on the order of addition
    def s(b):
        return alpha + beta * b

    sim = simulate_batching(None, s, cap, max_wait, arrivals=arrivals, warmup=0.0, allow_unstable=True,
                            window=window)
    real = run_real_batcher(arrivals.tolist(), s, cap, max_wait, window)
    assert [b.first for b in real] == sim.batches_first.tolist()
    assert [b.size for b in real] == sim.batches_size.tolist()
    np.testing.assert_allclose([b.start for b in real], sim.batches_start, rtol=0, atol=1e-9)


def test_virtual_clock_batches_match_on_a_hand_checked_trace():
    # cap 3, window 1.0, s(b) = 2: requests at 0, 0.2, 0.4 fill a batch at 0.4; 5.0 waits out its window alone
    # until 6.0; 6.5 and 6.6 arrive while it runs (6.0-8.0) and go together at 8.0.
    real = run_real_batcher([0.0, 0.2, 0.4, 5.0, 6.5, 6.6], lambda b: 2.0, 3, 1.0)
    assert [(b.first, b.size, b.start) for b in real] == [(0, 3, 0.4), (3, 1, 6.0), (4, 2, 8.0)]


def test_policy_accepts_numpy_integers_everywhere():
    policy = BatchPolicy(np.int64(16), np.float64(0.002))
    assert policy.cap == 16 and isinstance(policy.cap, int)
    with DynamicBatcher(lambda xs: xs, max_batch_size=np.int64(16), max_wait=0.001, replicas=np.int64(2)) as b:
        assert b.submit(1).result(timeout=5) == 1
    assert simulate_batching(0.5, 1.0, np.int64(4), n_requests=1000).batches_size.max() <= 4


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 0.0), "max_batch_size must be an integer >= 1, None or an AIMD, got 0"),
        ((True, 0.0), "max_batch_size must be an integer >= 1, None or an AIMD, got True"),
        ((2.5, 0.0), "max_batch_size must be an integer >= 1, None or an AIMD, got 2.5"),
        ((4, -1.0), "max_wait must be >= 0, got -1.0"),
        ((4, math.inf), "max_wait must be a finite number, got inf"),
        ((4, "1ms"), "max_wait must be a finite number, got '1ms'"),
    ],
)
def test_bad_policy_parameters_are_named(args, message):
    with pytest.raises(ValueError, match=message):
        BatchPolicy(*args)


def test_start_time_is_the_first_moment_the_server_is_free_and_the_batch_full_or_the_window_over():
    policy = BatchPolicy(4, max_wait=2.0)
    assert policy.start_time(free_at=0.0, oldest=1.0, full_at=math.inf) == 3.0   # the window ends
    assert policy.start_time(free_at=0.0, oldest=1.0, full_at=1.5) == 1.5        # full first
    assert policy.start_time(free_at=9.0, oldest=1.0, full_at=1.5) == 9.0        # the server is busy
    assert BatchPolicy(None).take(100) == 100 and BatchPolicy(8).take(3) == 3


def test_aimd_grows_only_after_full_batches_and_backs_off_after_slow_ones():
    policy = BatchPolicy(AIMD(latency_target=5.0, decrease=0.5, cap=4))
    policy.observe(1.0, batch_size=1)
    assert policy.cap == 4, "a batch smaller than the cap is no evidence that a bigger one would be fast enough"
    policy.observe(1.0, batch_size=4)
    assert policy.cap == 5
    policy.observe(6.0, batch_size=2)
    assert policy.cap == 2


def test_aimd_cap_stays_put_at_light_load_instead_of_drifting_to_max_size():
    # One request every 10 ms on average, a batch of one takes 1.1 ms: batches are almost always single, so
    # the cap grows only on the rare full ones.  (Growing after every fast batch took it to 4096.)
    r = simulate_batching(0.1, (1.0, 0.1), AIMD(latency_target=5.0), n_requests=5_000)
    assert r.batches_cap.max() <= 5 and np.mean(r.batches_size) < 1.2


def test_the_policy_keeps_its_own_copy_of_an_aimd():
    controller = AIMD(latency_target=5.0, cap=2)
    policy = BatchPolicy(controller)
    policy.observe(1.0, batch_size=2)
    assert policy.cap == 3 and controller.cap == 2
    assert policy.fresh().cap == 2


def test_rays_rule_starts_the_window_when_a_busy_server_picks_the_first_request():
    # cap 4, window 1.0, s(b) = 2: the first batch (0.0 alone) waits out its window until 1.0 and runs to 3.0;
    # 1.5 and 2.0 queue meanwhile.  Triton's rule sends them at 3.0 (1.5 has waited 1.5 > 1.0); Ray's picks
    # 1.5 at 3.0 and waits the whole window again, to 4.0, taking 3.8 too.  A full batch goes at once.
    trace = [0.0, 1.5, 2.0, 3.8]
    triton = run_real_batcher(trace, lambda b: 2.0, 4, 1.0)
    ray = run_real_batcher(trace, lambda b: 2.0, 4, 1.0, window="first_pick")
    assert [(b.first, b.size, b.start) for b in triton] == [(0, 1, 1.0), (1, 2, 3.0), (3, 1, 5.0)]
    assert [(b.first, b.size, b.start) for b in ray] == [(0, 1, 1.0), (1, 3, 4.0)]
    full = simulate_batching(None, 2.0, 2, 1.0, arrivals=[0.0, 1.5, 2.0], warmup=0.0,
                             window="first_pick", allow_unstable=True)
    assert full.batches_start.tolist() == [1.0, 3.0]   # two waiting at the pick: full, no window
    assert BatchPolicy(4, window="first_pick").fresh().window == "first_pick"
    with pytest.raises(ValueError, match="window must be one of"):
        BatchPolicy(4, 1.0, window="ray")


def test_aimd_learns_a_batch_when_it_finishes_on_every_replica():
    # Two replicas, AIMD from cap 1 with a 1.6 target, s(b) = 1 + 0.5 (b - 1), so batches of one take 1.0:
    # the batch at 0.0 finishes at 1.0, so the batch at 0.1 (on the other replica) still forms with cap 1;
    # the cap grows to 2 only at 1.0, where the next batch takes two.
    arrivals = [0.0, 0.1, 1.0, 1.0, 1.0]
    r = simulate_batching(None, lambda b: 1.0 + 0.5 * (b - 1), AIMD(latency_target=1.6, cap=1), 0.0,
                          arrivals=arrivals, warmup=0.0, replicas=2, allow_unstable=True)
    assert r.batches_cap.tolist()[:2] == [1, 1], "the second batch formed before the first finished"
    assert r.batches_start.tolist()[:3] == [0.0, 0.1, 1.0] and r.batches_size.tolist()[2] >= 2
