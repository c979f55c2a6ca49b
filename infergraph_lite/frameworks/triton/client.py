"""Talk to a running Triton: one answer, a future per request (the load generators' interface), statistics."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from infergraph_lite.frameworks.triton.tensors import TensorType, json_tensor_types
from infergraph_lite.serving.batcher import QueueFullError, QueueTimeoutError
from infergraph_lite.serving.metrics import StageTimes

__all__ = ["ModelStats", "TritonClient", "request_error"]

# How Triton words a shed request (both with gRPC status UNAVAILABLE): its queue policy's max_queue_size was
# reached, or a request waited past default_timeout_microseconds with timeout_action REJECT.
QUEUE_FULL_TEXT = "Exceeds maximum queue size"
TIMEOUT_TEXT = "Request timeout expired"
DIED_WAIT = 1.0  # seconds a broken request waits for the server's process to be seen ended (see exit_reason)


def request_error(error: Any, model: str, died: str = "") -> Exception:
    """The exception a failed Triton request raises: Triton's refusals as the package's, others as RuntimeError.

    A full queue becomes :class:`~infergraph_lite.serving.batcher.QueueFullError` and an expired request
    :class:`~infergraph_lite.serving.batcher.QueueTimeoutError` (so the load generators count them as
    refused); every one keeps Triton's own message and has Triton's exception as ``__cause__``.  ``died`` is why
    the server's process ended, when it did (:meth:`TritonServer.exit_reason`): it is added to the message.

    >>> from tritonclient.utils import InferenceServerException
    >>> e = request_error(InferenceServerException("in ensemble 'pipeline', Exceeds maximum queue size",
    ...                                            status="StatusCode.UNAVAILABLE"), "pipeline")
    >>> type(e).__name__, e.stage, str(e)
    ('QueueFullError', 'pipeline', "[StatusCode.UNAVAILABLE] in ensemble 'pipeline', Exceeds maximum queue size")
    """
    text = str(error) + (f": {died}" if died else "")
    kind: type[Exception] = RuntimeError
    if QUEUE_FULL_TEXT in text:
        kind = QueueFullError
    elif TIMEOUT_TEXT in text:
        kind = QueueTimeoutError
    wrapped = kind(text, stage=model) if kind is not RuntimeError else RuntimeError(text)  # type: ignore[call-arg]
    if isinstance(error, BaseException):
        wrapped.__cause__ = error
    return wrapped


@dataclass(frozen=True)
class ModelStats:
    """One model's counters from Triton's statistics API (since load, or a difference of two readings).

    ``batch_sizes`` is the histogram Triton's dynamic batcher produced: batch size -> executions;
    ``batch_compute`` the compute seconds (input + infer + output) those executions took, per batch size,
    so ``batch_compute[b] / batch_sizes[b]`` is the mean time of one call with a batch of ``b``.
    Times are totals in seconds; the ``mean_*`` properties divide by the request count.
    """

    name: str
    requests: int = 0  # successful requests
    inferences: int = 0  # items (a request may hold several)
    executions: int = 0  # batches run
    request_time: float = 0.0  # success: arrival to response, summed over requests
    queue_time: float = 0.0
    compute_time: float = 0.0  # input + infer + output
    batch_sizes: dict[int, int] = field(default_factory=dict)
    batch_compute: dict[int, float] = field(default_factory=dict)  # batch size -> compute seconds of its executions

    @property
    def mean_latency(self) -> float:
        return self.request_time / self.requests if self.requests else float("nan")

    @property
    def mean_queue(self) -> float:
        return self.queue_time / self.requests if self.requests else float("nan")

    @property
    def mean_compute(self) -> float:
        return self.compute_time / self.requests if self.requests else float("nan")

    @property
    def mean_batch_size(self) -> float:
        total = sum(self.batch_sizes.values())
        return sum(b * n for b, n in self.batch_sizes.items()) / total if total else float("nan")

    @property
    def call_seconds(self) -> dict[int, float]:
        """Mean compute seconds of one call (one execution), per batch size: the measured s(b).

        >>> ModelStats("m", batch_sizes={1: 4, 8: 2}, batch_compute={1: 0.04, 8: 0.05}).call_seconds
        {1: 0.01, 8: 0.025}
        """
        return {b: self.batch_compute.get(b, 0.0) / n for b, n in self.batch_sizes.items() if n}

    def __sub__(self, earlier: ModelStats) -> ModelStats:
        sizes = {b: n - earlier.batch_sizes.get(b, 0) for b, n in self.batch_sizes.items()}
        compute = {b: t - earlier.batch_compute.get(b, 0.0) for b, t in self.batch_compute.items()}
        return ModelStats(self.name, self.requests - earlier.requests, self.inferences - earlier.inferences,
                          self.executions - earlier.executions, self.request_time - earlier.request_time,
                          self.queue_time - earlier.queue_time, self.compute_time - earlier.compute_time,
                          {b: n for b, n in sorted(sizes.items()) if n},
                          {b: compute.get(b, 0.0) for b, n in sorted(sizes.items()) if n})

    def stage_times(self) -> StageTimes:
        """Per request queue and compute seconds and the mean batch, as
        :class:`~infergraph_lite.serving.loadtest.LoadReport`
        shows a stage."""
        return StageTimes(self.mean_queue, self.mean_compute, self.mean_batch_size)

    @classmethod
    def from_triton(cls, stats: Mapping[str, Any]) -> ModelStats:
        """From one entry of ``get_inference_statistics(as_json=True)['model_stats']``."""
        inference = stats.get("inference_stats", {})

        def seconds(part: str) -> float:
            return int(inference.get(part, {}).get("ns", 0)) / 1e9

        sizes = {int(b["batch_size"]): int(b.get("compute_infer", {}).get("count", 0))
                 for b in stats.get("batch_stats", [])}
        compute = {int(b["batch_size"]): sum(int(b.get(part, {}).get("ns", 0))
                                             for part in ("compute_input", "compute_infer", "compute_output")) / 1e9
                   for b in stats.get("batch_stats", [])}
        return cls(stats["name"], int(inference.get("success", {}).get("count", 0)),
                   int(stats.get("inference_count", 0)), int(stats.get("execution_count", 0)), seconds("success"),
                   seconds("queue"), seconds("compute_input") + seconds("compute_infer") + seconds("compute_output"),
                   {b: n for b, n in sorted(sizes.items()) if n},
                   {b: compute[b] for b, n in sorted(sizes.items()) if n})


def _sum_stats(name: str, parts: Sequence[ModelStats]) -> ModelStats:
    sizes: dict[int, int] = {}
    compute: dict[int, float] = {}
    for p in parts:
        for b, n in p.batch_sizes.items():
            sizes[b] = sizes.get(b, 0) + n
        for b, t in p.batch_compute.items():
            compute[b] = compute.get(b, 0.0) + t
    return ModelStats(name, sum(p.requests for p in parts), sum(p.inferences for p in parts),
                      sum(p.executions for p in parts), sum(p.request_time for p in parts),
                      sum(p.queue_time for p in parts), sum(p.compute_time for p in parts), dict(sorted(sizes.items())),
                      {b: compute.get(b, 0.0) for b in sorted(sizes)})


class TritonClient:
    """Talk to a Triton server: one answer (:meth:`infer`), a future (:meth:`submit`), its statistics.

    ``submit(inputs) -> Future`` is the load generators' interface, so the package's open- and
    closed-loop drivers put load on Triton as they do on the in-process batcher.  Tensor types
    (text, JSON, numbers, arrays) are read from the model's config on the server.

    Triton counts a request a moment after its answer has left (a backend reports its statistics after it
    sends the response), so a count read right after an answer can miss it.  The client therefore keeps, for
    every model it has sent to and each step of such an ensemble (not the steps of a nested one), the count it
    expects: the model's count when the client first read its config (and again after every
    :meth:`load` / :meth:`unload`, which restart counters), plus the answers this client has had since; and
    :meth:`statistics` reads again until the server's counts have caught up (at most ``settle_timeout``
    seconds; then it returns them as they are and expects no more of them).  The expectation is exact when
    none of this client's requests is in flight at those reads; another client's traffic only makes the wait
    shorter.

    Every call waits at most ``timeout`` seconds for the server (gRPC's deadline; a request then fails with
    ``DEADLINE_EXCEEDED``).  ``exit_reason`` says why the server's process ended (``''`` while it runs);
    :meth:`TritonServer.client` passes the server's own, so a request that the server's death breaks off
    fails with an error naming the process and quoting its log.
    """

    def __init__(self, grpc_url: str, model: str = "pipeline", settle_timeout: float = 2.0, *,
                 timeout: float = 120.0, exit_reason: Callable[[float], str] | None = None):
        import tritonclient.grpc as grpcclient  # gRPC only: no gevent, so an interrupted call cannot hang the hub

        self.grpc_url, self.model, self.settle_timeout, self.timeout = grpc_url, model, settle_timeout, timeout
        self._exit_reason = exit_reason
        self._alive_seen = -float("inf")  # when a broken call last found the server still running
        self._grpc = grpcclient
        self._stream = grpcclient.InferenceServerClient(grpc_url)
        self._types: dict[str, tuple[dict[str, TensorType], dict[str, TensorType]]] = {}
        self._members: dict[str, list[str]] = {}  # model -> itself and, for an ensemble, its steps' models
        self._owed: dict[str, int] = {}  # model -> the success count Triton must have reached
        self._seen: dict[str, int] = {}  # model -> its count when last read
        self._owed_lock = threading.Lock()  # answers arrive on gRPC's callback thread
        self._first_use = threading.Lock()

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> TritonClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def tensor_types(self, model: str | None = None) -> tuple[dict[str, TensorType], dict[str, TensorType]]:
        """``(inputs, outputs)`` of a model: tensor name -> :class:`TensorType`, read from its config."""
        model = model or self.model
        if model not in self._types:
            with self._first_use:  # one thread reads the config and the baseline before any sends there
                if model not in self._types:
                    config = self._stream.get_model_config(model, as_json=True, client_timeout=self.timeout)["config"]
                    steps = config.get("ensemble_scheduling", {}).get("step", [])
                    self._members[model] = [model, *dict.fromkeys(step["model_name"] for step in steps)]
                    self._track(self._members[model])
                    self._types[model] = json_tensor_types(config)  # last: other threads send only after this
        return self._types[model]

    def _track(self, models: Sequence[str]) -> None:
        """Start counting what Triton owes for ``models`` from their counts now (those not yet tracked)."""
        new = [name for name in models if name not in self._owed]
        if new:
            counts = self._counts()
            with self._owed_lock:
                for name in new:
                    self._owed.setdefault(name, counts.get(name, 0))
                    self._seen.setdefault(name, counts.get(name, 0))

    def _answered(self, model: str) -> None:
        # a successful answer: the model and every member of an ensemble ran it once more
        with self._owed_lock:
            for name in self._members.get(model, [model]):
                self._owed[name] = self._owed.get(name, 0) + 1

    def _request(self, model: str, rows: Sequence[Mapping[str, Any]]
                 ) -> tuple[list[Any], list[Any], dict[str, TensorType]]:
        """The tensors of one request holding ``rows`` (each ``{input name: value}``), batch dimension first."""
        in_types, out_types = self.tensor_types(model)
        if len(in_types) == 1:  # one input: any name will do
            (only,) = in_types
            rows = [row if set(row) == {only} else {only: next(iter(row.values()))} for row in rows]
        for row in rows:
            missing = set(in_types) - set(row)
            if missing:
                raise ValueError(f"model {model!r} needs inputs {sorted(in_types)}; missing {sorted(missing)}")
        tensors = []
        for name, kind in in_types.items():
            data = kind.encode([row[name] for row in rows])
            tensor = self._grpc.InferInput(name, list(data.shape), kind.wire_type)
            tensor.set_data_from_numpy(data)
            tensors.append(tensor)
        outputs = [self._grpc.InferRequestedOutput(name) for name in out_types]
        return tensors, outputs, out_types

    def _died(self, error: Any) -> str:
        """Why the server's process ended, when ``error`` is a broken connection and it did; else ``''``."""
        if self._exit_reason is None or "UNAVAILABLE" not in str(getattr(error, "status", lambda: "")()):
            return ""
        if QUEUE_FULL_TEXT in str(error) or TIMEOUT_TEXT in str(error):
            return ""  # Triton's refusals share the status: the server is up and said no
        # A killed server's sockets close a moment before it can be reaped: the first broken call waits for that.
        # The failed calls of one broken connection are answered one by one on gRPC's thread, so a server found
        # alive is not waited for again for a while.
        wait = 0.0 if time.monotonic() - self._alive_seen < 10 * DIED_WAIT else DIED_WAIT
        why = self._exit_reason(wait)
        if not why and wait:
            self._alive_seen = time.monotonic()
        return why

    def _failed(self, error: Exception, model: str) -> Exception:
        """What a synchronous call raises: ``error`` itself, unless the server died (then it says so)."""
        died = self._died(error)
        return request_error(error, model, died) if died else error

    @staticmethod
    def _decode_rows(result: Any, out_types: Mapping[str, TensorType]) -> list[dict[str, Any]]:
        columns = {name: kind.decode(result.as_numpy(name)) for name, kind in out_types.items()}
        return [dict(zip(columns, values)) for values in zip(*columns.values())]

    def infer(self, inputs: Mapping[str, Any], model: str | None = None) -> dict[str, Any]:
        """One request: ``{input name: value}`` -> ``{output name: value}``."""
        model = model or self.model
        tensors, outputs, out_types = self._request(model, [inputs])
        try:
            result = self._stream.infer(model, tensors, outputs=outputs, client_timeout=self.timeout)
        except self._grpc.InferenceServerException as error:
            raise self._failed(error, model) from error
        self._answered(model)
        answers = self._decode_rows(result, out_types)
        return answers[0] if answers else {}    # a model without outputs answers nothing

    def infer_rows(self, rows: Sequence[Mapping[str, Any]], model: str | None = None) -> list[dict[str, Any]]:
        """One request holding ``len(rows)`` rows: ``[{input name: value}, ...]`` -> one answer per row, in order.

        Triton counts rows, not requests: the model runs them as one batch of ``len(rows)`` (at most its
        ``max_batch_size``, else the server refuses the request), and whatever the server does once per
        request is done once for all of them.  A dynamic batch of separate one-row requests pays it per row.

        Example (needs a running server, so it is shown, not run; ``tests/test_triton.py`` runs it)::

            with TritonServer(repo) as server, server.client() as client:
                client.infer_rows([{"embed": v} for v in vectors[:3]], model="topic")
            # [{'topic': {'label': 'food', 'confidence': 0.912}}, ...]: one answer per row, in order
        """
        if isinstance(rows, (Mapping, str, bytes)) or not isinstance(rows, Sequence) or not rows:
            raise ValueError(f"rows must be a non-empty list of {{input name: value}} dicts, got {rows!r:.80}")
        model = model or self.model
        tensors, outputs, out_types = self._request(model, rows)
        try:
            result = self._stream.infer(model, tensors, outputs=outputs, client_timeout=self.timeout)
        except self._grpc.InferenceServerException as error:
            raise self._failed(error, model) from error
        self._answered(model)
        return self._decode_rows(result, out_types)

    def submit(self, inputs: Mapping[str, Any], model: str | None = None) -> Future:
        """Send one request without waiting; the future holds ``{output name: value}`` (or the error)."""
        model = model or self.model
        future: Future = Future()
        future.set_running_or_notify_cancel()
        tensors, outputs, out_types = self._request(model, [inputs])

        def done(result: Any, error: Any) -> None:
            if error is not None:
                future.set_exception(request_error(error, model, self._died(error)))
            else:
                self._answered(model)  # before the caller can see the answer and read the counts
                try:
                    answers = self._decode_rows(result, out_types)
                    future.set_result(answers[0] if answers else {})
                except Exception as exc:  # noqa: BLE001 - a decoding problem belongs to the caller
                    future.set_exception(exc)

        self._stream.async_infer(model, tensors, callback=done, outputs=outputs, client_timeout=self.timeout)
        return future

    def statistics(self, model: str = "", version: str = "") -> dict[str, ModelStats]:
        """Per-model counters since load: requests, batch-size histogram, queue and compute time.

        Versions of a model are summed unless ``version`` is given.  Without ``version``, waits (at most
        ``settle_timeout`` seconds) until Triton's counts have reached what this client expects of them (see the
        class's docstring).
        """
        if version:  # what is owed is summed over versions: one version's counts are read as they are
            return self._read_statistics(model, version)
        deadline = time.monotonic() + self.settle_timeout
        while True:
            stats = self._read_statistics(model)
            with self._owed_lock:
                behind = [name for name, owed in self._owed.items() if name in stats and stats[name].requests < owed]
                for name in behind:  # a count that went down was reset (the model was reloaded): owed from here
                    if stats[name].requests < self._seen.get(name, 0):
                        self._owed[name] = stats[name].requests
                self._seen.update({name: stats[name].requests for name in self._owed if name in stats})
                behind = [name for name in behind if stats[name].requests < self._owed[name]]
                if behind and time.monotonic() >= deadline:
                    # a baseline read too high (a request counted before it, answered after) would make every
                    # call wait: after one timeout, what is owed is what Triton counted
                    self._owed.update({name: stats[name].requests for name in behind})
                    behind = []
            if not behind:
                return stats
            time.sleep(0.001)

    def _counts(self) -> dict[str, int]:
        """Every model's success count now, read once."""
        return {name: stats.requests for name, stats in self._read_statistics().items()}

    def _read_statistics(self, model: str = "", version: str = "") -> dict[str, ModelStats]:
        raw = self._stream.get_inference_statistics(model, version, as_json=True,
                                                    client_timeout=self.timeout).get("model_stats", [])
        grouped: dict[str, list[ModelStats]] = {}
        for entry in raw:
            grouped.setdefault(entry["name"], []).append(ModelStats.from_triton(entry))
        return {name: _sum_stats(name, parts) for name, parts in grouped.items()}

    def load(self, model: str) -> None:
        """(Re)load a model from the repository (needs ``model_control="explicit"``): new versions and configs."""
        self._stream.load_model(model, client_timeout=self.timeout)
        self._forget(model)

    def unload(self, model: str) -> None:
        self._stream.unload_model(model, client_timeout=self.timeout)
        self._forget(model)

    def _forget(self, model: str) -> None:
        # A (re)loaded model starts its counters again, and so may every ensemble that Triton reloads with it:
        # count what is owed afresh, for every model, from their counts now.
        self._types.pop(model, None)
        counts = self._counts()
        with self._owed_lock:
            self._owed = {name: counts[name] for name in self._owed if name in counts}
            self._seen = dict(self._owed)

    def ready_versions(self, model: str) -> list[str]:
        """The versions of ``model`` now serving."""
        index = self._stream.get_model_repository_index(as_json=True, client_timeout=self.timeout).get("models", [])
        return sorted(m.get("version", "") for m in index if m["name"] == model and m.get("state") == "READY")
