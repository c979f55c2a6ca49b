"""lessons.llm_twin: a llama.cpp server's validation rows; the run's speed read from its own timings."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from infergraph_lite.lessons.llm_twin import LLMValidationRow, llm_validation_table, run_speed, validate_llm_server


def profile(p, s, kv):
    """A step of p prompt tokens and s decoding sequences: 1 ms + 0.1 ms per prompt token + 2 ms per sequence."""
    return 0.001 + 0.0001 * p + 0.002 * s


def answer(sent, done, prompt, tokens, prompt_ms, predicted_ms):
    return SimpleNamespace(sent_at=sent, done_at=done, prompt_tokens=prompt, n_tokens=tokens,
                           server_timings={"prompt_ms": prompt_ms, "predicted_ms": predicted_ms})


def test_run_speed_is_the_runs_own_steps_over_the_profiles_and_skips_a_prefill_that_shared_the_server():
    done = [answer(0.0, 1.0, 10, 5, prompt_ms=4.0, predicted_ms=4 * 4.5),   # prefill 2 ms in the profile: x2
            answer(0.5, 2.0, 10, 5, prompt_ms=9.0, predicted_ms=4 * 4.5),   # sent while the first ran: no prefill
            answer(3.0, 4.0, 30, 3, prompt_ms=8.0, predicted_ms=2 * 6.0)]   # prefill 4 ms: x2
    prefill, decode = run_speed(done, profile)
    assert prefill == pytest.approx(2.0)
    # per token 4.5 ms against the profile's one-sequence step of 1 + 2 = 3 ms (context does not count here): x1.5,
    # and 6 ms against 3 ms: x2; the median of 1.5, 1.5, 2
    assert decode == pytest.approx(1.5)


def test_validate_llm_server_takes_one_slot_servers_only_and_says_why_before_sending():
    eight = SimpleNamespace(n_parallel=8, client=lambda **kw: pytest.fail("nothing may be sent"))
    with pytest.raises(ValueError, match=r"8 slots.*one-slot server"):
        validate_llm_server(eight, profile, rates={0.5: 10.0}, n_requests=4, prompt_tokens=[16], output_tokens=8)
    with pytest.raises(ValueError, match=r"rates\[0.5\] must be > 0"):
        validate_llm_server(eight, profile, rates={0.5: 0.0}, n_requests=4, prompt_tokens=[16], output_tokens=8)


def test_the_table_shows_each_twins_signed_errors_per_metric():
    row = LLMValidationRow(0.3, {"ttft": (0.010, 0.030), "tpot": (0.002, 0.004)},
                           {"ttft": (0.008, 0.030), "tpot": (0.002, 0.005)},
                           {"ttft": (0.011, 0.027), "tpot": (0.0021, 0.004)})
    assert row.error("forecast", "ttft") == pytest.approx((-0.2, 0.0))
    line = llm_validation_table([row]).splitlines()[-1]
    assert line.startswith("0.30   10.0   30.0") and "-20 %" in line and "+25 %" in line and "+10 %" in line


def test_a_cache_fit_needs_a_run_that_hit_and_its_replay_of_a_one_request_pool_keeps_only_the_last_prompt():
    from infergraph_lite.lessons.prefix_twin import CacheFit, fit_cache_runs, replay_cache_run

    same = SimpleNamespace(prompt_evaluated=50, ttft=0.01,
                           server_timings={"prompt_ms": 5.0, "predicted_per_token_ms": 1})
    with pytest.raises(ValueError, match="hit nothing"):
        fit_cache_runs([same, same], [same, same])
    system = list(range(2, 42))                                   # a 40-token shared prefix
    prompts = [[1, *system, 100 + k, 200 + k] for k in range(4)]  # each with its own 2-token question
    done = [SimpleNamespace(sent_at=float(k)) for k in range(4)]
    fit = CacheFit(base=0.001, per_token=0.0001, decode=0.0005, overhead=0.0)
    held = [1, *system, 300, 301]                                 # the slot held another question's prompt
    r = replay_cache_run(done, prompts, fit, caching=True, held=held, slot_tokens=len(held) + 8)
    # as a slot: the held prompt's question is gone once another request took the memory; the prefix stays
    assert r.cached_tokens.tolist() == [0, 41, 41, 41, 41]
    off = replay_cache_run(done, prompts, fit, caching=False, held=held)
    assert off.cached_tokens.tolist() == [0] * 5 and off.ttft[1] > r.ttft[1]
