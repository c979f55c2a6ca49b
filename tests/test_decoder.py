"""Notebook 08's lesson helpers: the tiny numpy decoder and its KV cache, and the lesson-08 checkers."""

from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_info

from infergraph_lite import simulate_llm
from infergraph_lite.exercises import lesson08
from infergraph_lite.lessons.decoder import (
    MODEL_SHAPES,
    BatchKVCache,
    TinyDecoder,
    kv_bytes_per_token,
    kv_cache_bytes,
    time_decode_step,
)


@pytest.fixture(scope="module")
def model() -> TinyDecoder:
    return TinyDecoder(seed=3, dtype=np.float64)


def test_cached_decoding_gives_the_logits_of_recomputing_everything(model: TinyDecoder):
    rng = np.random.default_rng(0)
    for _ in range(3):
        tokens = rng.integers(0, model.vocab, 12).tolist()
        logits, cache = model.prefill(tokens[:5])
        for k in range(5, len(tokens)):
            np.testing.assert_allclose(logits, model.logits_without_cache(tokens[:k]), rtol=1e-9, atol=1e-9)
            logits = model.decode(tokens[k], cache)
        assert cache.length == len(tokens)


def test_the_cache_holds_the_formulas_bytes_and_the_cache_saves_the_quadratic_work(model: TinyDecoder):
    _, cache = model.prefill([1, 2, 3])
    assert cache.nbytes == 3 * model.kv_bytes_per_token == 3 * 2 * 4 * 4 * 32 * 8
    model.rows_computed = 0
    model.generate([1, 2, 3], 10, use_cache=True)
    assert model.rows_computed == 3 + 10 - 1
    model.rows_computed = 0
    model.generate([1, 2, 3], 10, use_cache=False)
    assert model.rows_computed == sum(range(3, 13))


def test_a_batched_decode_step_gives_each_sequences_own_logits_and_fills_each_cache(model: TinyDecoder):
    rng = np.random.default_rng(1)
    prompts = rng.integers(0, model.vocab, (5, 7)).tolist()
    caches = [model.prefill(p, capacity=10)[1] for p in prompts]
    batch = BatchKVCache.stack(caches)
    assert (batch.batch, batch.capacity, batch.length) == (5, 10, 7)
    for step in range(3):
        tokens = rng.integers(0, model.vocab, 5).tolist()
        model.rows_computed = 0
        logits = model.decode_batch(tokens, batch)
        assert model.rows_computed == 5 and batch.length == 8 + step
        for b, cache in enumerate(caches):
            np.testing.assert_allclose(logits[b], model.decode(tokens[b], cache), rtol=1e-9, atol=1e-9)
            np.testing.assert_allclose(batch.keys[:, b, :, : batch.length], cache.keys[:, :, : cache.length])


@pytest.mark.parametrize(("call", "message"), [
    (lambda m, c: m.decode_batch([1, 2], c), r"one token id per sequence of the batch \(3\)"),
    (lambda m, c: m.decode_batch([1, 2, m.vocab], c), r"token ids must lie in \[0, 256\)"),
    (lambda m, c: BatchKVCache.stack([]), "at least one cache"),
    (lambda m, c: BatchKVCache.stack([m.prefill([1])[1], m.prefill([1, 2])[1]]), r"lengths \[1, 2\]"),
    (lambda m, c: BatchKVCache.stack([m.prefill([1, 2])[1]], capacity=1), "capacity 1 is below the 2 tokens"),
])
def test_bad_batch_input_is_refused_by_name(model: TinyDecoder, call, message: str):
    cache = BatchKVCache.stack([model.prefill([1, 2], capacity=3)[1]] * 3)
    with pytest.raises(ValueError, match=message):
        call(model, cache)


def test_a_full_batch_cache_is_refused(model: TinyDecoder):
    cache = BatchKVCache.stack([model.prefill([1, 2], capacity=2)[1]] * 2)
    with pytest.raises(ValueError, match="the cache holds 2 tokens; 3 do not fit"):
        model.decode_batch([1, 2], cache)


def test_time_decode_step_times_every_batch_size_and_restores_the_blas_threads():
    before = [info["num_threads"] for info in threadpool_info()]
    times = time_decode_step(TinyDecoder(seed=0), batch_sizes=(1, 3), context=4, repeats=2)
    assert times.batch.tolist() == [1, 3] and (times.context, times.repeats) == (4, 2)
    assert np.all(times.seconds > 0) and np.allclose(times.per_token, times.seconds / [1, 3])
    assert [info["num_threads"] for info in threadpool_info()] == before
    for kwargs, message in [(dict(batch_sizes=()), "at least one batch size"), (dict(batch_sizes=(0,)), "batch size"),
                            (dict(repeats=0), "repeats"), (dict(blas_threads=0), "blas_threads")]:
        with pytest.raises(ValueError, match=message):
            time_decode_step(TinyDecoder(seed=0), **kwargs)


def test_published_shapes():
    assert kv_bytes_per_token(**MODEL_SHAPES["Llama-2-7B"]) == 512 * 1024
    assert kv_bytes_per_token(**MODEL_SHAPES["Llama-3-8B"]) == 128 * 1024
    assert kv_cache_bytes(0, **MODEL_SHAPES["Llama-3-8B"]) == 0


@pytest.mark.parametrize(("call", "message"), [
    (lambda m: m.prefill([]), "non-empty"),
    (lambda m: m.prefill([m.vocab]), r"token ids must lie in \[0, 256\)"),
    (lambda m: m.decode(1, m.prefill([1, 2], capacity=2)[1]), "the cache holds 2 tokens; 3 do not fit"),
    (lambda m: m.generate([1], 0), "n_new must be an integer >= 1"),
    (lambda m: kv_bytes_per_token(layers=2, kv_heads=2, head_dim=8, bytes_per_value=0), "bytes_per_value"),
    (lambda m: kv_cache_bytes(-1, layers=1, kv_heads=1, head_dim=1), "tokens must be an integer >= 0"),
])
def test_bad_input_is_refused_by_name(model: TinyDecoder, call, message: str):
    with pytest.raises(ValueError, match=message):
        call(model)


def _kv(model, tokens):
    head_dim = model["hidden"] // model["heads"]
    return 2 * model["layers"] * model["kv_heads"] * head_dim * model["bytes_per_value"] * tokens


def test_kv_checker_accepts_the_formula_and_names_each_plausible_mistake():
    assert lesson08.check_kv_cache_bytes(_kv).passed
    for wrong, says in [(lambda m, t: _kv(m, t) / 2, "key AND a value"),
                        (lambda m, t: _kv(m, t) * m["heads"] / m["kv_heads"], "query heads"),
                        (lambda m, t: _kv(m, t) / m["bytes_per_value"], "bytes_per_value"),
                        (lambda m, t: _kv(m, t) + 1, "expected")]:
        feedback = lesson08.check_kv_cache_bytes(wrong)
        assert feedback.status == "wrong" and says in feedback.message


def test_chunk_budget_checker_wants_the_largest_budget_that_meets_the_target():
    exact = lambda target: int((1000 * target - 15.0) / 0.07)   # noqa: E731 - a step of C tokens: 15 + 0.07 C ms
    assert lesson08.check_chunk_budget(exact).passed
    assert "still meets it" in lesson08.check_chunk_budget(lambda t: exact(t) - 16).message   # forgot decode tokens
    assert "too large" in lesson08.check_chunk_budget(lambda t: int(1000 * t / 0.07)).message  # forgot the 15 ms


def _goodput(max_num_seqs, ttft=True, tpot=True, nan_meets=True, per_second=True):
    r = simulate_llm(**lesson08.GOODPUT_WORKLOAD, max_num_seqs=max_num_seqs)
    met = np.ones(len(r.ttft), bool)
    if ttft:
        met &= r.ttft <= lesson08.TTFT_TARGET
    if tpot:
        met &= (np.nan_to_num(r.tpot, nan=0.0) if nan_meets else r.tpot) <= lesson08.TPOT_TARGET
    return met.sum() / r.makespan if per_second else met.mean()


def test_goodput_checker_wants_both_slos_and_names_each_plausible_mistake():
    best = max(lesson08.SLOT_CANDIDATES, key=_goodput)
    assert lesson08.check_goodput_slots(_goodput, best).passed
    for wrong, says in [(lambda s: _goodput(s, ttft=False), "miss the TTFT SLO"),
                        (lambda s: _goodput(s, tpot=False), "miss the TPOT SLO"),
                        (lambda s: _goodput(s, ttft=False, tpot=False), "throughput of every request"),
                        (lambda s: _goodput(s, nan_meets=False), "one-token answer"),
                        (lambda s: _goodput(s, per_second=False), "goodput is a rate"),
                        (lambda s: 1.01 * _goodput(s), "expected")]:
        feedback = lesson08.check_goodput_slots(wrong, best)
        assert feedback.status == "wrong" and says in feedback.message, feedback.message


def test_the_goodput_workload_is_sustainable_and_the_slo_pair_decides_the_best_slot_count():
    # At the offered load the best slot count serves most requests within both SLOs, with a median e2e of about a
    # second; the TPOT SLO alone (ignoring queueing) would pick fewer slots, and the checker names that mistake.
    table = {s: _goodput(s) for s in lesson08.SLOT_CANDIDATES}
    best = max(table, key=table.get)
    r = simulate_llm(**lesson08.GOODPUT_WORKLOAD, max_num_seqs=best)
    assert np.median(r.e2e) < 1.5 and _goodput(best, per_second=False) > 0.8
    tpot_only = max(lesson08.SLOT_CANDIDATES, key=lambda s: _goodput(s, ttft=False))
    assert tpot_only < best
    feedback = lesson08.check_goodput_slots(_goodput, tpot_only)
    assert feedback.status == "wrong" and "miss the TTFT SLO" in feedback.message
    assert table[best] > 1.03 * max(v for s, v in table.items() if s != best)
