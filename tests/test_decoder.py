"""Notebook 08's lesson helpers: the tiny numpy decoder and its KV cache, and the lesson-08 checkers."""

from __future__ import annotations

import numpy as np
import pytest

from infergraph_lite.exercises import lesson08
from infergraph_lite.lessons.decoder import MODEL_SHAPES, TinyDecoder, kv_bytes_per_token, kv_cache_bytes


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
