"""The hand-offs a Triton ensemble adds to its steps, measured from lone requests (notebook 07, section 6).

Notebook 07's twin of a Triton server gives each step the compute time Triton's statistics report for it.  A
request through the ensemble also waits between the steps: the ensemble scheduler hands each step's output to
the next model's scheduler, whose thread then starts the call.  Triton counts that wait as the model's *queue*
time.  Under load the queue also holds requests waiting behind busy instances (what the twin simulates); sent
alone, with nothing ahead, a request's queue time is the hand-off and, for a model whose dynamic batcher has a
``max_queue_delay``, that delay (the twin's batching policy waits it already).  So lone requests measure the
hand-off per model,
as a ``hop_delay`` for :func:`~infergraph_lite.simulation.graph.simulate_graph`, and measure the client's gRPC
round trip beside it: the client's mean latency less the ensemble's own clock.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from infergraph_lite.core.arguments import check_count, check_number
from infergraph_lite.serving.loadtest import run_open_loop

__all__ = ["TritonHops", "calibrate_triton_hops", "service_time_from_counters", "twin_from_counters"]


@dataclass(frozen=True)
class TritonHops:
    """What lone requests through a Triton ensemble showed (seconds, means over the requests).

    ``client_latency`` is the client's mean end to end; ``server_latency`` the ensemble's mean on Triton's own
    clock (request in to response out).  ``hop_delay`` maps each member model to its mean queue time less the
    batching delay its stage waits for a lone request (its ``max_wait`` when it batches): the hand-off into that
    step, held at 0.  ``counters`` are every model's statistics over these requests (the ensemble's too).

    >>> hops = TritonHops(0.020, 0.018, {"a": 0.0001, "b": 0.0003}, {})
    >>> round(hops.grpc, 6), round(hops.per_hop, 6)
    (0.002, 0.0002)
    >>> {name: round(d, 6) for name, d in hops.client_hop_delay("a").items()}
    {'a': 0.0021, 'b': 0.0003}
    """

    client_latency: float
    server_latency: float
    hop_delay: dict[str, float]
    counters: Mapping[str, Any]

    @property
    def grpc(self) -> float:
        """The client's round trip to Triton's front door and back: what its mean adds to Triton's clock."""
        return self.client_latency - self.server_latency

    @property
    def per_hop(self) -> float:
        """The mean hand-off per step."""
        if not self.hop_delay:
            raise ValueError("per_hop: these hops hold no member model")
        return statistics.fmean(self.hop_delay.values())

    def client_hop_delay(self, entry: str) -> dict[str, float]:
        """``hop_delay`` with the gRPC round trip added to the ``entry`` step's: a twin of what the client waits."""
        if entry not in self.hop_delay:
            raise ValueError(f"client_hop_delay: entry {entry!r} is not a member model "
                             f"(members: {', '.join(sorted(self.hop_delay))})")
        return {**self.hop_delay, entry: self.hop_delay[entry] + max(self.grpc, 0.0)}


def calibrate_triton_hops(client: Any, ensemble: str, stages: Mapping[str, tuple[Any, Any]],
                          make_item: Callable[[int], Any], n_requests: int = 30, spacing: float = 0.1) -> TritonHops:
    """Send ``n_requests`` lone requests through ``ensemble``, ``spacing`` seconds apart, and read the hand-offs.

    ``client`` is a :class:`~infergraph_lite.frameworks.triton.client.TritonClient` (``submit`` for the load,
    ``statistics`` before and after); ``stages`` the graph the ensemble serves (``{name: (Stage, deps)}``), whose
    batching delays come off the queue times.  Three requests first warm every step up; then each request is sent on a
    fixed schedule (open loop) so that it finds the server idle, as most requests do at light load.  A spacing
    shorter than more than a tenth of the requests' latencies would queue them behind each other, and is refused
    after the run (one slow request in ten is a busy machine's noise); so is a run in which a request failed, or in
    which a stage is not a model the requests went through, or a member model did not see every request.

    >>> calibrate_triton_hops(object(), "pipeline", {}, lambda i: i, spacing=0)
    Traceback (most recent call last):
    ...
    ValueError: spacing must be > 0, got 0
    """
    n_requests = check_count("n_requests", n_requests)
    spacing = check_number("spacing", spacing)
    before = client.statistics()
    if ensemble not in before:
        raise ValueError(f"calibrate_triton_hops: the server has no model {ensemble!r} "
                         f"(models: {', '.join(sorted(before))})")
    for i in range(3):
        client.submit(make_item(i)).result(timeout=30)
    before = client.statistics()
    report = run_open_loop(client, np.arange(n_requests) * spacing, make_item, timeout=30)
    counters = {name: stats - before[name] for name, stats in client.statistics().items() if name in before}
    answered = len(report.latencies)
    if report.failed or report.refused or answered != n_requests:
        raise RuntimeError(f"calibrate_triton_hops: {answered} of the {n_requests} lone requests were answered "
                           f"({report.failed} failed, {report.refused} refused); a calibration needs them all")
    members = {name: stats for name, stats in counters.items() if name != ensemble and stats.requests}
    if set(members) != set(stages):
        missing, extra = sorted(set(stages) - set(members)), sorted(set(members) - set(stages))
        raise ValueError("calibrate_triton_hops: the stages are not the models the requests went through ("
                         + "; ".join(part for part in (
                             missing and f"no request reached {', '.join(missing)}",
                             extra and f"the requests also went through {', '.join(extra)}") if part) + ")")
    short = [name for name, stats in members.items() if stats.requests != n_requests]
    if short or counters[ensemble].requests != n_requests:
        raise RuntimeError(f"calibrate_triton_hops: {', '.join(short) or ensemble} saw another number of requests "
                           f"than the {n_requests} sent: something else used the server during the calibration")
    # a request slower than the spacing was still in flight when the next one came: the two shared the server
    overlapped = int(np.sum(report.latencies >= spacing))
    if overlapped > n_requests // 10:
        raise ValueError(f"calibrate_triton_hops: spacing={spacing:g} s is shorter than {overlapped} of the "
                         f"{n_requests} lone requests' latencies (mean {report.mean:.3g} s, longest "
                         f"{float(np.max(report.latencies)):.3g} s), so they queued behind each other; give a longer "
                         "spacing")
    # max_batch_size 1 writes no dynamic_batching block, so no max_queue_delay either
    waits = {name: stage.max_wait if stage.max_batch_size != 1 else 0.0 for name, (stage, _) in stages.items()}
    return TritonHops(float(report.mean), counters[ensemble].mean_latency,
                      {name: max(stats.mean_queue - waits[name], 0.0) for name, stats in sorted(members.items())},
                      counters)


def service_time_from_counters(stats: Any) -> float | tuple[float, float]:
    """A stage's service time from Triton's counters over some runs (seconds).

    With calls of two or more batch sizes, ``s(b) = alpha + beta * b`` fitted over the sizes it ran (weighted by
    how often each ran, so a size seen once barely moves the line), as ``(alpha, beta)``; with one size, the
    mean time per item.  Both are clamped at 0: a fitted intercept of a slow one-request call can dip below.

    >>> from types import SimpleNamespace
    >>> stats = SimpleNamespace(call_seconds={1: 0.0122, 16: 0.0152}, batch_sizes={1: 10, 16: 10},
    ...                         batch_compute={1: 0.122, 16: 0.152})
    >>> tuple(round(x, 4) for x in service_time_from_counters(stats))
    (0.012, 0.0002)
    """
    calls = stats.call_seconds
    if len(calls) < 2:
        return sum(stats.batch_compute.values()) / max(sum(stats.batch_sizes.values()), 1)
    sizes, seconds = np.array(list(calls), dtype=float), np.array(list(calls.values()), dtype=float)
    beta, alpha = np.polyfit(sizes, seconds, 1, w=np.sqrt(np.array(list(stats.batch_sizes.values()), dtype=float)))
    return (max(float(alpha), 0.0), max(float(beta), 0.0))


def twin_from_counters(stages: Mapping[str, tuple[Any, Any]],
                       counters: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The served graph for :func:`~infergraph_lite.simulation.graph.simulate_graph`: each stage keeps its
    batching knobs and replicas, and takes the service time Triton's ``counters`` measured for its model.

    >>> twin_from_counters({"a": (object(), [])}, {})
    Traceback (most recent call last):
    ...
    ValueError: twin_from_counters: no counters for stage 'a' (counters for: none)
    """
    from infergraph_lite.core.stage import Stage

    missing = [name for name in stages if name not in counters]
    if missing:
        raise ValueError(f"twin_from_counters: no counters for stage {missing[0]!r} "
                         f"(counters for: {', '.join(sorted(counters)) or 'none'})")
    return {name: (Stage(service_time=service_time_from_counters(counters[name]), max_batch_size=stage.max_batch_size,
                         max_wait=stage.max_wait, replicas=stage.replicas), deps)
            for name, (stage, deps) in stages.items()}
