"""LLMMetrics: vLLM's definitions (TTFT, TPOT without the first token, every ITL, E2EL, throughputs, goodput),
checked by hand on small cases, against the simulator's own per-request arrays, and for its bad arguments."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infergraph_lite import LLMMetrics, simulate_llm
from infergraph_lite.core.llm_metrics import Summary


def test_each_metric_follows_vllms_definition_by_hand():
    # two requests sent at 0 s and 1 s; tokens (seconds since each was sent) and each stream's end
    m = LLMMetrics.from_token_times([[0.2, 0.3, 0.5], [0.4]], sent=[0.0, 1.0], e2el=[0.6, 0.45],
                                    percentiles=(50, 90))
    assert m.completed == 2 and m.output_tokens == 4
    assert m.duration == pytest.approx(1.45)                        # first send to the last stream's end
    assert m.ttft.mean == pytest.approx(0.3) and m.ttft.median == pytest.approx(0.3)
    assert m.tpot.mean == pytest.approx((0.6 - 0.2) / 2)           # (E2EL - TTFT) / (n - 1); a 1-token one has none
    assert sorted(m.itl.percentiles) == [50.0, 90.0]
    assert m.itl.mean == pytest.approx(0.15) and m.itl.p(90) == pytest.approx(np.percentile([0.1, 0.2], 90))
    assert m.e2el.mean == pytest.approx(0.525)
    assert m.request_throughput == pytest.approx(2 / 1.45) and m.output_throughput == pytest.approx(4 / 1.45)
    assert math.isnan(m.goodput) and m.good == 2, "no SLO: no goodput, every request counts as good"


def test_goodput_counts_the_requests_that_met_every_slo():
    times = [[0.1, 0.2, 0.3], [0.5, 0.55, 0.6], [0.1, 0.5, 0.6]]     # TTFT .1/.5/.1, longest gap .1/.05/.4
    m = LLMMetrics.from_token_times(times, duration=2.0, slo={"ttft": 0.2, "itl": 0.2})
    assert m.good == 1 and m.goodput == pytest.approx(0.5)
    assert LLMMetrics.from_token_times(times, duration=2.0, slo={"e2el": 0.6}).good == 3   # a bound is inclusive
    one_token = LLMMetrics.from_token_times([[0.1]], slo={"tpot": 0.01})
    assert one_token.good == 1, "a request with one token has no TPOT, so it cannot break a TPOT bound"


def test_the_simulators_record_agrees_with_its_own_arrays():
    r = simulate_llm(n_requests=40, prompt_tokens=32, output_tokens=[1 + i % 9 for i in range(40)],
                     arrivals=np.arange(40) * 0.02, step_time=lambda p, d, kv: 0.005 + 1e-4 * (p + d),
                     max_num_seqs=4, warmup=0.25)
    m = r.metrics(slo={"ttft": 0.05}, percentiles=(50, 99))
    assert m.completed == 30
    assert m.ttft.mean == pytest.approx(r.mean("ttft")) and m.ttft.p(99) == pytest.approx(r.percentile(99, "ttft"))
    assert m.tpot.mean == pytest.approx(r.mean("tpot")), "the simulator's TPOT is vLLM's"
    assert m.itl.p(99) == pytest.approx(r.percentile(99, "itl")) and m.e2el.p(50) == pytest.approx(r.percentile(50))
    assert m.good == int(np.sum(r.ttft[r.warmup:] <= 0.05))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.floats(0.001, 1.0), min_size=1, max_size=8), min_size=1, max_size=6))
def test_tpot_is_the_mean_gap_when_the_answer_ends_at_its_last_token(gaps_per_request):
    times = [np.cumsum(g) for g in gaps_per_request]
    m = LLMMetrics.from_token_times(times, percentiles=())
    per_request = [np.diff(t).mean() for t in times if len(t) > 1]
    assert m.tpot.mean == pytest.approx(np.mean(per_request)) if per_request else math.isnan(m.tpot.mean)
    assert m.output_tokens == sum(len(t) for t in times) and m.completed == len(times)
    assert m.good == len(times) and m.duration == pytest.approx(max(t[-1] for t in times))


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(token_times=[[]]), "at least one token"),
    (dict(token_times=[[0.1]], sent=[0.0, 1.0]), "one value per request"),
    (dict(token_times=[[0.1]], slo={"latency": 1.0}), "an SLO may bound"),
])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LLMMetrics.from_token_times(**kwargs)


def test_a_summary_names_a_percentile_it_did_not_compute():
    with pytest.raises(KeyError, match="was not computed"):
        Summary.of([1.0, 2.0], percentiles=(99,)).p(50)
    assert math.isnan(Summary.of([], percentiles=(99,)).p(99))
