"""simulate_llm: exact cases from theory, conservation, errors, and a differential test against a plain reference.

The reference below is the same policy written the obvious way: every sequence an object, every step a loop
over all of them.  The simulator keeps decoding sequences' state implicit to be fast; the two must agree on
every request's every token time, step by step.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from infergraph_lite import LLMResult, simulate_llm
from infergraph_lite.frameworks.llamacpp.profile import slot_runs
from infergraph_lite.simulation.llm_theory import (
    continuous_gain,
    expected_max_length,
    one_slot_mean_latency,
    static_offline_makespan,
)

# --- the reference: one object per sequence, one loop over all of them per step ---------------------------


class Seq:
    def __init__(self, i: int, prompt: int, output: int) -> None:
        self.i, self.prompt, self.output = i, prompt, output
        self.num_tokens, self.computed, self.generated, self.blocks = prompt, 0, 0, 0
        self.decoding = False
        self.times: list[float] = []


def reference(prompt, output, arrival, *, max_num_seqs, budget=math.inf, num_blocks=math.inf, block_size=16,
              reserve=None, chunked=True, prefill_first=False, static=False, step_time=lambda p, d, kv: 1.0):
    seqs = [Seq(i, p, o) for i, (p, o) in enumerate(zip(prompt, output))]
    n = len(seqs)
    waiting: deque[Seq] = deque()
    running: list[Seq] = []
    state = {"free": num_blocks, "preemptions": 0}
    now, nxt, done, steps = 0.0, 0, 0, []

    def want(s, ntok):
        return reserve[s.i] if reserve is not None else -(-(s.computed + ntok) // block_size)

    def alloc(s, ntok):
        need = want(s, ntok) - s.blocks
        if need > state["free"]:
            return False
        if need > 0:
            state["free"] -= need
            s.blocks += need
        return True

    def preempt(s, sched):
        running.remove(s)
        sched[:] = [(x, k) for x, k in sched if x is not s]
        state["free"] += s.blocks
        s.blocks, s.computed, s.decoding = 0, 0, False
        waiting.appendleft(s)
        state["preemptions"] += 1

    def admit(sched, left, whole):
        while waiting and len(running) < max_num_seqs and left > 0:
            s = waiting[0]
            ntok = s.num_tokens - s.computed
            if not whole:
                ntok = min(ntok, left)
            if ntok > left or not alloc(s, ntok):
                break
            waiting.popleft()
            running.append(s)
            sched.append((s, ntok))
            left -= ntok
        return left

    while done < n:
        if not running and not waiting:
            now = max(now, arrival[nxt])
        while nxt < n and arrival[nxt] <= now:
            waiting.append(seqs[nxt])
            nxt += 1
        sched: list[tuple[Seq, int]] = []
        left, preempted = budget, False
        prefill_step = False
        if static:
            if not running:
                while waiting and len(running) < max_num_seqs and alloc(waiting[0], waiting[0].num_tokens):
                    running.append(waiting.popleft())
        elif prefill_first:
            admit(sched, left, whole=True)
            prefill_step = bool(sched)
        if not prefill_step:
            for phase in (True, False):       # decodes first, then prefills, each in admission order
                k = 0
                while k < len(running):
                    s = running[k]
                    if s.decoding != phase or (not phase and left <= 0):
                        k += 1
                        continue
                    if not phase and not chunked and s.num_tokens - s.computed > left:
                        break
                    ntok = 1 if phase else min(s.num_tokens - s.computed, left)
                    ok = True
                    while not alloc(s, ntok):
                        victim = running[-1]
                        preempt(victim, sched)
                        preempted = True
                        if victim is s:
                            ok = False
                            break
                    if not ok:
                        continue              # s was the newest; nothing after it remains
                    sched.append((s, ntok))
                    left -= ntok
                    k += 1
            if not (static or prefill_first or preempted):
                admit(sched, left, whole=not chunked)
        decode = sum(1 for s, _ in sched if s.decoding)
        prefill = sum(k for s, k in sched if not s.decoding)
        for s, k in sched:
            s.computed += k
        kv = sum(s.computed for s in running)
        now += step_time(prefill, decode, kv)
        steps.append((now, prefill, decode, kv))
        for s, _ in sched:
            if s.computed == s.num_tokens:
                s.generated += 1
                s.num_tokens += 1
                s.times.append(now)
                s.decoding = True
                if s.generated == s.output:
                    running.remove(s)
                    state["free"] += s.blocks
                    s.blocks = 0
                    done += 1
    return seqs, steps, state["preemptions"]


def run_both(prompt, output, arrivals, *, step_time=1.0, **kw):
    r = simulate_llm(n_requests=len(prompt), prompt_tokens=prompt, output_tokens=output, arrivals=arrivals,
                     step_time=step_time, **kw)
    kv = kw.get("kv_cache_tokens")
    bs = kw.get("block_size", 16)
    reserve = None
    if kw.get("kv_allocation") == "reserve_max":
        longest = kw.get("max_tokens") or max(output)
        reserve = [-(-(p + longest) // bs) for p in prompt]
    budget = kw.get("max_num_batched_tokens")
    seqs, steps, preemptions = reference(
        prompt, output, list(arrivals), max_num_seqs=kw["max_num_seqs"],
        budget=math.inf if budget is None else budget, num_blocks=math.inf if kv is None else kv // bs,
        block_size=bs, reserve=reserve, chunked=kw.get("chunked_prefill", True),
        prefill_first=kw.get("prefill_first", False), static=kw.get("scheduling") == "static",
        step_time=step_time if callable(step_time) else (lambda p, d, k: step_time))
    return r, seqs, steps, preemptions


def assert_agree(r: LLMResult, seqs, steps, preemptions):
    assert r.preemptions == preemptions
    assert r.steps == len(steps)
    np.testing.assert_allclose(r.steps_end, [s[0] for s in steps], rtol=1e-12)
    assert r.steps_prefill_tokens.tolist() == [s[1] for s in steps]
    assert r.steps_decode_seqs.tolist() == [s[2] for s in steps]
    assert r.steps_kv_tokens.tolist() == [s[3] for s in steps]
    assert r.output_tokens.tolist() == [len(s.times) for s in seqs] == [s.output for s in seqs]
    np.testing.assert_allclose(r.first_token, [s.times[0] for s in seqs], rtol=1e-12)
    np.testing.assert_allclose(r.finish, [s.times[-1] for s in seqs], rtol=1e-12)
    gaps = [max(np.diff(s.times)) if len(s.times) > 1 else np.nan for s in seqs]
    np.testing.assert_allclose(r.max_itl, gaps, rtol=1e-12)
    for k, s in enumerate(seqs):                  # every token's time, not only the longest gap
        np.testing.assert_allclose(r.token_times(k), s.times, rtol=1e-12)
    np.testing.assert_allclose(r.itl(), np.concatenate([np.diff(s.times) for s in seqs]), rtol=1e-12)


# --- exact cases -------------------------------------------------------------------------------------------


def test_a_request_alone_takes_output_tokens_steps():
    r = simulate_llm(n_requests=3, prompt_tokens=[5, 50, 500], output_tokens=[1, 7, 30], step_time=0.5,
                     max_num_seqs=4, arrivals=[0.0, 100.0, 200.0])
    np.testing.assert_allclose(r.e2e, [0.5, 3.5, 15.0])
    np.testing.assert_allclose(r.ttft, [0.5, 0.5, 0.5])
    np.testing.assert_allclose(r.tpot, [np.nan, 0.5, 0.5])
    np.testing.assert_allclose(r.max_itl, [np.nan, 0.5, 0.5])


def test_tpot_is_each_requests_mean_itl_and_max_itl_its_longest_and_itl_pools_the_measured_gaps():
    rng = np.random.default_rng(3)
    n = 60
    r = simulate_llm(n_requests=n, prompt_tokens=rng.integers(1, 300, n), output_tokens=rng.integers(1, 40, n),
                     arrival_rate=20.0, step_time=lambda p, d, kv: 0.01 + 0.0002 * (p + d), max_num_seqs=8,
                     max_num_batched_tokens=64, warmup=0.25, response_overhead=0.002, seed=1)
    for k in range(n):
        times = r.token_times(k)
        assert len(times) == r.output_tokens[k]
        assert times[0] == r.first_token[k] and math.isclose(times[-1], r.finish[k] - 0.002)
        np.testing.assert_array_equal(r.itl(k), np.diff(times))
        if len(times) > 1:
            assert math.isclose(r.tpot[k], np.mean(np.diff(times))) and r.max_itl[k] == np.max(np.diff(times))
    pooled = np.concatenate([r.itl(k) for k in range(r.warmup, n)])
    np.testing.assert_array_equal(r.itl(), pooled)
    np.testing.assert_array_equal(r.measured("itl"), pooled)
    assert r.percentile(99, "itl") == np.percentile(pooled, 99) and r.mean("itl") == pooled.mean()
    np.testing.assert_array_equal(r.max_tbt, r.max_itl)       # TBT: the same gaps by another name
    assert r.percentile(99, "max_tbt") == r.percentile(99, "max_itl")
    for bad in (-1, n, 1.0, True):
        with pytest.raises(ValueError, match="request must be a request number"):
            r.token_times(bad)


def test_a_token_budget_bounds_every_gap_but_not_the_mean_time_per_token():
    # Streams decoding when a long prompt arrives: unchunked, one step holds the whole prefill; with a budget of
    # B tokens no step costs more than alpha + beta * B, so no gap does, while the stall's cost moves into TPOT.
    kw = dict(n_requests=9, prompt_tokens=[32] * 8 + [3000], output_tokens=[200] * 8 + [10],
              arrivals=[0.0] * 8 + [0.5], step_time=lambda p, d, kv: 0.015 + 0.0001 * (p + d), max_num_seqs=16)
    whole = simulate_llm(**kw, chunked_prefill=False, max_num_batched_tokens=4096)
    chunked = simulate_llm(**kw, max_num_batched_tokens=128)
    streams = np.concatenate([chunked.itl(k) for k in range(8)])
    assert streams.max() <= 0.015 + 0.0001 * 128 + 1e-12 < whole.max_itl[:8].max()
    assert chunked.tpot[:8].mean() >= whole.tpot[:8].mean()


def test_a_lone_requests_ttft_and_e2e_grow_by_exactly_the_overhead():
    kw = dict(n_requests=3, prompt_tokens=[5, 50, 500], output_tokens=[1, 7, 30], max_num_seqs=4,
              arrivals=[0.0, 100.0, 200.0], step_time=lambda p, d, kv: 0.5 + 0.001 * p)
    plain = simulate_llm(**kw)
    r = simulate_llm(**kw, request_overhead=0.004, response_overhead=0.0015)
    np.testing.assert_allclose(r.ttft, plain.ttft + 0.004, rtol=0, atol=1e-12)
    np.testing.assert_allclose(r.e2e, plain.e2e + 0.0055, rtol=0, atol=1e-12)
    np.testing.assert_allclose(r.tpot, plain.tpot, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(r.max_itl, plain.max_itl)
    assert (r.request_overhead, r.response_overhead) == (0.004, 0.0015)


def test_zero_overhead_changes_nothing_and_a_model_carries_its_own():
    kw = dict(n_requests=200, prompt_tokens=np.arange(200) % 40 + 1, output_tokens=np.arange(200) % 30 + 1,
              max_num_seqs=8, arrival_rate=60.0, kv_cache_tokens=160, max_num_batched_tokens=64)
    linear = lambda p, d, kv: 0.002 + 1e-4 * p + 5e-4 * d + 1e-6 * kv   # noqa: E731
    plain = simulate_llm(**kw, step_time=linear)
    zero = simulate_llm(**kw, step_time=linear, request_overhead=0.0, response_overhead=0.0)
    for name in ("first_token", "finish", "max_itl", "steps_end", "steps_kv_tokens"):
        np.testing.assert_array_equal(getattr(zero, name), getattr(plain, name))
    assert zero.preemptions == plain.preemptions > 0

    class Fitted:          # a fitted model names its overheads; simulate_llm takes them without wiring
        request_overhead, response_overhead = 0.003, 0.001

        def __call__(self, p, d, kv):
            return linear(p, d, kv)

    carried = simulate_llm(**kw, step_time=Fitted())
    wired = simulate_llm(**kw, step_time=linear, request_overhead=0.003, response_overhead=0.001)
    np.testing.assert_array_equal(carried.finish, wired.finish)
    np.testing.assert_array_equal(simulate_llm(**kw, step_time=Fitted(), request_overhead=0.0,
                                               response_overhead=0.0).finish, plain.finish)   # an argument wins


def test_request_overhead_is_an_arrival_shift_under_load():
    # Overhead before scheduling is the same run with every arrival later by it (it holds no engine step).
    rng = np.random.default_rng(5)
    n = 300
    prompt, output = rng.integers(1, 60, n), rng.integers(1, 50, n)
    arrivals = np.cumsum(rng.exponential(0.05, n))
    kw = dict(n_requests=n, prompt_tokens=prompt, output_tokens=output, max_num_seqs=6,
              step_time=lambda p, d, kv: 0.004 + 2e-4 * p + 1e-3 * d)
    shifted = simulate_llm(**kw, arrivals=arrivals + 0.007)
    r = simulate_llm(**kw, arrivals=arrivals, request_overhead=0.007)
    np.testing.assert_allclose(r.first_token, shifted.first_token, rtol=0, atol=1e-9)
    np.testing.assert_allclose(r.e2e, shifted.e2e + 0.007, rtol=0, atol=1e-9)


@pytest.mark.parametrize("lengths", ["fixed", "random"])
def test_one_slot_is_an_mg1_queue(lengths):
    # max_num_seqs=1: a request holds the engine for output_tokens steps, and the next starts at its end.
    rng = np.random.default_rng(3)
    n, step = 100_000, 0.01
    output = 20 if lengths == "fixed" else rng.integers(1, 40, n)    # uniform on 1..39, mean 20
    values = np.arange(1, 40) if lengths == "random" else 20
    rate = 0.6 / (20 * step)
    theory = one_slot_mean_latency(rate, values, step)
    r = simulate_llm(n_requests=n, prompt_tokens=8, output_tokens=output, step_time=step, max_num_seqs=1,
                     arrival_rate=rate, seed=1, warmup=0.05)
    assert r.mean() == pytest.approx(theory, rel=0.02)             # about 3 standard errors
    np.testing.assert_allclose(r.e2e - r.ttft, (r.output_tokens - 1) * step, atol=1e-9)   # served alone


def test_static_offline_makespan_is_the_sum_of_each_batchs_longest():
    rng = np.random.default_rng(0)
    output = rng.integers(1, 100, 1000)
    r = simulate_llm(n_requests=1000, prompt_tokens=rng.integers(1, 200, 1000), output_tokens=output,
                     step_time=0.02, max_num_seqs=16, scheduling="static")
    assert r.makespan == pytest.approx(static_offline_makespan(output, 16, 0.02), rel=1e-12)


@pytest.mark.parametrize("b", [4, 32])
def test_offline_continuous_over_static_gain_tends_to_expected_max_over_mean(b):
    rng = np.random.default_rng(1)
    n = 20_000
    output = rng.integers(1, 201, n)                              # uniform on 1..200
    runs = {s: simulate_llm(n_requests=n, prompt_tokens=16, output_tokens=output, step_time=1.0,
                            max_num_seqs=b, scheduling=s) for s in ("static", "continuous")}
    gain = runs["continuous"].throughput / runs["static"].throughput
    assert gain == pytest.approx(continuous_gain(np.arange(1, 201), b), rel=0.02)
    assert gain > 1.3


def test_expected_max_length_against_sampling():
    rng = np.random.default_rng(2)
    draws = rng.integers(1, 11, (200_000, 5)).max(axis=1)
    assert expected_max_length(np.arange(1, 11), 5) == pytest.approx(draws.mean(), rel=0.005)


# --- conservation ------------------------------------------------------------------------------------------


def test_every_request_gets_exactly_its_tokens_under_preemption():
    rng = np.random.default_rng(4)
    n = 3000
    prompt, output = rng.integers(1, 300, n), rng.integers(1, 300, n)
    r = simulate_llm(n_requests=n, prompt_tokens=prompt, output_tokens=output, step_time=0.01, max_num_seqs=32,
                     arrival_rate=500.0, kv_cache_tokens=4096, block_size=16, max_num_batched_tokens=512)
    assert r.preemptions > 100                    # the cache is small: the case under test happens
    assert r.output_tokens.tolist() == output.tolist()
    assert np.all(r.finish >= r.first_token) and np.all(r.first_token > r.arrival)
    # A token per decode, one per first prefill, and one per recompute of a preempted decoding sequence.
    assert r.steps_decode_seqs.sum() + n <= output.sum() <= r.steps_decode_seqs.sum() + n + r.preemptions
    # Everything a preempted sequence had computed is recomputed: prefill tokens >= the prompts.
    assert r.steps_prefill_tokens.sum() > prompt.sum()
    assert np.all(r.steps_kv_tokens <= r.steps_kv_slots) and np.all(r.steps_kv_slots <= 4096)
    assert r.steps_decode_seqs.max() <= 32 and np.all(r.steps_prefill_tokens + r.steps_decode_seqs <= 512)


def test_reserve_max_never_preempts_and_wastes_the_cache():
    rng = np.random.default_rng(5)
    n = 2000
    output = rng.integers(1, 256, n)
    kw = dict(n_requests=n, prompt_tokens=64, output_tokens=output, step_time=0.01, max_num_seqs=64,
              arrival_rate=300.0, kv_cache_tokens=16384)
    paged = simulate_llm(**kw)
    reserved = simulate_llm(**kw, kv_allocation="reserve_max")
    assert reserved.preemptions == 0 and reserved.output_tokens.tolist() == output.tolist()
    assert paged.kv_utilization > 0.9 > 0.6 > reserved.kv_utilization
    assert reserved.steps_decode_seqs.mean() < paged.steps_decode_seqs.mean()   # fewer fit at once
    assert reserved.mean() > paged.mean()


def test_prefill_first_stalls_decodes_and_decode_first_chunks_prefills():
    rng = np.random.default_rng(6)
    n = 3000
    kw = dict(n_requests=n, prompt_tokens=rng.integers(200, 1000, n), output_tokens=rng.integers(10, 200, n),
              step_time=lambda p, d, kv: 0.005 + 2e-5 * p + 1e-4 * d, max_num_seqs=32, arrival_rate=8.0,
              max_num_batched_tokens=1024)
    v1 = simulate_llm(**kw)
    v0 = simulate_llm(**kw, prefill_first=True)
    assert v0.percentile(99, "max_itl") > v1.percentile(99, "max_itl")
    assert v0.mean("ttft") < v1.mean("ttft")
    assert (v1.steps_prefill_tokens + v1.steps_decode_seqs).max() == 1024     # prefills chunked to fill the budget


# --- differential: the simulator against the reference, token by token -------------------------------------


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 10))
    prompt = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    output = draw(st.lists(st.integers(1, 25), min_size=n, max_size=n))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.0, 0.5, 1.0, 2.5, 7.0]), min_size=n, max_size=n))
    kw = dict(max_num_seqs=draw(st.integers(1, 5)), block_size=draw(st.sampled_from([1, 2, 4, 16])),
              scheduling=draw(st.sampled_from(["continuous", "continuous", "static"])),
              prefill_first=draw(st.booleans()), chunked_prefill=draw(st.booleans()),
              kv_allocation=draw(st.sampled_from(["paged", "paged", "reserve_max"])))
    bs = kw["block_size"]
    footprint = max(-(-(p + o - 1) // bs) for p, o in zip(prompt, output))
    if kw["kv_allocation"] == "reserve_max":
        footprint = max(-(-(p + max(output)) // bs) for p in prompt)
    if draw(st.booleans()):
        kw["kv_cache_tokens"] = bs * (footprint + draw(st.integers(0, 6)))
    if draw(st.booleans()):
        whole = kw["prefill_first"] or not kw["chunked_prefill"]
        limited = "kv_cache_tokens" in kw and kw["kv_allocation"] == "paged"
        low = max(kw["max_num_seqs"], max((p + o - 1) if limited else p for p, o in zip(prompt, output))
                  if whole else 1)
        kw["max_num_batched_tokens"] = draw(st.integers(low, low + 30))
    step = draw(st.sampled_from(["constant", "linear"]))
    kw["step_time"] = 1.0 if step == "constant" else (lambda p, d, kv: 0.25 + 0.01 * p + 0.05 * d + 0.001 * kv)
    return prompt, output, np.cumsum(gaps).tolist(), kw


@given(workloads())
def test_agrees_with_the_plain_reference_on_random_workloads(case):
    prompt, output, arrivals, kw = case
    assert_agree(*run_both(prompt, output, arrivals, **kw))


def test_agrees_with_the_reference_under_heavy_preemption():
    rng = np.random.default_rng(7)
    n = 300
    prompt, output = rng.integers(1, 60, n).tolist(), rng.integers(1, 80, n).tolist()
    arrivals = np.cumsum(rng.exponential(0.3, n)).tolist()
    for kw in [dict(kv_cache_tokens=160, block_size=8, max_num_seqs=8, max_num_batched_tokens=48),
               dict(kv_cache_tokens=160, block_size=4, max_num_seqs=6, prefill_first=True,
                    max_num_batched_tokens=160),
               dict(kv_cache_tokens=200, block_size=4, max_num_seqs=6, scheduling="static")]:
        r, seqs, steps, preemptions = run_both(prompt, output, arrivals, **kw)
        assert preemptions > 10
        assert_agree(r, seqs, steps, preemptions)


# --- errors name the argument, before anything runs ---------------------------------------------------------


@pytest.mark.parametrize("kw, message", [
    (dict(prompt_tokens=-3), "prompt_tokens must be whole numbers >= 1"),
    (dict(output_tokens=[4, 0, 4]), "output_tokens must be whole numbers >= 1"),
    (dict(output_tokens=[4, 4]), r"output_tokens must be an int or one value per request \(3\)"),
    (dict(prompt_tokens=2.5), "prompt_tokens must be whole numbers"),
    (dict(kv_cache_tokens=64), "kv_cache_tokens=64 .* cannot hold request 0"),
    (dict(max_num_batched_tokens=4), r"max_num_batched_tokens \(4\) must be >= max_num_seqs \(8\)"),
    (dict(max_num_batched_tokens=50, prefill_first=True), r"max_num_batched_tokens \(50\) is below the longest"),
    (dict(max_num_seqs=0), "max_num_seqs must be an integer >= 1"),
    (dict(step_time=0), "step_time must be > 0"),
    (dict(step_time=lambda p, d, kv: -1.0), r"step_time\(1, 0, 1\) must be > 0"),
    (dict(scheduling="orca"), "scheduling must be 'continuous' or 'static'"),
    (dict(kv_allocation="contiguous"), "kv_allocation must be 'paged' or 'reserve_max'"),
    (dict(arrivals=[1.0, 0.0, 2.0]), "arrivals must be finite, non-negative and sorted"),
    (dict(arrivals=[0.0, 1.0]), r"arrivals must hold one time per request \(3\)"),
    (dict(arrival_rate=-1.0), "arrival_rate must be > 0"),
    (dict(kv_allocation="reserve_max", max_tokens=10), r"max_tokens \(10\) is below the longest output_tokens"),
    (dict(warmup=1.0), r"warmup must be a fraction in \[0, 1\)"),
    (dict(request_overhead=-0.001), "request_overhead must be >= 0"),
    (dict(response_overhead=float("nan")), "response_overhead must be a finite number"),
    (dict(request_overhead="2 ms"), "request_overhead must be a finite number"),
    (dict(arrival_rate=5.0, seed=-1), "seed must be an integer >= 0"),
    (dict(arrival_rate=5.0, seed=1.5), "seed must be an integer >= 0"),
    (dict(n_requests=3.0), "n_requests must be an integer >= 1"),
])
def test_bad_input_names_the_argument(kw, message):
    args = dict(n_requests=3, prompt_tokens=100, output_tokens=20, step_time=0.01, max_num_seqs=8)
    with pytest.raises(ValueError, match=message):
        simulate_llm(**{**args, **kw})


def test_numpy_integers_are_taken_wherever_an_int_is():
    ints = dict(n_requests=40, prompt_tokens=100, output_tokens=20, max_num_seqs=4, arrival_rate=30, seed=3,
                max_num_batched_tokens=64, kv_cache_tokens=1024, block_size=16, kv_allocation="reserve_max",
                max_tokens=24)
    numpy = {k: np.int64(v) if isinstance(v, int) else v for k, v in ints.items()}
    numpy["output_tokens"] = np.full(40, 20, dtype=np.int32)
    a = simulate_llm(step_time=0.01, **ints)
    b = simulate_llm(step_time=np.float32(0.01), **numpy)
    assert np.allclose(a.e2e, b.e2e, rtol=1e-6) and a.preemptions == b.preemptions and a.steps == b.steps


def test_a_bad_overhead_carried_by_step_time_is_named_as_its_attribute():
    class Model:
        request_overhead = -1.0

        def __call__(self, p, d, kv):
            return 0.01

    with pytest.raises(ValueError, match=r"step_time.request_overhead must be >= 0"):
        simulate_llm(n_requests=2, prompt_tokens=4, output_tokens=2, step_time=Model(), max_num_seqs=2)


def test_summaries_leave_out_the_warmup_but_arrays_keep_every_request():
    r = simulate_llm(n_requests=100, prompt_tokens=8, output_tokens=np.arange(1, 101), step_time=1.0,
                     max_num_seqs=4, arrival_rate=0.05, warmup=0.5)
    assert len(r.e2e) == 100 and r.warmup == 50
    assert r.mean() == pytest.approx(r.e2e[50:].mean())
    assert r.percentile(50, "ttft") == pytest.approx(np.median(r.ttft[50:]))
    with pytest.raises(ValueError, match="of must be one of"):
        r.mean("latency")


def _one_slot_with_wake(arrivals, output, dt, wake, idle_after):
    # One slot, a constant step: each request runs alone, from max(its arrival, the previous finish); its first
    # step costs `wake` more when the engine had nothing to do for idle_after seconds before it (or at the start).
    finish, e2e, ttft, wakes = -math.inf, [], [], 0
    for a, k in zip(arrivals, output, strict=True):
        start = max(a, finish)
        extra = wake if start - finish >= idle_after else 0.0
        wakes += extra > 0
        ttft.append(start + dt + extra - a)
        finish = start + k * dt + extra
        e2e.append(finish - a)
    return np.array(ttft), np.array(e2e), wakes


@pytest.mark.parametrize("idle_after", [0.05, 0.3, 2.0])
def test_a_wake_cost_is_paid_exactly_by_steps_that_find_the_engine_idle(idle_after):
    rng = np.random.default_rng(7)
    arrivals = np.cumsum(rng.exponential(0.25, 200))
    output = rng.integers(1, 12, 200)
    r = simulate_llm(n_requests=200, prompt_tokens=16, output_tokens=output, step_time=0.01, max_num_seqs=1,
                     arrivals=arrivals, wake=0.004, idle_after=idle_after)
    ttft, e2e, wakes = _one_slot_with_wake(arrivals, output, 0.01, 0.004, idle_after)
    np.testing.assert_allclose(r.ttft, ttft, rtol=0, atol=1e-12)
    np.testing.assert_allclose(r.e2e, e2e, rtol=0, atol=1e-12)
    assert r.wakes == wakes and 0 < wakes < 200
    assert (r.wake, r.idle_after) == (0.004, idle_after)


def test_a_request_joining_a_busy_engine_pays_no_wake_and_zero_wake_changes_nothing():
    kw = dict(n_requests=3, prompt_tokens=16, output_tokens=10, step_time=0.01, max_num_seqs=4,
              arrivals=[0.0, 0.035, 5.0])
    plain = simulate_llm(**kw)
    woken = simulate_llm(**kw, wake=0.002, idle_after=0.1)
    # The first step and the one after 5 s idle pay it; the request joining at 35 ms finds a running engine.
    assert woken.wakes == 2
    np.testing.assert_allclose(woken.ttft - plain.ttft, [0.002, 0.002, 0.002], atol=1e-12)  # 2nd: its step later
    np.testing.assert_allclose(woken.e2e - plain.e2e, [0.002, 0.002, 0.002], atol=1e-12)
    # The third request's steps: later by its own wake only (the idle period absorbed the first one).
    np.testing.assert_allclose(woken.steps_end[-10:] - plain.steps_end[-10:], 0.002, atol=1e-12)
    zero = simulate_llm(**kw, wake=0.0, idle_after=0.1)
    np.testing.assert_array_equal(zero.finish, plain.finish)
    assert zero.wakes == plain.wakes == 0


def test_a_fitted_model_carries_its_wake_cost_and_an_argument_wins():
    class Fitted:
        request_overhead = response_overhead = 0.0
        wake, idle_after = 0.003, 0.2

        def __call__(self, p, d, kv):
            return 0.002 + 0.0001 * p + 0.001 * d

    kw = dict(n_requests=30, prompt_tokens=24, output_tokens=6, max_num_seqs=2, arrival_rate=3.0, seed=4)
    carried = simulate_llm(**kw, step_time=Fitted())
    wired = simulate_llm(**kw, step_time=Fitted().__call__, wake=0.003, idle_after=0.2)
    np.testing.assert_array_equal(carried.finish, wired.finish)
    assert carried.wakes > 0
    none = simulate_llm(**kw, step_time=Fitted(), wake=0.0)
    np.testing.assert_array_equal(none.finish, simulate_llm(**kw, step_time=Fitted().__call__).finish)


@pytest.mark.parametrize("kwargs, named", [
    (dict(wake=-0.001, idle_after=0.1), "wake"),
    (dict(wake=0.001, idle_after=0.0), "idle_after"),
    (dict(wake=0.001, idle_after=math.inf), "idle_after"),
    (dict(wake=0.001), "idle_after"),
    (dict(wake="3 ms", idle_after=0.1), "wake"),
])
def test_a_bad_wake_cost_is_named(kwargs, named):
    with pytest.raises(ValueError, match=named):
        simulate_llm(n_requests=2, prompt_tokens=4, output_tokens=2, step_time=0.01, max_num_seqs=1, **kwargs)


# --- slots with identities: llama.cpp's placement, and the micro-batches it makes ---------------------------

def _alone(prompts, gap=1.0):
    # Requests far apart: each runs alone, so each placement sees every earlier request released.
    return [gap * k for k in range(len(prompts))]


def test_lru_placement_takes_the_least_recently_released_slot_highest_first_on_a_tie():
    # Fresh slots were never used, a tie: llama.cpp's `t_last_used <= t_last` takes the last of them, then the
    # least recently released; requests one at a time so go round the slots downwards.
    r = simulate_llm(n_requests=10, prompt_tokens=16, output_tokens=4, step_time=0.01, max_num_seqs=8,
                     arrivals=_alone(range(10)), slot_placement="lru")
    assert r.slot.tolist() == [7, 6, 5, 4, 3, 2, 1, 0, 7, 6]


def test_prefix_placement_picks_the_slots_llama_cpp_picked_on_a_fresh_server():
    # The placements a fresh 4-slot llama.cpp server (this wheel's build) gave for prompt_of prompts, in the same
    # order (tests/test_llamacpp.py replays it on the real server): one at a time, three together, one at a time.
    first, together, again = [16, 20, 16, 28, 24], [24, 24, 24], [16, 20, 24, 28, 12]
    prompts = first + together + again
    arrivals = _alone(first) + [5.0] * 3 + [6.0 + k for k in range(len(again))]
    r = simulate_llm(n_requests=len(prompts), prompt_tokens=prompts, output_tokens=4, step_time=0.01,
                     max_num_seqs=4, arrivals=arrivals, slot_placement="prefix")
    # Only slot 3 ever holds a prompt, so every lone request finds it; of three together the first
    # takes it and the others the never-used slots, highest first; then each takes the lowest-numbered slot whose
    # prompt covers most of its own (12 and 16: any slot holding 16 or more, so the lowest).
    lone, together, lone_again = [3, 3, 3, 3, 3], [3, 2, 1], [1, 2, 3, 3, 1]
    assert r.slot.tolist() == [*lone, *together, *lone_again]


def test_prefix_placement_falls_back_to_lru_below_the_similarity_threshold():
    # Slot 0 holds a 4-token prompt: it covers a quarter of a 16-token one, under 0.5, so LRU picks a fresh slot.
    kw = dict(n_requests=1, prompt_tokens=16, output_tokens=2, step_time=0.01, max_num_seqs=2,
              slot_placement="prefix", slot_prompts=[4, 0])
    assert simulate_llm(**kw, slot_prompt_similarity=0.5).slot.tolist() == [1]
    assert simulate_llm(**kw, slot_prompt_similarity=0.2).slot.tolist() == [0]


def test_lru_ranks_slots_released_at_one_step_by_slot_number_and_never_used_ones_highest_first():
    # Four requests at once fill the four slots (highest first: never used) and all finish at the same step; llama.cpp
    # releases them in slot order, so slot 0 was released first and is the least recently used.
    r = simulate_llm(n_requests=6, prompt_tokens=16, output_tokens=4, step_time=0.01, max_num_seqs=4,
                     arrivals=[0.0] * 4 + [1.0, 2.0], slot_placement="lru")
    assert r.slot.tolist() == [3, 2, 1, 0, 0, 1]


def test_the_similarity_threshold_is_strict_and_zero_turns_the_prefix_search_off():
    # Slot 0 holds 4 tokens of a 16-token prompt: a similarity of exactly 0.25.  llama.cpp takes a slot only above
    # the threshold, and with a threshold of 0 skips the prefix search (pure LRU: the never-used slot 1).
    kw = dict(n_requests=1, prompt_tokens=16, output_tokens=2, step_time=0.01, max_num_seqs=2,
              slot_placement="prefix", slot_prompts=[4, 0])
    assert simulate_llm(**kw, slot_prompt_similarity=0.25).slot.tolist() == [1]
    assert simulate_llm(**kw, slot_prompt_similarity=0.24).slot.tolist() == [0]
    assert simulate_llm(**kw, slot_prompt_similarity=0).slot.tolist() == [1]


@pytest.mark.parametrize("mode", [{}, {"prefill_first": True}, {"scheduling": "static"},
                                  {"max_num_batched_tokens": 24}])
@pytest.mark.parametrize("placement", ["lru", "prefix"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_each_step_is_charged_the_micro_batches_of_the_slots_that_decode_in_it(placement, seed, mode):
    # Record what step_time was told, then rebuild it from the result: a request decodes in every step that ends
    # after its first token and no later than its last; the step's passes are the runs of those requests' slots,
    # plus one for a prefill beside them.
    rng = np.random.default_rng(seed)
    n, slots = 60, 8
    told = []

    def step(prefill, decode, kv, extra):
        told.append((prefill, decode, extra))
        return 0.01 + 0.002 * decode + 1e-4 * prefill + 0.003 * extra

    r = simulate_llm(n_requests=n, prompt_tokens=rng.integers(8, 40, n), output_tokens=rng.integers(1, 30, n),
                     step_time=step, max_num_seqs=slots, arrival_rate=30, seed=seed, slot_placement=placement, **mode)
    told = told[1:]                                       # the argument check's probe call
    assert len(told) == r.steps
    for k, end in enumerate(r.steps_end):
        decoding = np.flatnonzero((r.first_token < end - 1e-12) & (r.finish >= end - 1e-12))
        if r.steps_decode_seqs[k] == 0:
            decoding = decoding[:0]                       # a prefill-first step: the decoding sequences wait
        assert len(decoding) == r.steps_decode_seqs[k] == told[k][1]
        taken = r.slot[decoding].tolist()
        assert len(set(taken)) == len(taken), f"step {k}: two sequences in one slot"
        expected = max(0, slot_runs(taken) + (r.steps_prefill_tokens[k] > 0) - 1)
        assert told[k][2] == expected, f"step {k}: slots {sorted(taken)}"
    assert np.array_equal(r.output_tokens, r.output_tokens.clip(min=1))


def test_under_preemption_every_running_sequence_holds_one_slot_of_its_own_and_gets_its_tokens():
    # The engine itself, checked after every step: the busy slots are exactly the running sequences', one each,
    # and the decoding slots exactly the decoding sequences'.
    from infergraph_lite.simulation import llm_scheduler

    rng = np.random.default_rng(5)
    n = 80
    prompt, output = rng.integers(8, 40, n).tolist(), rng.integers(1, 60, n).tolist()
    arrival = np.cumsum(rng.exponential(1 / 50, n)).tolist()
    engine = llm_scheduler.LLMEngine(prompt, output, arrival, max_num_seqs=8, num_blocks=32, block_size=16,
                                     placement="prefix")
    checked = []

    def step(p, d, kv, extra):
        running = list(engine.running)
        busy = [s for s, b in enumerate(engine.slot_busy) if b]
        assert sorted(engine.slot[i] for i in running) == busy
        decoding = sorted(engine.slot[i] for i, is_decoding in engine.running.items() if is_decoding)
        assert decoding == [s for s, b in enumerate(engine.slot_decoding) if b]
        assert extra == max(0, (slot_runs(decoding) if engine.decode_step else 0) + (p > 0) - 1)
        checked.append(extra)
        return 0.01 + 0.003 * extra

    engine.run(step)
    assert engine.preemptions > 0 and len(checked) == len(engine.runs)
    assert engine.generated == output
    assert not any(engine.slot_busy)


def test_a_fitted_model_charges_random_slots_without_placement_and_fewer_passes_for_neighbours_with_it():
    from infergraph_lite.frameworks.llamacpp.profile import StepTimeModel

    model = StepTimeModel(a=0.004, b=0.001, c=2e-4, e=0.004, slots=8)
    kw = dict(n_requests=40, prompt_tokens=16, output_tokens=24, step_time=model, max_num_seqs=8, arrival_rate=20)
    random, placed = simulate_llm(**kw), simulate_llm(**kw, slot_placement="lru")
    assert random.slot is None and placed.slot is not None
    # Requests one after another go round the slots in order, so decoding neighbours share a micro-batch: fewer
    # passes than at random, shorter steps, lower latency.
    assert placed.mean("tpot") < random.mean("tpot")


@pytest.mark.parametrize("kwargs, named", [
    (dict(slot_placement="random"), "slot_placement"),
    (dict(slot_placement="lru", slot_prompt_similarity=1.5), "slot_prompt_similarity"),
    (dict(slot_placement="prefix", slot_prompts=[16, 16]), "slot_prompts"),
    (dict(slot_placement="prefix", slot_prompts=[16, -1, 0, 0]), "slot_prompts"),
    (dict(slot_prompts=[16, 16, 16, 16]), "slot_prompts needs slot_placement"),
    (dict(slot_prompt_similarity=0.5), "slot_prompt_similarity needs slot_placement"),
    (dict(slot_placement="lru", step_time=lambda p, d, kv, extra: 0.01, slot_prompt_similarity=True),
     "slot_prompt_similarity"),
    (dict(slot_placement="lru", step_time=lambda p, d, kv: 0.01), "fourth argument, extra_batches"),
])
def test_bad_slot_placement_arguments_are_named(kwargs, named):
    base = dict(n_requests=4, prompt_tokens=16, output_tokens=4, step_time=0.01, max_num_seqs=4)
    with pytest.raises(ValueError, match=named):
        simulate_llm(**{**base, **kwargs})
