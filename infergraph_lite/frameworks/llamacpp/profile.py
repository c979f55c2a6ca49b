"""How long one llama.cpp step takes, measured on the running server, for calibrating the LLM simulator (notebook 08).

The simulator (:func:`infergraph_lite.simulate_llm`) advances in steps; it asks ``step_time(prefill_tokens,
decode_seqs, kv_tokens)`` for each.  :func:`profile_step_time` measures that on a real server:

- *decode*: ``c`` requests sent together (same prompt length, same token count) run in lock-step, so the
  ``j``-th inter-token gap of each is one decode step holding ``c`` sequences and ``c x (prompt + j)``
  tokens of context; measured at two prompt lengths, so the context term is fitted, not extrapolated;
- *mixed*: a request joins ``c`` decoding ones: the step that prefills it beside their decodes.  llama.cpp here
  keeps a KV cache per slot (``kv_unified = false``) and cuts a batch into micro-batches with the same number
  of tokens from every sequence, each over a run of consecutive slots (``split_equal(n_ubatch, sequential)``),
  so such a step runs the prefill as a pass of its own, and sequences decoding in slots 0 and 2 run as two
  passes: measured on the 12M model (8 slots, contexts under 60 tokens), two sequences decoded in 7.4 ms a step
  in neighbouring slots and in 10.8 ms in others, about two one-sequence steps (5.4 ms each);
- *prefill*: one request alone with a ``p``-token prompt: the server's own ``timings.prompt_ms`` is one step
  that prefills ``p`` tokens (and samples the first output token);
- *overheads*: what the same lone request spent outside that step.  Its client-side time to first token
  minus ``prompt_ms`` is the time between the request leaving the client and its prefill step (HTTP, JSON,
  tokenizing, slot set-up) plus the first token's way back: the *request overhead*, the same subtraction
  notebook 07 makes for Triton's gRPC hop.  Its end-to-end time minus its last token's arrival is the
  *response overhead* (the stream's closing event);
- *wake* (``wake_pairs > 0``): the same lone request right after another and after the server has idled
  ``wake_pause`` seconds; the mean difference of their client-side times to first token is what a step costs
  more when it finds the engine idle (a woken thread, cold caches): the model's ``wake``, charged by the
  simulator to a step after ``idle_after = wake_pause`` seconds with nothing to do.

:func:`fit_step_time` fits ``a + b*decode_seqs + c*prefill_tokens + d*kv_tokens + e*extra_batches`` to such rows
by least squares (numpy only; a coefficient the data would make negative is held at 0), ``extra_batches`` being
the micro-batches a step ran beyond its first (read from the slots the server says each request ran in), and
returns a :class:`StepTimeModel`, a callable the simulator takes as it is, carrying the two overheads
(``simulate_llm`` reads them from it).  Called with what a step holds and nothing more, the model charges the
micro-batches expected when the decoding sequences sit in ``slots`` slots at random (:func:`expected_runs`);
``simulate_llm(slot_placement=...)`` places them as llama.cpp does and passes the step's own count instead.
"""

from __future__ import annotations

import itertools
import math
import os
import time
from collections.abc import Sequence
from concurrent.futures import wait
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from infergraph_lite.core.arguments import check_count, check_non_negative_int, check_number
from infergraph_lite.frameworks.llamacpp.client import Completion, CompletionRequest, LlamaCppClient
from infergraph_lite.frameworks.llamacpp.model import prompt_of

__all__ = ["StepSample", "StepTimeModel", "StepTimeProfile", "expected_runs", "fit_step_time", "mixed_gap",
           "profile_step_time", "slot_runs"]

FEATURES = ("decode_seqs", "prefill_tokens", "kv_tokens", "extra_batches")
WORST_FIT = 0.20      # StepTimeProfile.problems: the most a fit may miss its worst sample by (relative)


def slot_runs(slots: Sequence[int]) -> int:
    """How many runs of consecutive slot ids ``slots`` hold: the micro-batches llama.cpp cuts their decodes into.

    With a KV cache per slot, llama.cpp's ``split_equal(n_ubatch, sequential=true)`` puts into one micro-batch only
    sequences whose ids follow each other, so sequences decoding in slots 0, 1 and 5 make two passes.

    >>> slot_runs([0, 1, 5]), slot_runs([3, 2, 4]), slot_runs([]), slot_runs([7, 0])
    (2, 1, 0, 2)
    """
    ids = sorted({int(v) for v in slots})
    return len(ids) - sum(1 for x, y in itertools.pairwise(ids) if y == x + 1)


def expected_runs(k: float, slots: int | None) -> float:
    """Mean :func:`slot_runs` of ``k`` sequences in ``k`` of ``slots`` slots chosen at random: ``k - k(k-1)/slots``.

    Each of the ``slots - 1`` neighbouring pairs holds two of them with probability ``k(k-1) / (slots(slots-1))``,
    and every such pair joins two runs.  ``slots=None``: every sequence in one run (a shared cache), 1 for ``k >= 1``.

    >>> expected_runs(2, 8), expected_runs(8, 8), expected_runs(0, 8), expected_runs(3, None)
    (1.75, 1.0, 0.0, 1.0)
    """
    if k <= 0:
        return 0.0
    if slots is None:
        return 1.0
    k = min(float(k), float(slots))
    return k - k * (k - 1) / slots


@dataclass(frozen=True)
class StepSample:
    """One measured step: what it held and how long it took (seconds)."""

    prefill_tokens: int
    decode_seqs: int
    kv_tokens: int
    seconds: float
    kind: str = ""          # "decode", "mixed" or "prefill"
    micro_batches: int = 0  # passes the step ran (from the slots); 0: unknown, 1 + mixed taken

    @property
    def extra_batches(self) -> int:
        """Micro-batches beyond the first: measured, or 1 for a step holding both a prefill and decodes."""
        if self.micro_batches:
            return self.micro_batches - 1
        return int(self.prefill_tokens > 0 and self.decode_seqs > 0)


@dataclass(frozen=True)
class StepTimeModel:
    """One llama.cpp step: ``a + b*decode_seqs + c*prefill_tokens + d*kv_tokens + e*extra_batches`` seconds.

    Seconds per step.  ``kv_tokens`` is the context the step's sequences hold in the KV cache, summed over
    them.  ``extra_batches`` is how many micro-batches the step runs beyond its first, each paying a fixed cost
    ``e``: llama.cpp with a KV cache per slot (``kv_unified = false``, the server's default here) cuts a step into
    micro-batches that take the same number of tokens from every sequence and hold only sequences in consecutive
    slots, so a prefill beside decodes is a pass of its own, and so is every run of neighbouring slots that
    decode.  Where the sequences sit is the server's choice: told the step's ``extra_batches`` (as
    ``simulate_llm(slot_placement=...)`` counts them from the slots it placed) the model charges those; else, with
    ``slots`` set, a step's ``decode_seqs`` are taken to sit in that many slots at random (:func:`expected_runs`);
    with ``slots=None``, in one pass (then ``extra_batches`` is 1 for a step holding a prefill and decodes, else 0; see
    :meth:`extra_batches`).  ``rmse`` is the fit's root-mean-square error over the samples it was
    fitted to (seconds), and
    ``worst_relative_error`` its largest |predicted - measured| / measured there.  ``request_overhead`` and
    ``response_overhead`` (seconds) are a request's time outside the steps, before its first step may run and
    after its last token; :func:`~infergraph_lite.simulate_llm` takes them from the model it is given.  ``wake``
    (seconds) is what a step costs more when the engine has had nothing to do for at least ``idle_after``
    seconds (the server's thread woken, its caches cold); ``simulate_llm`` takes both from the model too
    (``idle_after=None``: no such cost measured).

    >>> model = StepTimeModel(a=0.002, b=0.001, c=0.0001, d=0.0)
    >>> round(model(prefill_tokens=0, decode_seqs=4, kv_tokens=400), 6)
    0.006
    >>> round(model(100, 0, 100), 6)
    0.012
    >>> round(StepTimeModel(a=0.002, b=0.001, c=0.0001, e=0.003)(10, 2, 40), 6)    # prefill beside decodes
    0.008
    >>> StepTimeModel(a=0.002, b=0.001, c=0.0001, e=0.003, slots=8).extra_batches(0, 2)   # 2 of 8 slots at random
    0.75
    >>> StepTimeModel(a=0.002, b=0.001, c=0.0001, wake=0.0025, idle_after=0.25).wake    # after 0.25 s idle
    0.0025
    """

    a: float
    b: float
    c: float
    d: float = 0.0
    e: float = 0.0
    rmse: float = math.nan
    worst_relative_error: float = math.nan
    n_samples: int = 0
    request_overhead: float = 0.0
    response_overhead: float = 0.0
    slots: int | None = None
    wake: float = 0.0
    idle_after: float | None = None

    def __post_init__(self) -> None:
        check_number("wake", self.wake, positive=False)
        if self.idle_after is not None:
            check_number("idle_after", self.idle_after)
        elif self.wake:
            raise ValueError("idle_after: a wake cost needs the idle time (seconds > 0) after which a step pays it")

    def extra_batches(self, prefill_tokens: float, decode_seqs: float) -> float:
        """Micro-batches beyond the first a step is expected to run: its decode runs, plus one for a prefill."""
        runs = expected_runs(decode_seqs, self.slots) + (1.0 if prefill_tokens > 0 else 0.0)
        return max(0.0, runs - 1.0)

    def step_seconds(self, prefill_tokens: float, decode_seqs: float, kv_tokens: float,
                     extra_batches: float) -> float:
        """A step's seconds with its micro-batches beyond the first given (measured from the slots, say), not expected.

        >>> model = StepTimeModel(a=0.002, b=0.001, c=0.0001, e=0.003, slots=8)
        >>> round(model.step_seconds(0, 2, 40, extra_batches=1), 6), round(model(0, 2, 40), 6)   # apart / at random
        (0.007, 0.00625)
        """
        return (self.a + self.b * decode_seqs + self.c * prefill_tokens + self.d * kv_tokens
                + self.e * extra_batches)

    def __call__(self, prefill_tokens: float, decode_seqs: float, kv_tokens: float,
                 extra_batches: float | None = None) -> float:
        """A step's seconds; ``extra_batches`` (None: the expectation, :meth:`extra_batches`) as
        ``simulate_llm(slot_placement=...)`` counts them from the slots it placed."""
        if extra_batches is None:
            extra_batches = self.extra_batches(prefill_tokens, decode_seqs)
        return self.step_seconds(prefill_tokens, decode_seqs, kv_tokens, extra_batches)

    @property
    def coefficients(self) -> dict[str, float]:
        """``{'a', 'b', 'c', 'd', 'e'}``: seconds, per sequence, per prompt token, per KV token, per extra pass."""
        return {"a": self.a, "b": self.b, "c": self.c, "d": self.d, "e": self.e}

    def __str__(self) -> str:
        return (f"step = {1e3 * self.a:.3f} ms + {1e3 * self.b:.3f} ms x decode_seqs + "
                f"{1e3 * self.c:.4f} ms x prefill_tokens + {1e3 * self.d:.5f} ms x kv_tokens + "
                f"{1e3 * self.e:.3f} ms x extra_batches"
                + (f" (decodes in {self.slots} slots at random)" if self.slots else "") + " "
                f"(rmse {1e3 * self.rmse:.3f} ms, worst {100 * self.worst_relative_error:.0f} %, "
                f"{self.n_samples} samples)"
                + (f"; per request {1e3 * self.request_overhead:.2f} ms before its first step, "
                   f"{1e3 * self.response_overhead:.2f} ms after its last token"
                   if self.request_overhead or self.response_overhead else "")
                + (f"; {1e3 * self.wake:.2f} ms more for a step after {1e3 * self.idle_after:.0f} ms idle"
                   if self.idle_after is not None else ""))


def fit_step_time(samples: Sequence[StepSample] | np.ndarray, *, kv: bool = True, relative: bool = True,
                  slots: int | None = None) -> StepTimeModel:
    """Least-squares fit of ``a + b*decode_seqs + c*prefill_tokens (+ d*kv_tokens) + e*extra_batches`` to steps.

    ``samples`` are :class:`StepSample` or rows ``(prefill_tokens, decode_seqs, kv_tokens, seconds)``, optionally
    with a fifth column, the micro-batches the step ran (0: unknown).  Where that is not known, a step holding both
    a prefill and decodes (a mixed step) ran one extra micro-batch and any other none; without extra micro-batches
    in the rows, ``e = 0``.  ``slots`` is passed on to the model (where the simulator's decodes are taken to sit,
    see :class:`StepTimeModel`).  ``kv=False`` leaves out the context term (``d = 0``).  A coefficient that comes
    out negative (noise, or a term the samples do not vary) is held at 0 and the rest refitted (non-negative least
    squares, ``scipy.optimize.nnls``), so the model never predicts that more work takes less time.
    ``relative=True`` (default) minimises the squared *relative* error, so a 2 ms step is fitted as closely as a
    200 ms one (plain least squares lets the long prefill steps decide, and a one-sequence server's every step
    would be mispredicted by the misfit at small batches).

    >>> rows = [(0, s, s * n, 0.002 + 0.001 * s + 1e-6 * s * n) for s in (1, 2, 4, 8) for n in (10, 200)]
    >>> rows += [(p, 0, p, 0.002 + 5e-5 * p + 1e-6 * p) for p in (16, 64, 256)]
    >>> m = fit_step_time(rows)
    >>> [round(v * 1e6) for v in (m.a, m.b, m.c, m.d, m.e)]      # microseconds
    [2000, 1000, 50, 1, 0]
    >>> rows += [(p, s, p + 20 * s, 0.002 + 0.001 * s + 5e-5 * p + 1e-6 * (p + 20 * s) + 0.003) for s in (1, 4)
    ...          for p in (16, 64)]
    >>> round(fit_step_time(rows).e * 1e6)
    3000
    >>> rows += [(0, 2, 40, 0.002 + 0.002 + 4e-5 + 0.003, 2)]      # two decodes in slots apart: two micro-batches
    >>> round(fit_step_time(rows).e * 1e6)
    3000
    >>> fit_step_time([])
    Traceback (most recent call last):
    ValueError: samples: need at least 2 measured steps to fit a step time, got 0
    """
    listed = [(s.prefill_tokens, s.decode_seqs, s.kv_tokens, s.seconds, s.micro_batches)
              if isinstance(s, StepSample) else (*s, 0)[:5] for s in samples]
    if any(len(r) < 4 for r in listed):
        raise ValueError("samples: each row needs prefill_tokens, decode_seqs, kv_tokens and seconds")
    rows = np.asarray(listed, dtype=float).reshape(-1, 5)
    if len(rows) < 2:
        raise ValueError(f"samples: need at least 2 measured steps to fit a step time, got {len(rows)}")
    if not np.all(np.isfinite(rows)) or np.any(rows < 0):
        raise ValueError("samples: every prefill_tokens, decode_seqs, kv_tokens, seconds and micro_batches must be "
                         "finite and >= 0")
    prefill, seqs, kv_tokens, seconds, batches = rows.T
    mixed = ((prefill > 0) & (seqs > 0)).astype(float)
    extra = np.where(batches > 0, np.maximum(batches - 1, 0), mixed)     # measured, or one for a mixed step
    columns = {"a": np.ones(len(rows)), "b": seqs, "c": prefill, "d": kv_tokens, "e": extra}
    active = ["a", "b", "c", "d", "e"] if kv else ["a", "b", "c", "e"]
    active = [k for k in active if k == "a" or columns[k].any()]
    weight = 1.0 / np.maximum(seconds, 1e-9) if relative else np.ones(len(rows))
    # Non-negative least squares (SciPy's Lawson-Hanson NNLS): a coefficient the best unconstrained fit would make
    # negative is held at 0 and the rest fitted, so the model never predicts that more work takes less time.
    from scipy.optimize import nnls  # here: scipy takes longer to import than the package (see core.metrics)

    x = np.column_stack([columns[k] for k in active]) * weight[:, None]
    solution, _ = nnls(x, seconds * weight)
    coef = dict(zip(active, solution.tolist(), strict=True))
    full = {k: coef.get(k, 0.0) for k in ("a", "b", "c", "d", "e")}
    predicted = sum(full[k] * columns[k] for k in full)
    rmse = float(np.sqrt(np.mean((predicted - seconds) ** 2)))
    worst = float(np.max(np.abs(predicted - seconds) / np.maximum(seconds, 1e-9)))
    return StepTimeModel(**full, rmse=rmse, worst_relative_error=worst, n_samples=len(rows), slots=slots)


@dataclass(frozen=True)
class StepTimeProfile:
    """What :func:`profile_step_time` measured, and the fitted :class:`StepTimeModel` (``profile.model``).

    ``decode`` maps a concurrency ``c`` to the median inter-token gap (seconds) at ``c`` sequences;
    ``prefill`` maps a prompt length to the median prefill step of a request alone (the server's ``prompt_ms``,
    seconds), ``ttft`` to its median time to first token as the client saw it; ``model.request_overhead`` is the
    median of the differences.
    ``load_average`` is the machine's 1-minute load average before and after: a profile taken on a busy
    machine predicts a busy machine, so measure what it is checked against under the same conditions.
    """

    model: StepTimeModel
    samples: tuple[StepSample, ...]
    decode: dict[int, float] = field(default_factory=dict)
    prefill: dict[int, float] = field(default_factory=dict)
    ttft: dict[int, float] = field(default_factory=dict)
    elapsed: float = 0.0
    load_average: tuple[float, float] = (math.nan, math.nan)    # 1-minute load average before and after
    misread: tuple[StepSample, ...] = ()      # mixed samples left out: shorter than the lone prefill of their prompt
    # (TTFT right after another request, TTFT after wake_pause idle, their prompt_ms alike), seconds, per pair
    wake_samples: tuple[tuple[float, float, float, float], ...] = ()

    @property
    def problems(self) -> tuple[str, ...]:
        """Why the fitted model should not be used (empty: none found); profile again instead.

        The prefill coefficient ``c`` must be within 25 % of the lone prefills' own slope (seconds per prompt token,
        fitted to :attr:`prefill`), and where the samples hold steps of more than one micro-batch, ``e`` must be
        above 0: a fit that holds either off has taken a misread step for a real one.  And the fit must hold its own
        samples: none more than :data:`WORST_FIT` (20 %) off.  Good profiles on this project's machines were at most
        2-17 % off at their worst sample; one at 26 % forecast decode steps 1.6 times those of the runs after it (it
        was taken while the machine was slower).
        """
        found = []
        if len(self.prefill) >= 2:
            lengths = np.array(sorted(self.prefill), dtype=float)
            slope = float(np.polyfit(lengths, [self.prefill[int(p)] for p in lengths], 1)[0])
            if slope > 0 and abs(self.model.c / slope - 1) > 0.25:
                found.append(f"c = {1e3 * self.model.c:.3f} ms per prompt token, the lone prefills' slope "
                             f"{1e3 * slope:.3f}: more than 25 % apart")
        if self.model.e == 0 and any(s.extra_batches > 0 for s in self.samples):
            found.append("e = 0 although steps of more than one micro-batch were measured")
        if self.model.worst_relative_error > WORST_FIT:
            found.append(f"the fit is {100 * self.model.worst_relative_error:.0f} % off its worst sample, more than "
                         f"{100 * WORST_FIT:.0f} %")
        return tuple(found)

    def __call__(self, prefill_tokens: float, decode_seqs: float, kv_tokens: float,
                 extra_batches: float | None = None) -> float:
        return self.model(prefill_tokens, decode_seqs, kv_tokens, extra_batches)

    @property
    def request_overhead(self) -> float:
        """The model's per-request seconds before its first step (see :class:`StepTimeModel`)."""
        return self.model.request_overhead

    @property
    def response_overhead(self) -> float:
        """The model's per-request seconds after its last token."""
        return self.model.response_overhead

    @property
    def wake(self) -> float:
        """The model's seconds more for a step that finds the engine idle (see :class:`StepTimeModel`)."""
        return self.model.wake

    @property
    def idle_after(self) -> float | None:
        """The model's idle seconds after which a step pays :attr:`wake` (None: not measured)."""
        return self.model.idle_after


def _load_average() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:          # not available on this platform
        return math.nan


def _together(client: LlamaCppClient, requests: list[CompletionRequest], timeout: float) -> list[Completion]:
    futures = [client.submit(r) for r in requests]
    _, not_done = wait(futures, timeout=timeout)
    if not_done:
        raise TimeoutError(f"{len(not_done)} of {len(futures)} profiling requests did not finish in {timeout:.0f} s")
    return [f.result() for f in futures]


def _check_counts(name: str, values: Any, upper: int | None = None) -> tuple[int, ...]:
    try:
        values = () if isinstance(values, str) else tuple(values)
    except TypeError:       # not iterable
        values = ()
    if not values:
        raise ValueError(f"{name} must be a non-empty sequence of integers >= 1, got {values!r}")
    values = tuple(check_count(f"{name}[{i}]", v) for i, v in enumerate(values))
    if upper is not None and max(values) > upper:
        raise ValueError(f"{name}: {max(values)} is more than the server's n_parallel ({upper}) slots")
    return values


def profile_step_time(server: Any, *, concurrencies: Sequence[int] | None = None,
                      prompt_tokens: int | Sequence[int] = (8, 96), n_predict: int = 32,
                      prefill_lengths: Sequence[int] = (8, 64, 192), repeats: int = 3, kv: bool = True,
                      mixed: bool = True, timeout: float = 120.0, wake_pairs: int = 0,
                      wake_pause: float = 0.25) -> StepTimeProfile:
    """Measure llama.cpp's step time against what a step holds, and fit :func:`fit_step_time` to it.

    ``server`` is a :class:`~infergraph_lite.frameworks.llamacpp.server.LlamaCppServer` (its ``client()`` is
    used, on llama.cpp's own endpoint, for the slots) or a
    :class:`~infergraph_lite.frameworks.llamacpp.client.LlamaCppClient` (made with ``api="llamacpp"``, or the
    micro-batches are unknown: the OpenAI-compatible stream does not say the slot).  ``concurrencies``
    defaults to 1, 2, 4, ... up to the server's ``n_parallel``; each is measured ``repeats`` times with
    ``c`` requests of each of ``prompt_tokens`` prompt tokens (several lengths, so that the context term is
    fitted over a range of contexts instead of extrapolated) and ``n_predict`` output tokens sent together.
    ``mixed=True``: for each concurrency below ``n_parallel`` and for ``n_parallel - 1``, one more request (a
    prompt of one of ``prefill_lengths``, in turn) joins ``c`` decoding ones halfway, every repeat; the step that
    prefills it beside their decodes, found by :func:`mixed_gap`, is a *mixed* sample; one shorter than the lone
    prefill of its prompt is a misread gap, left out (``profile.misread``).  Every sample carries the micro-batches
    its step ran, from the slots the server reports (:func:`slot_runs` of the decoding requests' slots, one more
    for a prefill beside them: the model's ``e`` term), and the model is told the server's ``n_parallel`` slots.
    Each of ``prefill_lengths`` is measured ``repeats`` times alone: its step is the server's ``prompt_ms``, and
    the client's time to first token beyond it, and its end beyond the last token, are the model's
    ``request_overhead`` and ``response_overhead`` (medians over all lone requests).  Every request is bounded by
    ``timeout``.  Warm-up: one request first, not recorded.  Medians over the repeats.
    ``wake_pairs`` (0: none) pairs of the lone request of ``prefill_lengths[0]`` tokens, spread over the repeats,
    measure what a step costs more after the server has idled: each pair is one request right after another and
    the same one after ``wake_pause`` seconds with nothing sent; the model's ``wake`` is the mean difference of
    their client-side times to first token (held at 0 when negative), ``idle_after`` is ``wake_pause``, and
    ``profile.wake_samples`` keeps every pair.  The mean, not the median: a woken server is sometimes much
    slower and mostly not, and a mean TTFT pays every such time.  Each pair takes ``wake_pause`` plus two lone
    requests.

    >>> from infergraph_lite.frameworks.llamacpp.model import write_tiny_llama
    >>> from infergraph_lite.frameworks.llamacpp.server import LlamaCppServer
    >>> model = write_tiny_llama(embd=64, layers=1, ff=128, heads=4, kv_heads=2, ctx=512)
    >>> with LlamaCppServer(model, n_parallel=2) as server:
    ...     profile = profile_step_time(server, n_predict=8, prefill_lengths=(8, 32), repeats=1)
    >>> sorted(profile.decode), sorted(profile.prefill), profile.model(0, 2, 20) > 0
    ([1, 2], [8, 32], True)
    >>> 0 < profile.request_overhead < max(profile.ttft.values())   # a part of a lone request's first token
    True
    """
    n_parallel = check_count("server.n_parallel", getattr(server, "n_parallel", None), allow_none=True)
    if concurrencies is None:
        top = n_parallel or 1
        concurrencies = sorted({min(2 ** k, top) for k in range(top.bit_length() + 1)})
    concurrencies = _check_counts("concurrencies", concurrencies, n_parallel)
    prefill_lengths = _check_counts("prefill_lengths", prefill_lengths)
    # One length (an int, numpy integers too) or several; every count comes back as a Python int.
    prompts = _check_counts("prompt_tokens", [prompt_tokens] if np.ndim(prompt_tokens) == 0 else prompt_tokens)
    n_predict = check_count("n_predict", n_predict)
    repeats = check_count("repeats", repeats)
    timeout = check_number("timeout", timeout)
    wake_pairs = check_non_negative_int("wake_pairs", wake_pairs)
    wake_pause = check_number("wake_pause", wake_pause)
    if n_predict < 3:
        raise ValueError(f"n_predict must be >= 3 (the decode gaps after the first are the samples), got {n_predict}")
    if isinstance(server, LlamaCppClient):
        client, own = server, False
    else:
        # llama.cpp's own /completion endpoint: its answers say which slot served each request (micro-batches)
        client, own = server.client(max_in_flight=max(concurrencies) + 1, timeout=timeout, api="llamacpp"), True
    # Joins beside each concurrency below n_parallel, and beside n_parallel - 1 (the fullest a join can find).
    joins = sorted({c for c in concurrencies if n_parallel is None or c < n_parallel}
                   | ({n_parallel - 1} if n_parallel and n_parallel > 1 else set())) if mixed else []
    start = time.perf_counter()
    load_before = _load_average()
    samples: list[StepSample] = []
    decode: dict[int, float] = {}
    prefill: dict[int, float] = {}
    ttft: dict[int, float] = {}
    try:
        client.complete(CompletionRequest(prompt_of(prompts[0]), 4))      # warm-up: caches, threads
        # Repeats outermost: each round measures every concurrency and prompt length once, so a change in the
        # machine's load during the profile moves all of them alike instead of one.
        # Keyed by the micro-batches the decodes ran in too (the runs of neighbouring slots the c requests got).
        gaps_by_step: dict[tuple[int, int, int], list[list[float]]] = {}
        ttfts: dict[int, list[float]] = {p: [] for p in prefill_lengths}
        prompt_steps: dict[int, list[float]] = {p: [] for p in prefill_lengths}
        before: list[float] = []
        after: list[float] = []
        woken: list[tuple[float, float, float, float]] = []
        for r in range(repeats):
            halfway: dict[int, float] = {}      # seconds from sending c requests to their n_predict / 2-th token
            for c in concurrencies:
                for q in prompts:
                    done = _together(client, [CompletionRequest(prompt_of(q), n_predict)] * c, timeout)
                    key = (c, q, _micro_batches(d.slot for d in done))
                    by_step = gaps_by_step.setdefault(key, [[] for _ in range(n_predict - 1)])
                    for completion in done:
                        for j, gap in enumerate(completion.gaps.tolist()):
                            by_step[j].append(gap)
                    if q == prompts[0]:
                        halfway[c] = max(float(d.token_times[n_predict // 2]) for d in done)
            for k, c in enumerate(joins):
                wait_s = halfway[min(halfway, key=lambda h: abs(h - c))]   # c's own, or the nearest measured
                p = prefill_lengths[(r + k) % len(prefill_lengths)]        # every c sees the lengths in turn
                sample = _mixed_step(client, c, prompts[0], n_predict, p, wait_s, timeout)
                if sample is not None:
                    samples.append(sample)
            for p in prefill_lengths:
                lone = client.complete(CompletionRequest(prompt_of(p), 1))
                step = _prompt_seconds(lone)
                ttfts[p].append(lone.ttft)
                prompt_steps[p].append(step)
                before.append(lone.ttft - step)
                after.append(lone.e2e - float(lone.token_times[-1]))
            for _ in range(r, wake_pairs, repeats):       # this repeat's share of the pairs
                hot = client.complete(CompletionRequest(prompt_of(prefill_lengths[0]), 1))
                time.sleep(wake_pause)
                cold = client.complete(CompletionRequest(prompt_of(prefill_lengths[0]), 1))
                woken.append((hot.ttft, cold.ttft, _prompt_seconds(hot), _prompt_seconds(cold)))
        for (c, q, batches), by_step in sorted(gaps_by_step.items()):
            # Gap j (j >= 1: the first may still share its step with another request's prefill) is one decode
            # step of c sequences, each holding q + j + 1 tokens.  Four samples per c, prompt length and
            # micro-batches (medians over runs of gaps), so that decode steps do not outweigh the prefill samples.
            for steps in np.array_split(np.arange(1, n_predict - 1), min(4, n_predict - 2)):
                gaps = [g for j in steps.tolist() for g in by_step[j]]
                context = q + 1 + float(np.mean(steps))
                samples.append(StepSample(0, c, round(c * context), float(np.median(gaps)), "decode", batches))
        for c in concurrencies:
            decode[c] = float(np.median([g for (cc, q, _), by_step in gaps_by_step.items() if (cc, q) == (c, prompts[0])
                                         for row in by_step[1:] for g in row]))
        for p in prefill_lengths:
            prefill[p] = float(np.median(prompt_steps[p]))
            ttft[p] = float(np.median(ttfts[p]))
            samples.append(StepSample(p, 0, p, prefill[p], "prefill", 1))
        # A step that prefilled p tokens beside decodes cannot be shorter than the lone prefill of p tokens: such a
        # gap was misread from the streams (a decode step's tokens placed beside the joiner's), and left out.
        misread = [s for s in samples if s.kind == "mixed" and s.seconds < prefill.get(s.prefill_tokens, 0.0)]
        samples = [s for s in samples if s not in misread]
    finally:
        if own:
            client.close()
    slots = n_parallel if n_parallel and n_parallel > 1 else None
    model = replace(fit_step_time(samples, kv=kv, slots=slots), request_overhead=max(0.0, float(np.median(before))),
                    response_overhead=max(0.0, float(np.median(after))))
    if woken:
        hot_ttft, cold_ttft, _, _ = np.array(woken).T
        model = replace(model, wake=max(0.0, float(np.mean(cold_ttft) - np.mean(hot_ttft))), idle_after=wake_pause)
    return StepTimeProfile(model=model, samples=tuple(samples), decode=decode, prefill=prefill, ttft=ttft,
                           elapsed=time.perf_counter() - start, load_average=(load_before, _load_average()),
                           misread=tuple(misread), wake_samples=tuple(woken))


def _micro_batches(slots: Any) -> int:
    # The runs of neighbouring slots the requests ran in (0: a slot the server did not report).
    slots = list(slots)
    return 0 if not slots or min(slots) < 0 else slot_runs(slots)


def _mixed_step(client: LlamaCppClient, c: int, prompt: int, n_predict: int, p: int, wait_s: float,
                timeout: float) -> StepSample | None:
    # c requests decode; after wait_s (about halfway through their first n_predict tokens) one with a p-token
    # prompt joins.  The step that prefills it ends with its first token and one token of each decoding request.
    running = [client.submit(CompletionRequest(prompt_of(prompt), n_predict + 8)) for _ in range(c)]
    time.sleep(wait_s)
    joiner = client.submit(CompletionRequest(prompt_of(p), 1))
    _, not_done = wait([*running, joiner], timeout=timeout)
    if not_done:
        raise TimeoutError(f"{len(not_done)} of {c + 1} profiling requests did not finish in {timeout:.0f} s")
    joined = joiner.result()
    found = mixed_gap([d.sent_at + d.token_times for d in (f.result() for f in running)],
                      joined.sent_at + joined.ttft)
    if found is None:
        return None
    i, seconds = found
    decoding = _micro_batches(f.result().slot for f in running)
    return StepSample(p, c, c * (prompt + i + 1) + p, seconds, "mixed", decoding + 1 if decoding else 0)


def mixed_gap(decoding: Sequence[np.ndarray], joined_at: float, tolerance: float = 3e-3
              ) -> tuple[int, float] | None:
    """Which step of lock-step decoding requests also prefilled a joiner, and how long it took, from token times.

    ``decoding`` holds each decoding request's token arrival times (seconds, one clock), ``joined_at`` the
    joiner's first token.  The step that prefilled it ends with that token and one token of every decoding
    request: returns ``(i, seconds)``, the index of that token and the median, over the decoding requests with a
    token within ``tolerance`` of ``joined_at`` (at least half of them, agreeing on ``i >= 2``), of the gap
    ending there.  ``None`` where the client's times do not say it, and where that gap is no longer than the
    median of their other gaps: a step that prefilled as well as decoded cannot be shorter than one that only
    decoded, so such a gap is a decode step whose token the streams placed beside the joiner's.

    >>> t = np.array([0.0, 0.010, 0.015, 0.020, 0.055, 0.060, 0.065])   # 5 ms decode steps, one of 35 ms
    >>> mixed_gap([t, t + 1e-4], joined_at=0.0552)
    (4, 0.035)
    >>> mixed_gap([t], joined_at=0.0602) is None      # ends a plain decode step
    True
    """
    tolerance = check_number("tolerance", tolerance)
    found: list[tuple[int, float, float]] = []
    for times in decoding:
        times = np.asarray(times, dtype=float)
        if times.ndim != 1 or len(times) < 4:
            continue
        i = int(np.argmin(np.abs(times - joined_at)))
        if i >= 2 and abs(times[i] - joined_at) <= tolerance:
            gaps = np.diff(times)
            found.append((i, float(gaps[i - 1]), float(np.median(np.delete(gaps, i - 1)))))
    if not found or 2 * len(found) < len(decoding) or len({i for i, _, _ in found}) > 1:
        return None
    seconds = float(np.median([g for _, g, _ in found]))
    if seconds <= float(np.median([m for _, _, m in found])):
        return None
    return found[0][0], seconds


def _prompt_seconds(done: Completion) -> float:
    # The server's own time for the request's prefill step (llama.cpp's timings.prompt_ms), seconds.
    ms = done.server_timings.get("prompt_ms")
    if not isinstance(ms, (int, float)) or not 0 < ms < 1e3 * done.ttft:
        raise RuntimeError(f"the server's timings.prompt_ms ({ms!r}) is missing or not inside the client's time to "
                           f"first token ({1e3 * done.ttft:.2f} ms): is this llama.cpp's /completion?")
    return float(ms) / 1e3
