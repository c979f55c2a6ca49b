"""One metrics record for an LLM serving run, by the names and definitions of vLLM's ``vllm bench serve``.

Per request, from when it was sent (or arrived):

- **TTFT**, time to first token: to the first output token's arrival;
- **TPOT**, time per output token: ``(E2EL - TTFT) / (tokens - 1)``, the mean time per token *after the first*
  (a request with one token has none and is left out);
- **ITL**, inter-token latency: every gap between two consecutive tokens, pooled over all requests (so a single
  long gap shows in the ITL percentiles while it hides in a request's TPOT);
- **E2EL**, end-to-end latency: to the answer's end.

Over the run (``duration``: the first send to the last answer's end): **request throughput** (requests per second),
**output throughput** (output tokens per second) and **goodput**, the requests per second that met every given
SLO (``{"ttft": 0.5, "tpot": 0.05}``: at most 0.5 s to the first token and 50 ms a token after it; vLLM's
``--goodput ttft:500 tpot:50``, there in milliseconds).  Each latency is summarised as its mean, median and
chosen percentiles (vLLM's ``--metric-percentiles``, 99 by default).

:meth:`LLMMetrics.from_token_times` builds the record from each request's token arrival times; the real client's
completions and the simulator's results both have them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["SLO_METRICS", "LLMMetrics", "Summary"]

SLO_METRICS = ("ttft", "tpot", "itl", "e2el")   # what an SLO may bound (itl: a request's every gap)


@dataclass(frozen=True)
class Summary:
    """Mean, median and chosen percentiles of one latency, in seconds (NaN where there was no value).

    >>> s = Summary.of([0.1, 0.2, 0.3, 0.4], percentiles=(99,))
    >>> round(s.mean, 3), round(s.median, 3), round(s.p(99), 3)
    (0.25, 0.25, 0.397)
    """

    mean: float
    median: float
    percentiles: Mapping[float, float] = field(default_factory=dict)

    @classmethod
    def of(cls, values: Sequence[float] | np.ndarray, percentiles: Sequence[float] = (99,)) -> Summary:
        """Summarise ``values`` (NaNs left out) with numpy's linearly interpolated percentiles."""
        v = np.asarray(values, dtype=float)
        v = v[~np.isnan(v)]
        if len(v) == 0:
            return cls(math.nan, math.nan, {float(q): math.nan for q in percentiles})
        return cls(float(v.mean()), float(np.median(v)), {float(q): float(np.percentile(v, q)) for q in percentiles})

    def p(self, q: float) -> float:
        """The ``q``-th percentile (one of those the summary was made with)."""
        try:
            return self.percentiles[float(q)]
        except KeyError:
            raise KeyError(f"percentile {q} was not computed; this summary has {sorted(self.percentiles)}") from None


@dataclass(frozen=True)
class LLMMetrics:
    """vLLM's serving metrics for one run; latencies in seconds, throughputs per second.

    >>> m = LLMMetrics.from_token_times([[0.10, 0.15, 0.20], [0.30, 0.32]], sent=[0.0, 0.05],
    ...                                 slo={"ttft": 0.2}, percentiles=(50, 99))
    >>> m.completed, m.output_tokens, round(m.duration, 2)        # first send 0.0, last token 0.05 + 0.32
    (2, 5, 0.37)
    >>> round(m.ttft.mean, 3), round(m.tpot.median, 3), round(m.itl.p(50), 3)   # gaps 0.05, 0.05, 0.02
    (0.2, 0.035, 0.05)
    >>> m.good, round(m.goodput, 2), round(m.output_throughput, 1)    # only the first met TTFT <= 0.2 s
    (1, 2.7, 13.5)
    """

    completed: int                  # requests in the record
    output_tokens: int              # their output tokens, all together
    duration: float                 # seconds from the first send to the last answer's end
    ttft: Summary
    tpot: Summary
    itl: Summary
    e2el: Summary
    request_throughput: float       # completed / duration
    output_throughput: float        # output_tokens / duration
    good: int = 0                   # requests that met every SLO (all of them when no SLO is given)
    goodput: float = math.nan       # good / duration (NaN: no SLO given)
    slo: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def from_token_times(cls, token_times: Sequence[Sequence[float] | np.ndarray], *,
                         sent: Sequence[float] | np.ndarray | None = None,
                         e2el: Sequence[float] | np.ndarray | None = None, duration: float | None = None,
                         slo: Mapping[str, float] | None = None, percentiles: Sequence[float] = (99,)) -> LLMMetrics:
        """The record from each request's token arrival times, seconds from when it was sent.

        ``sent``: when each request was sent, on one clock (default: all at 0), for the run's ``duration`` (the
        first send to the last end; or give ``duration``).  ``e2el``: each request's end-to-end latency (default:
        its last token; a streaming client sees the stream end a little after it).  ``slo``: bounds in seconds
        on any of ``ttft``, ``tpot``, ``itl`` (each gap of the request), ``e2el``, for the goodput.

        >>> LLMMetrics.from_token_times([[1.0, 1.5]], slo={"tpot": 0.4}).good    # TPOT 0.5 s > 0.4 s
        0
        """
        times = [np.asarray(t, dtype=float) for t in token_times]
        if any(len(t) == 0 for t in times):
            raise ValueError("every request needs at least one token time")
        n = len(times)
        sent_at = np.zeros(n) if sent is None else np.asarray(sent, dtype=float)
        ends = np.array([t[-1] for t in times]) if e2el is None else np.asarray(e2el, dtype=float)
        if len(sent_at) != n or len(ends) != n:
            raise ValueError(f"sent and e2el need one value per request ({n}), got {len(sent_at)} and {len(ends)}")
        slo = dict(slo or {})
        unknown = set(slo) - set(SLO_METRICS)
        if unknown:
            raise ValueError(f"slo bounds {sorted(unknown)}: an SLO may bound {list(SLO_METRICS)}")
        ttft = np.array([t[0] for t in times])
        counts = np.array([len(t) for t in times])
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(counts > 1, (ends - ttft) / (counts - 1), np.nan)     # vLLM: (latency - ttft) / (n - 1)
        gaps = [np.diff(t) for t in times]
        if duration is None:
            duration = float(np.max(sent_at + ends) - np.min(sent_at)) if n else math.nan
        good = n
        if slo:
            per_request = {"ttft": ttft, "tpot": tpot, "e2el": ends,
                           "itl": np.array([g.max() if len(g) else 0.0 for g in gaps])}
            # a request with one token has no TPOT: it cannot break a TPOT bound (NaN <= x is False, so test > x)
            ok = np.ones(n, dtype=bool)
            for name, bound in slo.items():
                ok &= ~(per_request[name] > bound)
            good = int(ok.sum())
        rate = (lambda k: k / duration) if duration and duration > 0 else (lambda k: math.nan)
        return cls(completed=n, output_tokens=int(counts.sum()), duration=float(duration),
                   ttft=Summary.of(ttft, percentiles), tpot=Summary.of(tpot, percentiles),
                   itl=Summary.of(np.concatenate(gaps) if gaps else [], percentiles),
                   e2el=Summary.of(ends, percentiles), request_throughput=rate(n),
                   output_throughput=rate(int(counts.sum())), good=good,
                   goodput=rate(good) if slo else math.nan, slo=slo)

    def table(self) -> str:
        """The record as ``vllm bench serve`` prints it: milliseconds for latencies.

        >>> print(LLMMetrics.from_token_times([[0.1, 0.2]]).table())     # doctest: +NORMALIZE_WHITESPACE
        requests 1, output tokens 2, duration 0.20 s
        request throughput 5.00 req/s, output throughput 10.0 tok/s
        TTFT  mean 100.0 ms, median 100.0 ms, p99 100.0 ms
        TPOT  mean 100.0 ms, median 100.0 ms, p99 100.0 ms
        ITL   mean 100.0 ms, median 100.0 ms, p99 100.0 ms
        E2EL  mean 200.0 ms, median 200.0 ms, p99 200.0 ms
        """
        lines = [f"requests {self.completed}, output tokens {self.output_tokens}, duration {self.duration:.2f} s",
                 f"request throughput {self.request_throughput:.2f} req/s, output throughput "
                 f"{self.output_throughput:.1f} tok/s"
                 + (f", goodput {self.goodput:.2f} req/s ({self.good} met {dict(self.slo)})" if self.slo else "")]
        for name in ("ttft", "tpot", "itl", "e2el"):
            s: Summary = getattr(self, name)
            ps = ", ".join(f"p{q:g} {1e3 * v:.1f} ms" for q, v in s.percentiles.items())
            lines.append(f"{name.upper():5} mean {1e3 * s.mean:.1f} ms, median {1e3 * s.median:.1f} ms"
                         + (f", {ps}" if ps else ""))
        return "\n".join(lines)
