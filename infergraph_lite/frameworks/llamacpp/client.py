"""A streaming client for OpenAI-compatible LLM servers, with futures, and llama.cpp's counters (notebook 08).

:class:`LlamaCppClient` sends ``/v1/completions`` (and, with :meth:`~LlamaCppClient.chat`,
``/v1/chat/completions``) requests through the official ``openai`` package, streaming, with the usage in the
stream (``stream_options={"include_usage": True}``), and records, per request, when every token arrived, so a
:class:`Completion` knows its time to first token (TTFT), every inter-token gap, its end-to-end latency and its
token count.  Requests ask for ``max_tokens`` with ``ignore_eos`` (vLLM, SGLang and llama.cpp all honour it), so
each produces exactly the tokens asked for (the tiny random model's text is gibberish anyway).  The same client
talks to vLLM, SGLang or any OpenAI-compatible server: give it their ``url``, ``api_key`` and ``model``.

llama.cpp adds its own fields, sent through the ``openai`` package's ``extra_body`` and read from the chunks'
extra fields: ``timings_per_token`` puts its ``timings`` (``predicted_n``: tokens so far; ``prompt_ms``, ...)
in every chunk, ``cache_prompt`` (off unless the client is made with ``cache_prompt=True``: then a request reuses the
longest common prefix its slot still holds, and :attr:`Completion.cached_tokens` says how much) and a ``logit_bias``
that bans tokens.  Other servers ignore them.  The
OpenAI-compatible stream does not say which slot served a request; ``api="llamacpp"`` streams llama.cpp's own
``/completion`` endpoint instead (same client, same ``openai`` HTTP stack), whose answers carry the slot id.

``submit(item) -> Future`` makes it a target for :func:`~infergraph_lite.serving.loadtest.run_open_loop` and
:func:`~infergraph_lite.serving.loadtest.run_closed_loop`; :meth:`~LlamaCppClient.llm_metrics` summarises its
answers by vLLM's benchmark metrics (:class:`~infergraph_lite.core.llm_metrics.LLMMetrics`).

:func:`parse_prometheus` turns ``/metrics`` into a dict; :func:`counter_delta` and :func:`tokens_per_decode`
read what happened between two snapshots (how many tokens each ``llama_decode`` call produced: 1 when
requests are served one at a time, up to ``n_parallel`` when they are batched).
"""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

import numpy as np

from infergraph_lite.core.arguments import check_count, check_int, check_number
from infergraph_lite.core.llm_metrics import LLMMetrics

__all__ = ["Completion", "CompletionRequest", "LlamaCppClient", "RequestError", "SlotMonitor", "counter_delta",
           "parse_prometheus", "tokens_per_decode"]

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
    token.  ``prompt_tokens`` is what the server evaluated (the prompt plus its ``<s>``: the usage's
    ``prompt_tokens``); ``stop_type`` why it stopped, by llama.cpp's names (``"limit"``: OpenAI's finish reason
    ``"length"``; otherwise the finish reason, ``"stop"``); ``server_timings`` is llama.cpp's own ``timings``
    record (``prompt_ms``, ``predicted_per_token_ms``, ...; empty from servers that send none); ``slot`` the slot
    that served it (-1: not reported, as on the OpenAI-compatible endpoints; see ``api="llamacpp"``).
    ``cached_tokens`` is how many prompt tokens the server took from its prompt cache instead of computing them
    (llama.cpp's ``timings.cache_n``, or the usage's ``prompt_tokens_details.cached_tokens`` as vLLM and SGLang
    report it; -1: the server did not say); :attr:`prompt_evaluated` the prompt tokens it computed.
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
    cached_tokens: int = -1         # prompt tokens reused from the server's cache (-1: not reported)

    @property
    def prompt_evaluated(self) -> int:
        """Prompt tokens the server computed: llama.cpp's ``timings.prompt_n``, else the prompt less its cached
        tokens (all of it when the server reports no cache)."""
        if "prompt_n" in self.server_timings:
            return int(self.server_timings["prompt_n"])
        return self.prompt_tokens - max(self.cached_tokens, 0)

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
        """Mean time per output token after the first (the mean gap: vLLM's TPOT with the end at the last token), s."""
        gaps = self.gaps
        return float(gaps.mean()) if len(gaps) else math.nan


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text format -> ``{name: value}``; the ``llamacpp:`` prefix is dropped, labels kept in the name.

    Parsed by ``prometheus_client``'s own parser (the format has escapes, timestamps and types a hand-written
    split gets wrong); a sample with labels is keyed ``name{label="value",...}``.

    >>> parse_prometheus('# HELP x y\\nllamacpp:n_decode_total 12\\nllamacpp:n_busy_slots_per_decode 3.5\\n')
    {'n_decode_total': 12.0, 'n_busy_slots_per_decode': 3.5}
    """
    from prometheus_client.parser import text_string_to_metric_families  # installed with Ray; only needed here

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sample.labels.items())
            name = sample.name.removeprefix("llamacpp:") + (f"{{{labels}}}" if labels else "")
            out[name] = float(sample.value)
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


def _event(chunk: Any) -> dict[str, Any]:
    # The fields the client reads from one typed OpenAI chunk, llama.cpp's timings from its extra fields.  Not
    # chunk.model_dump(): that costs the client CPU on every token, which on 2 cores the server pays for too.
    choices = [{"text": c.delta.content if hasattr(c, "delta") else c.text, "finish_reason": c.finish_reason}
               for c in chunk.choices]
    usage = chunk.usage
    details = usage and getattr(usage, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None) if details is not None else None
    return {"choices": choices, "timings": (chunk.model_extra or {}).get("timings"),
            "usage": usage and {"completion_tokens": usage.completion_tokens, "prompt_tokens": usage.prompt_tokens,
                                "cached_tokens": cached}}


class LlamaCppClient:
    """Streams completions from an OpenAI-compatible server; ``submit`` returns a Future of a :class:`Completion`.

    ``url`` is the server's root (``http://127.0.0.1:PORT``; ``/v1`` is added) and ``api_key``, ``model`` what the
    server asks for (llama.cpp, started without a key, takes any).  Pointing it at vLLM or SGLang is those three
    arguments.  At most ``max_in_flight`` requests are open at once (one thread each); more wait in the client, in
    submit order.  Keep it at least ``n_parallel`` so that the server, not the client, queues requests.
    ``n_predict`` is the default token count; ``timeout`` bounds each wait on the server (seconds: the connection,
    and each read of the stream, so a request whose server stops answering fails), and nothing is retried (a
    retry would hide a dead server).  ``exit_reason`` says why the server's process ended (``''`` while it runs);
    :meth:`LlamaCppServer.client` passes the server's own, so a request broken off by the server's death fails with
    a ``RequestError`` that names the process and quotes its log.  ``banned_tokens`` are never generated (a
    llama.cpp ``logit_bias``): :meth:`LlamaCppServer.client` bans the tiny model's byte-fallback tokens, since
    llama.cpp holds back a token that ends inside a UTF-8 character and streams it with the next one, which would
    hide that token's arrival time (a zero gap).  ``api="llamacpp"`` streams llama.cpp's own ``/completion``
    endpoint instead, whose answers also say which slot served each request (:attr:`Completion.slot`).
    ``cache_prompt=True`` lets each request reuse what its slot still holds of an earlier prompt (llama.cpp's
    prompt cache; off by default, so that every request pays its whole prefill, as notebook 08 measures it).

    >>> from infergraph_lite.frameworks.llamacpp.model import write_tiny_llama
    >>> from infergraph_lite.frameworks.llamacpp.server import LlamaCppServer
    >>> model = write_tiny_llama(embd=64, layers=1, ff=128, heads=4, kv_heads=2, ctx=512)
    >>> with LlamaCppServer(model, n_parallel=2) as server, server.client(n_predict=5) as client:
    ...     done = client.submit("the model").result(timeout=60)
    ...     chat = client.chat([{"role": "user", "content": "hello"}], n_predict=3)
    >>> done.n_tokens, len(done.gaps), 0 < done.ttft <= done.e2e, chat.n_tokens
    (5, 4, True, 3)
    """

    def __init__(self, url: str, *, n_predict: int = 32, max_in_flight: int = 64, timeout: float = 120.0,
                 temperature: float = 0.0, seed: int = 0, banned_tokens: Sequence[int] = (),
                 exit_reason: Callable[[float], str] | None = None, api_key: str = "none", model: str = "",
                 api: Literal["openai", "llamacpp"] = "openai", cache_prompt: bool = False) -> None:
        import openai  # the OpenAI-compatible client: imported here, so the package imports without it

        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url must look like http://127.0.0.1:PORT, got {url!r}")
        if api not in ("openai", "llamacpp"):
            raise ValueError(f"api must be 'openai' (/v1/completions) or 'llamacpp' (/completion), got {api!r}")
        n_predict = check_count("n_predict", n_predict)      # numpy integers too, stored as ints (they go to JSON)
        max_in_flight = check_count("max_in_flight", max_in_flight)
        self.url = url.rstrip("/").removesuffix("/v1")
        self.n_predict = n_predict
        self.timeout = check_number("timeout", timeout)
        self.temperature = check_number("temperature", temperature, positive=False)
        self.seed = check_int("seed", seed, minimum=-1)     # llama.cpp's -1: a random seed per request
        self.banned_tokens = tuple(int(t) for t in banned_tokens)
        self.max_in_flight = max_in_flight
        self.model = model
        self.api = api
        if not isinstance(cache_prompt, (bool, np.bool_)):
            raise TypeError(f"cache_prompt must be True or False, got {cache_prompt!r}")
        self.cache_prompt = bool(cache_prompt)
        self._exit_reason = exit_reason
        # No retries (max_retries=0): a retry would hide a dead server.  And one connection per request
        # ("Connection: close"): a pooled connection that llama.cpp had already closed failed a request ("Server
        # disconnected without sending a response"), which nothing would retry.
        self.openai_client = openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, timeout=self.timeout,
                                           max_retries=0, default_headers={"Connection": "close"})
        self._pool = ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="llm-client")
        self._lock = threading.Lock()
        self.completions: list[Completion] = []       # every answered request, in answer order

    # --- requests -------------------------------------------------------------------------------------------
    def _request(self, item: Any) -> tuple[str | list[dict[str, Any]], int]:
        # (a prompt str or chat messages, the token count), checked before anything is sent
        if isinstance(item, CompletionRequest):
            prompt, n = item.prompt, item.n_predict
        elif isinstance(item, str):
            prompt, n = item, None
        elif isinstance(item, Mapping) and ("prompt" in item or "messages" in item):
            prompt, n = item.get("prompt", item.get("messages")), item.get("n_predict")
        else:
            raise TypeError("a request is a prompt str, a CompletionRequest, a {'prompt': ...} or a "
                            f"{{'messages': [...]}} dict; got {item!r}")
        n = self.n_predict if n is None else n
        if isinstance(prompt, list):
            if not all(isinstance(m, Mapping) and "role" in m and "content" in m for m in prompt):
                raise TypeError(f"messages must be [{{'role': ..., 'content': ...}}, ...], got {prompt!r}")
        elif not isinstance(prompt, str):
            raise TypeError(f"prompt must be a str, got {type(prompt).__name__}")
        return prompt, check_count("n_predict", n)

    def _extra_body(self) -> dict[str, Any]:
        # Beyond the OpenAI API: ignore_eos (vLLM, SGLang, llama.cpp) makes max_tokens exact; the rest is
        # llama.cpp's: its timings in every chunk (predicted_n counts the tokens so far), its prompt cache (off
        # unless asked: each request pays its prefill, as the simulator assumes), and banned tokens (false: never).
        body: dict[str, Any] = {"ignore_eos": True, "timings_per_token": True, "cache_prompt": self.cache_prompt}
        if self.banned_tokens:
            body["logit_bias"] = [[t, False] for t in self.banned_tokens]
        return body

    def _stream(self, prompt: str | list[dict[str, Any]], n_predict: int) -> Iterable[dict[str, Any]]:
        """The answer's chunks as dicts, with the fields the OpenAI schema lacks (llama.cpp's ``timings``)."""
        if self.api == "llamacpp":
            return self._stream_llamacpp(prompt, n_predict)
        options: dict[str, Any] = {"model": self.model, "max_tokens": n_predict, "temperature": self.temperature,
                                   "seed": self.seed, "stream_options": {"include_usage": True},
                                   "extra_body": self._extra_body()}
        if isinstance(prompt, list):                # chat messages: the server applies its chat template
            messages: Any = prompt                  # OpenAI's typed message dicts: {'role': ..., 'content': ...}
            stream: Iterable[Any] = self.openai_client.chat.completions.create(messages=messages, stream=True,
                                                                               **options)
        else:
            stream = self.openai_client.completions.create(prompt=prompt, stream=True, **options)
        return (_event(chunk) for chunk in stream)

    def _stream_llamacpp(self, prompt: str | list[dict[str, Any]], n_predict: int) -> Iterable[dict[str, Any]]:
        # llama.cpp's own /completion stream (its events say the slot), through the same openai HTTP client
        import openai

        body = {"prompt": prompt, "n_predict": n_predict, "temperature": self.temperature, "seed": self.seed,
                "stream": True, "return_tokens": True, **self._extra_body()}
        events: Iterable[Any] = self.openai_client.post(
            self.url + "/completion", body=body, cast_to=object, stream=True, stream_cls=openai.Stream[object])
        return events      # each event a dict (cast_to=object: the JSON as it came)

    def complete(self, item: str | CompletionRequest | Mapping[str, Any]) -> Completion:
        """Send one request and stream its answer (blocking); raises :class:`RequestError` on refusal.

        A ``{'messages': [...]}`` item goes to ``/v1/chat/completions`` (see :meth:`chat`).
        """
        import openai

        prompt, n_predict = self._request(item)
        endpoint = "/completion" if self.api == "llamacpp" else (
            "/v1/chat/completions" if isinstance(prompt, list) else "/v1/completions")
        times: list[float] = []
        pieces: list[str] = []
        state: dict[str, Any] = {}
        start = time.perf_counter()
        try:
            for event in self._stream(prompt, n_predict):
                now = time.perf_counter() - start
                text, count = self._read(event, len(times), state)
                # count is every token so far: one chunk can carry more than one (llama.cpp holds back a token
                # whose bytes end inside a UTF-8 character and sends it with the next), and they arrived together
                times.extend([now] * (count - len(times)))
                pieces.append(text)
            e2e = time.perf_counter() - start
        except openai.APIStatusError as error:     # the server answered, and refused: 400 for a too-long prompt
            said = json.dumps(error.body) if error.body is not None else error.message     # the server's own words
            raise RequestError(f"{endpoint} answered {error.status_code}: {said}"[:700], error.status_code) from error
        except (openai.APIError, OSError) as error:  # connection refused or broken off, a timeout, a broken stream
            raise self._broken_off(f"{endpoint} at {self.url} failed: {error!r}") from error
        if "finish" not in state:
            raise self._broken_off(f"{endpoint} stream at {self.url} ended without its final event")
        n_tokens = int(state.get("n_tokens", len(times)))
        if n_tokens > len(times) and "timings" not in state:
            times.extend(times[-1:] * (n_tokens - len(times)))    # a server that sent tokens several to a chunk
        if n_tokens != len(times):
            raise RequestError(f"the server reported {n_tokens} tokens but streamed {len(times)}")
        if n_tokens < n_predict:
            # llama.cpp stops a sequence whose slot is full and calls it done; say so instead of short-counting.
            raise RequestError(f"asked for n_predict={n_predict} tokens, got {n_tokens}: the prompt "
                               f"({state.get('prompt_tokens', '?')} tokens) plus the output did not fit the slot's "
                               "context (n_ctx / n_parallel KV cells)", 0)
        timings = dict(state.get("timings") or {})
        prompt_tokens = int(state.get("prompt_tokens", 0))
        cached = timings.get("cache_n", state.get("cached_tokens"))
        if cached is None and "prompt_n" in timings:
            cached = prompt_tokens - int(timings["prompt_n"])
        done = Completion(text="".join(pieces), n_tokens=n_tokens, prompt_tokens=prompt_tokens,
                          token_times=np.asarray(times), e2e=e2e, stop_type=str(state["finish"]),
                          slot=int(state.get("slot", -1)), server_timings=timings, sent_at=start,
                          cached_tokens=-1 if cached is None else int(cached))
        with self._lock:
            self.completions.append(done)
        return done

    @staticmethod
    def _read(event: Mapping[str, Any], seen: int, state: dict[str, Any]) -> tuple[str, int]:
        # One chunk -> (its text, tokens so far); the answer's totals go into state.  llama.cpp's timings (in the
        # chunk's extra fields) count the tokens exactly; without them a chunk with text is one token.
        if "error" in event:
            raise RequestError(f"stream error: {event['error']}", 500)
        timings = event.get("timings")
        if timings:
            state["timings"] = timings
        if "choices" not in event:                       # llama.cpp's own /completion stream
            count = int(event.get("tokens_predicted", seen + len(event.get("tokens") or ())))
            if event.get("stop"):
                state.update(finish=event.get("stop_type", ""), n_tokens=count, slot=event.get("id_slot", -1),
                             prompt_tokens=event.get("tokens_evaluated", 0))
            return str(event.get("content", "")), count
        text = ""
        for choice in event["choices"]:
            delta = choice.get("delta")
            text += str((delta.get("content") if delta is not None else choice.get("text")) or "")
            if choice.get("finish_reason"):
                state["finish"] = "limit" if choice["finish_reason"] == "length" else choice["finish_reason"]
        usage = event.get("usage")
        if usage:
            state.update(n_tokens=usage["completion_tokens"], prompt_tokens=usage["prompt_tokens"])
            if usage.get("cached_tokens") is not None:
                state["cached_tokens"] = usage["cached_tokens"]
        if timings and "predicted_n" in timings:
            return text, int(timings["predicted_n"])
        return text, seen + (1 if text else 0)

    def chat(self, messages: Sequence[Mapping[str, Any]], n_predict: int | None = None) -> Completion:
        """One ``/v1/chat/completions`` request, streamed and timed like :meth:`complete` (blocking).

        ``messages`` are OpenAI's ``[{"role": "user", "content": "..."}]``; the server applies its chat template, so
        ``prompt_tokens`` counts the template's tokens too.
        """
        return self.complete({"messages": [dict(m) for m in messages], "n_predict": n_predict})

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

    def llm_metrics(self, *, slo: Mapping[str, float] | None = None, percentiles: Sequence[float] = (99,),
                    completions: Sequence[Completion] | None = None) -> LLMMetrics:
        """vLLM's serving metrics (TTFT, TPOT, ITL, E2EL, throughputs, goodput for ``slo``) of the answers.

        Over ``completions`` (default: every answer so far); E2EL is each stream's end, the duration runs from the
        first send to the last end.  See :class:`~infergraph_lite.core.llm_metrics.LLMMetrics`.
        """
        done = list(self.completions if completions is None else completions)
        if not done:
            raise ValueError("no completions to summarise")
        return LLMMetrics.from_token_times([d.token_times for d in done], sent=[d.sent_at for d in done],
                                           e2el=[d.e2e for d in done], slo=slo, percentiles=percentiles)

    # --- the server's state (llama.cpp's own endpoints) ------------------------------------------------------
    def _call(self, path: str, body: Mapping[str, Any] | None = None) -> bytes:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=10.0) as response:
                answer: bytes = response.read()
                return answer
        except urllib.error.HTTPError as error:
            raise RequestError(f"{path} answered {error.code}: {error.read()[:300]!r}", error.code) from error

    def metrics(self) -> dict[str, float]:
        """``/metrics`` as a dict (see :func:`parse_prometheus`)."""
        return parse_prometheus(self._call("/metrics").decode())

    def slots(self) -> list[dict[str, Any]]:
        """``/slots``: one dict per slot (``id``, ``n_ctx``, ``is_processing``, ...)."""
        data: list[dict[str, Any]] = json.loads(self._call("/slots"))
        return data

    def busy_slots(self) -> int:
        """How many slots are processing a request now."""
        return sum(1 for s in self.slots() if s.get("is_processing"))

    def tokenize(self, text: str) -> list[int]:
        """The token ids the server's tokenizer gives ``text`` (without ``<s>``)."""
        tokens: list[int] = json.loads(self._call("/tokenize", {"content": text}))["tokens"]
        return tokens

    # --- life cycle -----------------------------------------------------------------------------------------
    def close(self) -> None:
        """Wait for open requests (each bounded by ``timeout``) and stop the threads."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.openai_client.close()

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
