"""Graphs the real-server overload tests serve (a module Triton's stubs and Ray's workers can import)."""

from __future__ import annotations

import os
import time

from infergraph_lite.core.stage import Stage

SLOW_SECONDS = 0.25  # one request's compute: long enough that a burst always finds the queue full


def slow(items: list) -> list:
    time.sleep(SLOW_SECONDS * len(items))
    return [len(str(x)) for x in items]


def slow_stages(max_queue_size: int | None = 1) -> dict:
    """One stage, one instance, batches of one, at most ``max_queue_size`` waiting."""
    return {"slow": (Stage(fn=slow, max_batch_size=1, max_queue_size=max_queue_size), ["text"])}


def gated_stages(gate: str, max_queue_size: int = 1) -> dict:
    """As :func:`slow_stages`, but each request is held until the file ``gate`` exists (at most 60 s), so what
    waits while a burst arrives is decided by the test, not by how fast the machine is."""

    def held(items: list) -> list:
        deadline = time.monotonic() + 60
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.005)
        return [len(str(x)) for x in items]

    return {"slow": (Stage(fn=held, max_batch_size=1, max_queue_size=max_queue_size), ["text"])}
