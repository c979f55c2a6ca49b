"""A streaming client for llama.cpp's server, with futures, and its counters (notebook 08).

:class:`LlamaCppClient` sends ``/completion`` requests with ``stream: true`` and records, per request, when
every token arrived (server-sent events, one event per token), so a :class:`Completion` knows its
time to first token (TTFT), every inter-token gap, its end-to-end latency and its token count.  Requests
use ``n_predict`` with ``ignore_eos``, so each produces exactly the tokens asked for (the tiny random
model's text is gibberish anyway).  ``submit(item) -> Future`` makes it a target for
:func:`~infergraph_lite.serving.loadtest.run_open_loop` and
:func:`~infergraph_lite.serving.loadtest.run_closed_loop`.

:func:`parse_prometheus` turns ``/metrics`` into a dict; :func:`counter_delta` and :func:`tokens_per_decode`
read what happened between two snapshots (how many tokens each ``llama_decode`` call produced: 1 when
requests are served one at a time, up to ``n_parallel`` when they are batched).
"""

from __future__ import annotations

import http.client
import json
import math
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import numpy as np

__all__ = ["Completion", "CompletionRequest", "LlamaCppClient", "RequestError", "SlotMonitor", "counter_delta",
           "parse_prometheus", "tokens_per_decode"]

from infergraph_lite.core.arguments import check_count, check_int, check_number

DIED_WAIT = 1.0  # seconds a broken request waits for its server's process to be seen ended (see exit_reason)


class RequestError(RuntimeError):
    """The server refused or broke off a request; ``status`` is the HTTP status (0: connection error).

    When the server's process died, the message says so: its PID, how it ended and its log's last line.
    """

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class CompletionRequest:
    """One request: a prompt and the exact number of tokens to generate (``None``: the client's default)."""

    prompt: str
    n_predict: int | None = None


@dataclass(frozen=True)
class Completion:
    """One streamed completion, timed on the client.

    ``token_times`` are seconds from sending the request to each token's arrival, one per generated
    token.  ``prompt_tokens`` is what the server evaluated (the prompt plus its ``<s>``); ``server_timings``
    is llama.cpp's own ``timings`` record (``prompt_ms``, ``predicted_per_token_ms``, ...); ``slot`` the slot
    that served it.
    """

    text: str
    n_tokens: int
    prompt_tokens: int
    token_times: np.ndarray
    e2e: float
    stop_type: str = "limit"
    slot: int = -1
    server_timings: Mapping[str, float] = field(default_factory=dict)
    sent_at: float = math.nan       # time.perf_counter() when the request was sent

    @property
    def done_at(self) -> float:
        """``time.perf_counter()`` when the stream ended (``sent_at + e2e``; its last token came a little before)."""
        return self.sent_at + self.e2e

    @property
    def ttft(self) -> float:
        """Time to first token, seconds (includes queueing in the server and the prefill)."""
        return float(self.token_times[0]) if len(self.token_times) else math.nan

    @property
    def gaps(self) -> np.ndarray:
        """Every inter-token gap, seconds (``n_tokens - 1`` of them)."""
        return np.diff(self.token_times)

    @property
    def tpot(self) -> float:
        """Mean time per output token after the first (the mean gap), seconds."""
        gaps = self.gaps
        return float(gaps.mean()) if len(gaps) else math.nan


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text format -> ``{name: value}``; the ``llamacpp:`` prefix is dropped, labels kept in the name.

    >>> parse_prometheus('# HELP x y\\nllamacpp:n_decode_total 12\\nllamacpp:n_busy_slots_per_decode 3.5\\n')
    {'n_decode_total': 12.0, 'n_busy_slots_per_decode': 3.5}
    """
    out: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "}" in line:                      # name{label="x"} value [timestamp]
            cut = line.rindex("}") + 1
            name, rest = line[:cut], line[cut:].split()
        else:
            name, *rest = line.split()
        value = rest[0] if rest else ""
        try:
            out[name.removeprefix("llamacpp:")] = float(value)
        except ValueError:
            continue
    return out


def counter_delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """``after - before`` for every counter (names ending ``_total``) in both snapshots.

    >>> counter_delta({"n_decode_total": 5, "x": 1}, {"n_decode_total": 9, "x": 7})
    {'n_decode_total': 4}
    """
    return {k: after[k] - before[k] for k in after if k.endswith("_total") and k in before}


def tokens_per_decode(before: Mapping[str, float], after: Mapping[str, float]) -> float:
    """Tokens generated per ``llama_decode`` call between two ``/metrics`` snapshots (nan: no decode calls).

    Prompt-only decode calls count too, so a batch of ``c`` decoding sequences reads slightly below ``c``.

    >>> tokens_per_decode({"tokens_predicted_total": 0, "n_decode_total": 0},
    ...                   {"tokens_predicted_total": 64, "n_decode_total": 10})
    6.4
    """
    d = counter_delta(before, after)
    calls = d.get("n_decode_total", 0.0)
    return d.get("tokens_predicted_total", 0.0) / calls if calls else math.nan


class LlamaCppClient:
    """Streams ``/completion`` requests to a llama.cpp server; ``submit`` returns a Future of a :class:`Completion`.

    At most ``max_in_flight`` requests are open at once (one thread each); more wait in the client, in
    submit order.  Keep it at least ``n_parallel`` so that the server, not the client, queues requests.
    ``n_predict`` is the default token count; ``timeout`` bounds each wait on the server (seconds: the
    connection, and each read of the stream, so a request whose server stops answering fails).  ``exit_reason``
    says why the server's process ended (``''`` while it runs); :meth:`LlamaCppServer.client` passes the
    server's own, so a request broken off by the server's death fails with a ``RequestError`` that names the
    process and quotes its log.  ``banned_tokens``
    are never generated: :meth:`LlamaCppServer.client` bans the tiny model's byte-fallback tokens, since
    llama.cpp holds back a token that ends inside a UTF-8 character and streams it with the next one, which
    would hide that token's arrival time (a zero gap).

    >>> from infergraph_lite.frameworks.llamacpp_model import write_tiny_llama
    >>> from infergraph_lite.frameworks.llamacpp_server import LlamaCppServer
    >>> model = write_tiny_llama(embd=64, layers=1, ff=128, heads=4, kv_heads=2, ctx=512)
    >>> with LlamaCppServer(model, n_parallel=2) as server, server.client(n_predict=5) as client:
    ...     done = client.submit("the model").result(timeout=60)
    >>> done.n_tokens, len(done.gaps), 0 < done.ttft <= done.e2e
    (5, 4, True)
    """

    def __init__(self, url: str, *, n_predict: int = 32, max_in_flight: int = 64, timeout: float = 120.0,
                 temperature: float = 0.0, seed: int = 0, banned_tokens: Sequence[int] = (),
                 exit_reason: Callable[[float], str] | None = None) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ValueError(f"url must look like http://127.0.0.1:PORT, got {url!r}")
        n_predict = check_count("n_predict", n_predict)      # numpy integers too, stored as ints (they go to JSON)
        max_in_flight = check_count("max_in_flight", max_in_flight)
        self.url = url
        self._host, self._port = parts.hostname, parts.port
        self.n_predict = n_predict
        self.timeout = check_number("timeout", timeout)
        self.temperature = check_number("temperature", temperature, positive=False)
        self.seed = check_int("seed", seed, minimum=-1)     # llama.cpp's -1: a random seed per request
        self.banned_tokens = tuple(int(t) for t in banned_tokens)
        self.max_in_flight = max_in_flight
        self._exit_reason = exit_reason
        self._pool = ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="llamacpp-client")
        self._lock = threading.Lock()
        self.completions: list[Completion] = []       # every answered request, in answer order

    # --- requests -------------------------------------------------------------------------------------------
    def _request(self, item: Any) -> tuple[str, int]:
        if isinstance(item, CompletionRequest):
            prompt, n = item.prompt, item.n_predict
        elif isinstance(item, str):
            prompt, n = item, None
        elif isinstance(item, Mapping) and "prompt" in item:
            prompt, n = item["prompt"], item.get("n_predict")
        else:
            raise TypeError(f"a request is a prompt str, a CompletionRequest or a {{'prompt': ...}} dict; got {item!r}")
        n = self.n_predict if n is None else n
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
        return prompt, check_count("n_predict", n)

    def complete(self, item: str | CompletionRequest | Mapping[str, Any]) -> Completion:
        """Send one request and stream its answer (blocking); raises :class:`RequestError` on refusal."""
        prompt, n_predict = self._request(item)
        body = json.dumps({"prompt": prompt, "n_predict": n_predict, "ignore_eos": True, "stream": True,
                           "return_tokens": True, "temperature": self.temperature, "seed": self.seed,
                           "cache_prompt": False, "logit_bias": [[t, False] for t in self.banned_tokens]})
        conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout)
        times: list[float] = []
        pieces: list[str] = []
        final: dict[str, Any] = {}
        try:
            start = time.perf_counter()
            conn.request("POST", "/completion", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            if response.status != 200:
                raise RequestError(f"/completion answered {response.status}: "
                                   f"{response.read().decode(errors='replace')[:500]}", response.status)
            while True:
                line = response.readline()
                if not line:
                    break
                if not line.startswith(b"data: "):
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    raise RequestError(f"/completion stream error: {event['error']}", 500)
                now = time.perf_counter() - start
                # tokens_predicted counts every token so far: an event can carry more than one, since llama.cpp
                # holds back a token whose bytes end inside a UTF-8 character and sends it with the next.
                count = int(event.get("tokens_predicted", len(times) + len(event.get("tokens") or ())))
                times.extend([now] * (count - len(times)))
                pieces.append(event.get("content", ""))
                if event.get("stop"):
                    final = event
                    break
            e2e = time.perf_counter() - start
        except (OSError, http.client.HTTPException) as error:
            raise self._broken_off(f"/completion at {self.url} failed: {error!r}") from error
        finally:
            conn.close()
        if not final:
            raise self._broken_off(f"/completion stream at {self.url} ended without its final event")
        n_tokens = int(final.get("tokens_predicted", len(times)))
        if n_tokens != len(times):
            raise RequestError(f"the server reported {n_tokens} tokens but streamed {len(times)}")
        if n_tokens < n_predict:
            # llama.cpp stops a sequence whose slot is full and calls it done; say so instead of short-counting.
            raise RequestError(f"asked for n_predict={n_predict} tokens, got {n_tokens}: the prompt "
                               f"({final.get('tokens_evaluated', '?')} tokens) plus the output did not fit the slot's "
                               "context (n_ctx / n_parallel KV cells)", 0)
        done = Completion(text="".join(pieces), n_tokens=n_tokens, prompt_tokens=int(final.get("tokens_evaluated", 0)),
                          token_times=np.asarray(times), e2e=e2e, stop_type=str(final.get("stop_type", "")),
                          slot=int(final.get("id_slot", -1)), server_timings=dict(final.get("timings", {})),
                          sent_at=start)
        with self._lock:
            self.completions.append(done)
        return done

    def _broken_off(self, what: str) -> RequestError:
        # A connection that breaks, or a stream that stops short, is most often a server that died: ask it
        # (waiting up to DIED_WAIT s for its process to be seen ended), and say so, with its PID and log line.
        why = self._exit_reason(DIED_WAIT) if self._exit_reason is not None else ""
        return RequestError(f"{what}: {why}" if why else what)

    def submit(self, item: str | CompletionRequest | Mapping[str, Any]) -> Future[Completion]:
        """Queue one request; its Future holds the :class:`Completion` (or the :class:`RequestError`).

        Bad requests (a non-str prompt, ``n_predict < 1``) raise here, before anything is sent.
        """
        self._request(item)
        return self._pool.submit(self.complete, item)

    # --- the server's state ---------------------------------------------------------------------------------
    def _get(self, path: str) -> bytes:
        conn = http.client.HTTPConnection(self._host, self._port, timeout=10.0)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            data = response.read()
            if response.status != 200:
                raise RequestError(f"{path} answered {response.status}: {data[:300]!r}", response.status)
            return data
        finally:
            conn.close()

    def metrics(self) -> dict[str, float]:
        """``/metrics`` as a dict (see :func:`parse_prometheus`)."""
        return parse_prometheus(self._get("/metrics").decode())

    def slots(self) -> list[dict[str, Any]]:
        """``/slots``: one dict per slot (``id``, ``n_ctx``, ``is_processing``, ...)."""
        data: list[dict[str, Any]] = json.loads(self._get("/slots"))
        return data

    def busy_slots(self) -> int:
        """How many slots are processing a request now."""
        return sum(1 for s in self.slots() if s.get("is_processing"))

    def tokenize(self, text: str) -> list[int]:
        """The token ids the server's tokenizer gives ``text`` (without ``<s>``)."""
        conn = http.client.HTTPConnection(self._host, self._port, timeout=10.0)
        try:
            conn.request("POST", "/tokenize", json.dumps({"content": text}), {"Content-Type": "application/json"})
            tokens: list[int] = json.loads(conn.getresponse().read())["tokens"]
            return tokens
        finally:
            conn.close()

    # --- life cycle -----------------------------------------------------------------------------------------
    def close(self) -> None:
        """Wait for open requests (each bounded by ``timeout``) and stop the threads."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> LlamaCppClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


class SlotMonitor:
    """Samples ``/slots`` in a thread while a block runs: how many slots were busy, and when.

    ``times`` (seconds since the monitor started) and ``busy`` (slots processing then) are the samples;
    ``peak`` is the most slots seen busy at once.  ``source`` is anything with ``busy_slots()`` (a
    :class:`LlamaCppClient` or a ``LlamaCppServer``).  The thread samples every ``interval`` seconds and stops
    when the block ends, at the latest after ``max_seconds``; it always takes a first sample, however short the
    block.

    >>> class Fake:
    ...     def busy_slots(self):
    ...         return 3
    >>> with SlotMonitor(Fake(), interval=0.01) as monitor:
    ...     time.sleep(0.05)
    >>> monitor.peak, len(monitor.busy) == len(monitor.times) > 0
    (3, True)
    """

    def __init__(self, source: Any, *, interval: float = 0.02, max_seconds: float = 600.0) -> None:
        if not callable(getattr(source, "busy_slots", None)):
            raise TypeError(f"source must have busy_slots() (a LlamaCppClient or LlamaCppServer), got {source!r}")
        if not interval > 0 or not max_seconds > 0:
            raise ValueError(f"interval and max_seconds must be > 0 seconds, got {interval!r}, {max_seconds!r}")
        self.source = source
        self.interval = float(interval)
        self.max_seconds = float(max_seconds)
        self.times: list[float] = []
        self.busy: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="llamacpp-slots", daemon=True)

    def _run(self) -> None:
        start = time.perf_counter()
        while True:                 # sample first, then check: a block shorter than one interval still gets one
            try:
                busy = int(self.source.busy_slots())
            except (OSError, RequestError, RuntimeError):
                busy = -1           # the server did not answer this once; not a sample
            if busy >= 0:
                self.times.append(time.perf_counter() - start)
                self.busy.append(busy)
            if self._stop.wait(self.interval) or time.perf_counter() - start >= self.max_seconds:
                break

    @property
    def peak(self) -> int:
        return max(self.busy, default=0)

    def __enter__(self) -> SlotMonitor:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(timeout=10.0)
