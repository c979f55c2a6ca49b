"""Checkers for the exercises of notebook 08, *Serving LLMs*: the KV cache, slots for goodput, a chunk budget.

>>> check_kv_cache_bytes(lambda model, tokens: 2 * model["layers"] * model["kv_heads"]
...                      * (model["hidden"] // model["heads"]) * model["bytes_per_value"] * tokens)
Correct: 2 x layers x KV heads x head size x bytes, per token.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from infergraph_lite.exercises.feedback import WrongAnswer, checker, require
from infergraph_lite.simulation.llm import simulate_llm

__all__ = ["CHUNK_SCENARIO", "GOODPUT_WORKLOAD", "SLOT_CANDIDATES", "TPOT_TARGET", "TTFT_TARGET", "check_chunk_budget",
           "check_conversations_that_fit", "check_goodput_slots", "check_goodput_table", "check_kv_cache_bytes",
           "check_ttft_cost", "chunk_stall", "goodput_of"]

# Exercise 8.1: models as a config file describes them (hidden size and query heads; the head size is hidden / heads).
_MODELS: dict[str, dict[str, int]] = {
    "Llama-2-7B": {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 32, "bytes_per_value": 2},
    "Llama-3-8B": {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "bytes_per_value": 2},
    "Llama-2-70B": {"layers": 80, "hidden": 8192, "heads": 64, "kv_heads": 8, "bytes_per_value": 2},
    "Mistral-7B, fp8 cache": {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "bytes_per_value": 1},
    "tiny": {"layers": 4, "hidden": 256, "heads": 8, "kv_heads": 4, "bytes_per_value": 2},
}


def _kv_bytes(model: Mapping[str, int], tokens: int) -> int:
    head_dim = model["hidden"] // model["heads"]
    return 2 * model["layers"] * model["kv_heads"] * head_dim * model["bytes_per_value"] * tokens


@checker
def check_kv_cache_bytes(kv_cache_bytes: Callable[[Mapping[str, int], int], float]) -> str:
    """Exercise 08.1: bytes of KV cache that ``tokens`` tokens of ``model`` hold."""
    cases = [(name, model, tokens) for name, model in _MODELS.items() for tokens in (1, 4096)]
    answers = [(name, model, tokens, kv_cache_bytes(dict(model), tokens), _kv_bytes(model, tokens))
               for name, model, tokens in cases]
    wrong = [a for a in answers if not math.isclose(a[3], a[4])]
    if not wrong:
        return "2 x layers x KV heads x head size x bytes, per token."

    def everywhere(factor: Callable[[Mapping[str, int]], float]) -> bool:
        return all(math.isclose(got, want * factor(model)) for _, model, _, got, want in answers)

    hint = "2 (a key and a value) x layers x KV heads x head size x bytes per value, times the tokens"
    if everywhere(lambda m: 0.5):
        hint = "you counted the keys or the values, not both: the cache holds a key AND a value"
    elif everywhere(lambda m: m["heads"] / m["kv_heads"]):
        hint = "you used the query heads; with grouped-query attention only the KV heads are cached"
    elif everywhere(lambda m: 1 / m["bytes_per_value"]):
        hint = "that counts values, not bytes: multiply by bytes_per_value"
    elif everywhere(lambda m: m["hidden"] // m["heads"]):
        hint = "you multiplied by the hidden size as well as the heads: head size = hidden / heads"
    name, _, tokens, got, want = wrong[0]
    raise WrongAnswer(f"for {name} and {tokens} tokens you said {got:,.0f} bytes, expected {want:,.0f}: {hint}")


# Exercise 8.2: the workload, the step time and the SLOs the learner's goodput uses.
TTFT_TARGET = 1.0     # seconds
TPOT_TARGET = 0.025   # seconds
SLOT_CANDIDATES = (1, 2, 4, 8, 12, 16, 24, 32, 64)
GOODPUT_WORKLOAD: dict[str, Any] = {
    "n_requests": 400,
    "prompt_tokens": np.random.default_rng(2).integers(64, 512, 400),
    "output_tokens": np.minimum(256, np.ceil(np.random.default_rng(1).exponential(64, 400))).astype(int),
    "step_time": lambda prefill, decode, kv: 0.010 + 0.0002 * (prefill + decode),
    "arrival_rate": 7.0,
    "seed": 0,
}


def goodput_of(max_num_seqs: int, ttft_target: float = TTFT_TARGET, tpot_target: float = TPOT_TARGET) -> float:
    """Requests per second that meet both SLOs (TTFT and TPOT; a one-token answer has no TPOT and meets that
    one), over the run's makespan: vLLM's ``--goodput``, DistServe's goodput at one offered rate.

    >>> round(goodput_of(12), 2)
    5.21
    """
    r = simulate_llm(**GOODPUT_WORKLOAD, max_num_seqs=max_num_seqs)
    met = (r.ttft <= ttft_target) & (np.nan_to_num(r.tpot, nan=0.0) <= tpot_target)
    return float(met.sum() / r.makespan)


def _goodput_mistakes(max_num_seqs: int) -> dict[str, float]:
    # What plausible wrong answers give for one slot count, each with the hint that names the mistake.
    r = simulate_llm(**GOODPUT_WORKLOAD, max_num_seqs=max_num_seqs)
    ttft_ok = r.ttft <= TTFT_TARGET
    tpot_ok = np.nan_to_num(r.tpot, nan=0.0) <= TPOT_TARGET
    both = ttft_ok & tpot_ok
    return {
        "you counted requests that miss the TTFT SLO: a request that waited too long for its first token is not "
        "good, however fast its tokens came after (count only those that meet both SLOs)": tpot_ok.sum() / r.makespan,
        "you counted requests that miss the TPOT SLO: count only those that meet both": ttft_ok.sum() / r.makespan,
        "you counted requests that meet either SLO: a good request meets both": (ttft_ok | tpot_ok).sum() / r.makespan,
        "that is the throughput of every request: goodput counts only those that meet both SLOs":
            len(r.ttft) / r.makespan,
        "a one-token answer has no TPOT (NaN) and must count as meeting the TPOT SLO (np.nan_to_num(r.tpot, "
        "nan=0.0)); a NaN compared with <= is False": (ttft_ok & (r.tpot <= TPOT_TARGET)).sum() / r.makespan,
        "goodput is a rate: divide the requests that meet both SLOs by the makespan (seconds), not by the number "
        "of requests": both.mean(),
    }


@checker
def check_goodput_slots(goodput: Callable[[int], float], best_slots: int | Callable[[], int]) -> str:
    """Exercise 08.2: the goodput of a slot count (TTFT and TPOT SLOs), and the candidate that maximises it."""
    table = {s: goodput_of(s) for s in SLOT_CANDIDATES}
    for s in (8, 12, 32):
        got = goodput(s)
        want = table[s]
        require(isinstance(got, (int, float, np.integer, np.floating)) and not isinstance(got, bool),
                f"goodput({s}) must return a number (requests per second), got {got!r}")
        if not math.isclose(got, want, rel_tol=1e-6):
            hint = "count the requests whose ttft <= TTFT_TARGET and whose tpot <= TPOT_TARGET, over the makespan"
            for mistake, value in _goodput_mistakes(s).items():
                if math.isclose(got, value, rel_tol=1e-6) and not math.isclose(value, want, rel_tol=1e-6):
                    hint = mistake
                    break
            raise WrongAnswer(f"goodput({s}) gave {got:.4g}, expected {want:.4g}: {hint}")
    best = best_slots() if callable(best_slots) else best_slots
    want_best = max(SLOT_CANDIDATES, key=lambda s: table[s])
    if best != want_best:
        tpot_only = max(SLOT_CANDIDATES, key=lambda s: goodput_of(s, ttft_target=math.inf))
        if best == tpot_only:
            raise WrongAnswer(f"{best} slots give the most requests within the TPOT SLO, but with so few slots "
                              "requests queue and miss the TTFT SLO: compare goodput with both SLOs")
        if best == max(SLOT_CANDIDATES):
            raise WrongAnswer(f"{best} slots maximise throughput, but their TPOT misses the SLO for many requests")
        raise WrongAnswer(f"{best} slots give a goodput of {table.get(best, float('nan')):.3g} req/s; another "
                          "candidate gives more (compare goodput over every candidate)")
    return (f"{want_best} slots: {table[want_best]:.2f} req/s meet both SLOs; fewer slots make requests queue past "
            "the TTFT SLO, more stretch every step past the TPOT SLO.")


# Exercise 8.3: notebook 08's long-prompt scenario, with its step profile (15 ms + 0.07 ms per token).
CHUNK_SCENARIO: dict[str, Any] = {
    "n_requests": 17,
    "prompt_tokens": [64] * 16 + [4000],
    "output_tokens": [400] * 16 + [50],
    "arrivals": [0.0] * 16 + [1.0],
    "step_time": lambda prefill, decode, kv: (15.0 + 0.07 * (prefill + decode)) / 1000,
    "max_num_seqs": 32,
}


def chunk_stall(budget: int) -> tuple[float, float]:
    """(the longest ITL of the 16 streams, the long prompt's TTFT) in seconds, for a token budget per step.

    >>> stall, ttft = chunk_stall(512)
    >>> round(1000 * stall, 1), round(1000 * ttft, 1)
    (50.8, 430.0)
    """
    r = simulate_llm(**CHUNK_SCENARIO, max_num_batched_tokens=budget)
    return float(np.max(r.max_itl[:16])), float(r.ttft[16])


@checker
def check_chunk_budget(largest_budget: Callable[[float], int]) -> str:
    """Exercise 08.3 (stretch): the largest token budget whose longest gap between tokens (max ITL) meets a target."""
    for target in (0.025, 0.04, 0.1):   # none falls on a whole token
        got = largest_budget(target)
        require(isinstance(got, (int, np.integer)) and got >= CHUNK_SCENARIO["max_num_seqs"],
                f"for a target of {1000 * target:g} ms return a whole number of tokens >= max_num_seqs (32), "
                f"got {got!r}")
        stall, _ = chunk_stall(int(got))
        require(stall <= target, f"for a target of {1000 * target:g} ms your budget {got} lets a stream wait "
                                 f"{1000 * stall:.1f} ms between tokens: too large")
        bigger, _ = chunk_stall(int(got) + 1)
        require(bigger > target, f"for a target of {1000 * target:g} ms a budget of {got + 1} still meets it "
                                 f"({1000 * bigger:.1f} ms): the largest is what you want, since every token less "
                                 "lengthens the long prompt's TTFT (the budget counts the decode tokens too)")
    return "the largest budget that meets each target; a step of that many tokens is just within the target."


@checker
def check_conversations_that_fit(conversations_that_fit: Callable[[float, int], int]) -> str:
    """Exercise 08.1, second part: whole Llama-3-8B conversations of ``tokens_each`` tokens in a cache of bytes."""
    model = _MODELS["Llama-3-8B"]
    for cache, tokens in ((40 * 2**30, 4096), (10 * 2**30, 1000), (2**20, 4096)):
        got = conversations_that_fit(cache, tokens)
        want = cache // _kv_bytes(model, tokens)
        require(got == want and float(got).is_integer(),
                f"{cache / 2**30:g} GiB and {tokens} tokens each: you said {got!r}, expected {want} "
                "(whole conversations: a part of one does not fit)")
    return "80 conversations of 4,096 tokens in 40 GiB: grouped-query attention makes it four times Llama-2's 20."


@checker
def check_goodput_table(goodput_table: Callable[[], tuple[list[int], list[float], list[float]]]) -> str:
    """Exercise 08.2, the plot's data: (slot counts, throughput, goodput) over SLOT_CANDIDATES."""
    slots, throughput, good = goodput_table()
    require(list(slots) == list(SLOT_CANDIDATES), f"use the slot counts {list(SLOT_CANDIDATES)}, got {list(slots)}")
    for s, t, g in zip(slots, throughput, good):
        want = simulate_llm(**GOODPUT_WORKLOAD, max_num_seqs=s).request_throughput
        require(math.isclose(t, want, rel_tol=1e-6), f"throughput at {s} slots: you said {t:.4g}, expected {want:.4g}")
        require(math.isclose(g, goodput_of(s), rel_tol=1e-6),
                f"goodput at {s} slots: you said {g:.4g}, expected {goodput_of(s):.4g}")
    return "throughput rises with the slots until it carries the offered load; goodput peaks and falls."


@checker
def check_ttft_cost(ttft_cost: Callable[[float], tuple[float, float]]) -> str:
    """Exercise 08.3, second part: the long prompt's TTFT (s) with the largest budget for a target, and without."""
    chunked, unchunked = ttft_cost(0.025)
    want_unchunked = float(simulate_llm(**CHUNK_SCENARIO).ttft[16])
    want_chunked = chunk_stall(142)[1]          # 15 + 0.07 x 142 = 24.94 ms <= 25 ms < 15 + 0.07 x 143
    require(math.isclose(unchunked, want_unchunked, rel_tol=1e-6),
            f"without a budget the TTFT is {want_unchunked:.4f} s, you said {unchunked:.4f}")
    require(math.isclose(chunked, want_chunked, rel_tol=1e-6),
            f"with the largest budget for 25 ms (142 tokens) the TTFT is {want_chunked:.4f} s, you said {chunked:.4f}")
    return (f"{1000 * want_chunked:.0f} ms against {1000 * want_unchunked:.0f} ms: the stall is bounded, "
            "the long prompt pays.")
