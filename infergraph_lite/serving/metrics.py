"""What the real servers record: one request's times, one batch, and a stage's queue / compute split.

DynamicBatcher, GraphServer and the framework clients all report these, so the load generators and the
notebooks read every engine the same way.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from infergraph_lite.core.metrics import mean_per_batch

__all__ = ["BatchRecord", "RequestRecord", "StageTimes", "stage_times"]


@dataclass(frozen=True)
class RequestRecord:
    """What happened to one request, in seconds.

    ``work`` is the CPU time its batch's function used (the whole batch's, like ``service_time``): measured
    with ``time.thread_time`` where the function ran (the batcher's thread, or the worker process of a
    ``workers="processes"`` stage), so ``service_time - work`` is what the batch waited for besides its
    own computing (a pipe, a lock, a core).  NaN where nothing measured it.
    """

    queue_time: float    # submit -> its batch started
    service_time: float  # its batch's run time
    batch_size: int
    work: float = math.nan

    @property
    def latency(self) -> float:
        return self.queue_time + self.service_time


@dataclass(frozen=True)
class BatchRecord:
    """One batch: the submit number of its oldest request, its size, when it ran (clock seconds) and the CPU
    seconds its function used (``work``, as in :class:`RequestRecord`).

    ``released`` is when its worker was free for the next batch: after it answered the batch's requests,
    their futures' callbacks included (a graph server's callbacks hand each request to its next stage).  So
    ``released - end`` is the batch's *turnaround*: time its worker is busy that no request waits for.  NaN
    until the answers are out.
    """

    first: int
    size: int
    start: float
    end: float
    work: float = math.nan
    released: float = math.nan



@dataclass(frozen=True)
class StageTimes:
    """Where one stage's time went, per request, in seconds (perf_analyzer's queue / compute split).

    ``queue`` and ``compute`` are means per request; ``batch_size`` is the mean size per *batch*;
    ``requests`` how many requests the means cover.
    """

    queue: float
    compute: float
    batch_size: float
    requests: int = 0


def stage_times(records: Mapping[str, Sequence[Any]]) -> dict[str, StageTimes]:
    """Summarise per-stage request records into :class:`StageTimes`, stage by stage.

    Each record has ``queue_time``, ``service_time`` and ``batch_size`` (a
    :class:`~infergraph_lite.serving.metrics.RequestRecord`, as
    :meth:`~infergraph_lite.serving.graph_server.GraphServer.stage_records` returns).  The
    mean batch size is per batch: ``n / sum(1 / size)`` over the requests.  A
    stage with no records gets NaNs.

    >>> from infergraph_lite.serving.metrics import RequestRecord
    >>> t = stage_times({"embed": [RequestRecord(0.001, 0.002, 2), RequestRecord(0.003, 0.002, 2),
    ...                            RequestRecord(0.0, 0.001, 1)]})["embed"]
    >>> round(t.queue * 1e3, 6), round(t.compute * 1e3, 6), t.batch_size, t.requests
    (1.333333, 1.666667, 1.5, 3)
    """
    summary = {}
    for name, rows in records.items():
        if not rows:
            summary[name] = StageTimes(math.nan, math.nan, math.nan, 0)
            continue
        queue = np.fromiter((r.queue_time for r in rows), float, len(rows))
        compute = np.fromiter((r.service_time for r in rows), float, len(rows))
        sizes = np.fromiter((r.batch_size for r in rows), float, len(rows))
        summary[name] = StageTimes(float(queue.mean()), float(compute.mean()), mean_per_batch(sizes), len(rows))
    return summary
