"""A real llama.cpp server beside its twin, one validation row per load (notebook 09, section 8).

The twin is :func:`~infergraph_lite.simulation.llm.simulate_llm` fed the run's own send times, prompt lengths and
output lengths, in the two forms of notebook 09: the **forecast** steps at the speed a profile measured before the
load (:func:`~infergraph_lite.frameworks.llamacpp.profile_step_time`); the **replay** steps at the speed the run
itself showed, read from llama.cpp's own ``timings``: its prefill steps (``prompt_ms`` of the requests that found
the server empty) and its decode steps (``predicted_ms`` per token after the first), each over what the profile
charges for them.  That reading is exact for one slot, where every step holds one request; with more slots a
step's cost depends on which slots decode together, so :func:`validate_llm_server` takes one-slot servers only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from infergraph_lite.core.arguments import check_count, check_number
from infergraph_lite.serving.benchmark import poisson_arrivals
from infergraph_lite.serving.loadtest import run_open_loop
from infergraph_lite.simulation.llm import simulate_llm

__all__ = ["LLMValidationRow", "llm_validation_table", "run_speed", "validate_llm_server"]

METRICS = ("ttft", "tpot")


@dataclass(frozen=True)
class LLMValidationRow:
    """One load: per metric ("ttft", "tpot") the (mean, p99) in seconds, measured and as each twin gave it."""

    load: float
    measured: Mapping[str, tuple[float, float]]
    forecast: Mapping[str, tuple[float, float]]
    replay: Mapping[str, tuple[float, float]]

    def error(self, twin: str, metric: str) -> tuple[float, float]:
        """(mean, p99) relative error of ``twin``'s ``metric``: simulated / measured - 1.

        >>> row = LLMValidationRow(0.5, {"ttft": (0.1, 0.2)}, {"ttft": (0.11, 0.2)}, {"ttft": (0.1, 0.1)})
        >>> tuple(round(e, 3) for e in row.error("forecast", "ttft"))
        (0.1, 0.0)
        """
        sim, real = getattr(self, twin)[metric], self.measured[metric]
        return sim[0] / real[0] - 1, sim[1] / real[1] - 1


def llm_validation_table(rows: Sequence[LLMValidationRow]) -> str:
    """The table LLM-serving simulators publish: per load, the measured TTFT and TPOT and each twin's errors.

    >>> row = LLMValidationRow(0.5, {"ttft": (0.1, 0.2), "tpot": (0.01, 0.02)}, {"ttft": (0.09, 0.2),
    ...                        "tpot": (0.01, 0.03)}, {"ttft": (0.1, 0.22), "tpot": (0.011, 0.02)})
    >>> print(llm_validation_table([row]).splitlines()[-1])
    0.50  100.0  200.0   10.0   20.0 |   -10 %    +0 %    +0 %   +50 % |    +0 %   +10 %   +10 %    +0 %
    """
    lines = ["      measured ms: TTFT      TPOT      | forecast error: TTFT    TPOT     | replay error: TTFT    TPOT",
             "load  mean    p99    mean    p99    |   mean     p99     mean    p99   |   mean     p99     mean    p99"]
    for row in rows:
        measured = " ".join(f"{1e3 * v:6.1f}" for m in METRICS for v in row.measured[m])
        errors = [" ".join(f"{100 * e:+5.0f} %" for m in METRICS for e in row.error(twin, m))
                  for twin in ("forecast", "replay")]
        lines.append(f"{row.load:.2f} {measured} | {errors[0]} | {errors[1]}")
    return "\n".join(lines)


def run_speed(done: Sequence[Any], profile: Any) -> tuple[float, float]:
    """(prefill, decode): the run's own steps over the profile's, from llama.cpp's ``timings`` (one slot).

    Prefill: the median of ``prompt_ms`` over the profile's prefill step, for the requests that found the server
    empty (their step held nothing else).  Decode: the median of each request's ``predicted_ms / (tokens - 1)``
    over the profile's one-sequence decode step at that request's mean context.  Above 1: the machine ran slower
    than when it was profiled.
    """
    prefill, decode = [], []
    for i, c in enumerate(done):
        timings = c.server_timings
        if "prompt_ms" in timings and all(d.done_at <= c.sent_at for d in done[:i]):
            prefill.append(float(timings["prompt_ms"]) / 1e3 / profile(c.prompt_tokens, 0, c.prompt_tokens))
        if "predicted_ms" in timings and c.n_tokens > 1:
            per_token = float(timings["predicted_ms"]) / 1e3 / (c.n_tokens - 1)
            decode.append(per_token / profile(0, 1, c.prompt_tokens + c.n_tokens / 2))
    return (float(np.median(prefill)) if prefill else float("nan"),
            float(np.median(decode)) if decode else float("nan"))


def validate_llm_server(server: Any, profile: Any, *, rates: Mapping[float, float], n_requests: int,
                        prompt_tokens: Sequence[int], output_tokens: int, seed: int = 0) -> list[LLMValidationRow]:
    """A row per load: ``server`` (a one-slot :class:`~infergraph_lite.frameworks.llamacpp.LlamaCppServer`) under
    open-loop Poisson load at ``rates[load]`` req/s (exactly that rate over the run), beside its forecast and its
    replay (module docstring).  ``prompt_tokens`` cycle over the requests; every answer is ``output_tokens`` long.

    >>> validate_llm_server(None, None, rates={0.5: 1.0}, n_requests=4, prompt_tokens=[16], output_tokens=1)
    Traceback (most recent call last):
    ...
    ValueError: output_tokens must be at least 2 (TPOT needs a second token), got 1
    """
    from infergraph_lite.frameworks.llamacpp import CompletionRequest, prompt_of

    n = check_count("n_requests", n_requests)
    if output_tokens < 2:
        raise ValueError(f"output_tokens must be at least 2 (TPOT needs a second token), got {output_tokens}")
    for load, rate in rates.items():
        check_number(f"rates[{load}]", rate)
    if server.n_parallel != 1:
        raise ValueError(f"validate_llm_server: {server!r} has {server.n_parallel} slots; the replay reads the run's "
                         "speed from its timings, which needs one request per step: give it a one-slot server")
    lengths = [prompt_tokens[i % len(prompt_tokens)] for i in range(n)]
    rows = []
    for k, (load, rate) in enumerate(rates.items()):
        arrivals = poisson_arrivals(rate, n, seed + k, exact_rate=True)
        with server.client(n_predict=output_tokens, max_in_flight=n, timeout=120) as client:
            report = run_open_loop(client, arrivals,
                                   make_item=lambda i: CompletionRequest(prompt_of(lengths[i]), output_tokens))
            done = sorted(client.completions, key=lambda c: c.sent_at)
        if report.failed or report.refused or len(done) != n:
            raise RuntimeError(f"{server!r}: {report.failed} failed, {report.refused} refused, "
                               f"{len(done)} of {n} answered at {rate:g} req/s")
        sent = np.array([c.sent_at for c in done]) - done[0].sent_at
        forecast = _replay(done, sent, profile, profile)
        replayed = _replay(done, sent, _at_speed(profile, *run_speed(done, profile)), profile)
        rows.append(LLMValidationRow(load, _summary([c.ttft for c in done], [c.tpot for c in done]),
                                     _summary(forecast.ttft, forecast.tpot), _summary(replayed.ttft, replayed.tpot)))
    return rows


def _at_speed(profile: Any, prefill_speed: float, decode_speed: float) -> Any:
    """The profile's step time with the prompt tokens' part at ``prefill_speed`` and the rest at ``decode_speed``."""
    def step_time(p: float, s: float, kv: float) -> float:
        prompt_part = profile.model.c * p
        return float((profile(p, s, kv) - prompt_part) * decode_speed + prompt_part * prefill_speed)
    return step_time


def _replay(done: Sequence[Any], sent: np.ndarray, step_time: Any, profile: Any) -> Any:
    """The run's own requests (lengths, send times) through a one-slot ``simulate_llm``, the profile's overheads."""
    return simulate_llm(n_requests=len(done), prompt_tokens=[c.prompt_tokens for c in done],
                        output_tokens=[c.n_tokens for c in done], step_time=step_time, max_num_seqs=1, arrivals=sent,
                        request_overhead=profile.request_overhead, response_overhead=profile.response_overhead,
                        wake=profile.wake, idle_after=profile.idle_after)


def _summary(ttft: Any, tpot: Any) -> dict[str, tuple[float, float]]:
    return {m: (float(np.nanmean(x)), float(np.nanpercentile(x, 99))) for m, x in (("ttft", ttft), ("tpot", tpot))}
