"""The dynamic-batching policy: the one place that decides when a batch starts and how big it is.

By default it is Triton's dynamic batcher.  Whenever a server (model instance) is free
and at least one request waits, a batch starts as soon as the queue holds
``max_batch_size`` requests or the oldest waiting request has waited
``max_wait``; the batch takes the oldest ``min(queue, max_batch_size)``.

Two rules for when the ``max_wait`` window starts (``window=``):

- ``"oldest_request"`` (the default, Triton's): the window runs from the oldest waiting request's
  *arrival*.  Triton's ``DynamicBatchScheduler`` measures ``max_queue_delay_microseconds`` from the oldest
  pending request's enqueue time, so a request that already waited its window while every instance was
  busy goes at once when one is free.
- ``"first_pick"`` (Ray Serve's ``@serve.batch``): the window runs from the moment the batcher *picks*
  a batch's first request, ``max(server free, oldest arrival)``.  Ray 2.60's
  ``_BatchQueue.wait_for_batch`` does ``await self.queue.get()`` and only then sets
  ``batch_start_time = time.time()`` and waits up to ``batch_wait_timeout_s``.  Requests that queued
  while the replica was busy therefore wait the whole window again once it is free, unless a full batch is
  already there.  This is what our Ray adapter does: its batch function is blocking, so it blocks the
  replica's event loop; no new window starts (and no arrival is even enqueued) until the batch returns.
  With an ``async`` batch function Ray instead forms the next batch while the previous one runs (up to
  ``max_concurrent_batches`` run at once, default 1); that overlap is not modelled here.
``max_wait=0`` is greedy batching, ``max_batch_size=1`` a plain FIFO queue,
``max_batch_size=None`` no cap (a batch is then never "full": it starts when
the oldest request has waited ``max_wait``, and takes everything waiting),
and an :class:`AIMD` controller moves the cap while it runs (Clipper's
adaptive batching).

Both :func:`~infergraph_lite.simulation.queue.simulate_batching` (simulated time) and
:class:`~infergraph_lite.serving.batcher.DynamicBatcher` (real threads and a clock)
call :meth:`BatchPolicy.start_time` and :meth:`BatchPolicy.take`; nothing else
in the package decides batch start or size, so the two cannot drift apart.

How the knobs map onto a Triton ``config.pbtxt``:

============================  ====================================================
this package                  Triton
============================  ====================================================
``max_batch_size``            ``max_batch_size`` (the model's largest batch)
``max_wait`` (seconds)        ``dynamic_batching { max_queue_delay_microseconds }``
``replicas`` (of a Stage)     ``instance_group [{ count }]``
``window="oldest_request"``   how ``max_queue_delay_microseconds`` is counted
(not modelled)                ``dynamic_batching { preferred_batch_size }``: Triton
                              may start a batch early once a preferred size is
                              reachable; here a batch starts only when full or
                              when the oldest request has waited ``max_wait``
(not modelled)                priority levels, queue policies with timeouts,
                              ``preserve_ordering``
``AIMD``                      no Triton field: Clipper's adaptive cap
============================  ====================================================

And onto Ray Serve's ``@serve.batch`` (defaults ``max_batch_size=10``, ``batch_wait_timeout_s=0.01``):
``max_batch_size`` is its ``max_batch_size``, ``max_wait`` its ``batch_wait_timeout_s``, and
``window="first_pick"`` its rule.  Ray's batches fill only if requests reach the batcher together: the
method must be ``async def``, the deployment's ``max_ongoing_requests`` must be at least ``max_batch_size``
(a replica holds no more requests than that), and ``max_concurrent_batches`` (default 1) says how many
batches may run at once.

Introduced in notebook 05; every stage of notebook 06 carries one.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

from infergraph_lite.core.arguments import check_count, check_fraction, check_number

__all__ = ["AIMD", "WINDOWS", "BatchPolicy"]

WINDOWS = ("oldest_request", "first_pick")
"""When ``max_wait`` starts counting: Triton's rule (from the oldest request's arrival), Ray Serve's (from the pick)."""


@dataclass
class AIMD:
    """Clipper's adaptive batch cap: additive increase, multiplicative decrease.

    After each *full* batch (one that reached the cap), if its service time
    stayed within ``latency_target`` the cap grows by ``increase``; after any
    batch that took longer than the target it shrinks to ``(1 - decrease)`` of
    itself.  A batch smaller than the cap says nothing about whether a bigger
    one would meet the target, so it leaves the cap alone: otherwise, at light
    load, the cap would drift up to ``max_size`` untested.  The controller
    needs no model of s(b): it probes for the largest batch that meets the
    target, and keeps probing, so it follows a model whose speed changes.
    The target bounds one batch's *service time*, as in Clipper — not a
    request's end-to-end latency, which adds the time spent queueing.
    (Crankshaw et al., "Clipper", NSDI 2017, section 4.3.)

    >>> controller = AIMD(latency_target=5.0, decrease=0.5, cap=2)
    >>> controller.observe(4.0, batch_size=2); controller.cap   # full and fast: grow
    3
    >>> controller.observe(4.0, batch_size=1); controller.cap   # not full: no evidence
    3
    >>> controller.observe(6.0, batch_size=1); controller.cap   # too slow: halve
    1
    """

    latency_target: float
    increase: int = 1
    decrease: float = 0.1
    cap: int = 1
    max_size: int = 4096

    def __post_init__(self) -> None:
        check_number("AIMD latency_target", self.latency_target)
        check_count("AIMD increase", self.increase)
        check_fraction("AIMD decrease", self.decrease)
        check_count("AIMD max_size", self.max_size)
        try:
            if check_count("AIMD cap", self.cap) > self.max_size:
                raise ValueError
        except ValueError:
            raise ValueError(f"AIMD cap must be an integer in [1, max_size={self.max_size}], "
                             f"got {self.cap!r}") from None
        self.cap, self.increase, self.max_size = int(self.cap), int(self.increase), int(self.max_size)

    def observe(self, service_time: float, batch_size: int) -> None:
        """Adjust the cap after a batch of ``batch_size`` requests that took ``service_time``.

        Called when the batch *finishes*, by the real batcher and the simulator alike: only then does a
        server know how long it took (Clipper's controller measures each batch's latency as it returns).
        """
        if service_time > self.latency_target:
            self.cap = max(1, math.floor(self.cap * (1 - self.decrease)))
        elif batch_size >= self.cap:
            self.cap = min(self.cap + self.increase, self.max_size)


class BatchPolicy:
    """When a batch may start and how many requests it takes (Triton's dynamic batcher).

    ``max_batch_size`` is an integer cap (numpy integers too), ``None`` for
    no cap, or an :class:`AIMD` controller (the policy keeps its own copy, so
    the caller's stays as it was).  ``max_wait`` is how long the oldest
    request may wait for a batch to fill, in the caller's time unit.

    >>> policy = BatchPolicy(max_batch_size=4, max_wait=2.0)
    >>> policy.start_time(free_at=0.0, oldest=1.0, full_at=float("inf"))   # waits out the window
    3.0
    >>> policy.start_time(free_at=0.0, oldest=1.0, full_at=1.5)            # full before the window ends
    1.5
    >>> policy.start_time(free_at=9.0, oldest=1.0, full_at=1.5)            # server busy until 9
    9.0
    >>> policy.take(waiting=10)
    4

    Ray's rule: the server is busy until 9, so the window starts then, not at the oldest arrival:

    >>> BatchPolicy(4, 2.0, window="first_pick").start_time(free_at=9.0, oldest=1.0, full_at=math.inf)
    11.0
    """

    __slots__ = ("_controller", "_fixed_cap", "_template", "max_wait", "window")

    def __init__(self, max_batch_size: int | AIMD | None = 1, max_wait: float = 0.0,
                 window: str = "oldest_request"):
        self._template = copy.copy(max_batch_size) if isinstance(max_batch_size, AIMD) else None
        if self._template is not None:
            self._controller: AIMD | None = copy.copy(self._template)
            self._fixed_cap: int | None = None
        else:
            self._controller = None
            try:
                self._fixed_cap = check_count("max_batch_size", max_batch_size, allow_none=True)
            except ValueError:
                raise ValueError(f"max_batch_size must be an integer >= 1, None or an AIMD, got {max_batch_size!r}"
                                 ) from None
        self.max_wait = check_number("max_wait", max_wait, positive=False)
        if window not in WINDOWS:
            raise ValueError(f"window must be one of {WINDOWS} (Triton's rule, Ray Serve's), got {window!r}")
        self.window = window

    @property
    def cap(self) -> int | None:
        """The largest batch allowed right now (None: no cap); an AIMD's moves as it observes batches."""
        return self._controller.cap if self._controller is not None else self._fixed_cap

    @property
    def largest_cap(self) -> int | None:
        """The largest batch this policy can ever allow: the fixed cap, or an AIMD's ``max_size``."""
        return self._controller.max_size if self._controller is not None else self._fixed_cap

    @property
    def controller(self) -> AIMD | None:
        """The policy's own AIMD controller, if it has one."""
        return self._controller

    def start_time(self, free_at: float, oldest: float, full_at: float) -> float:
        """When the next batch starts, given when a server is free, the oldest waiting arrival,
        and when the queue holds a full batch (``inf`` if it does not yet).

        Triton's rule: the first moment the server is free and (the batch is full or the oldest has waited
        ``max_wait``).  Ray's: the server picks the first request at ``max(free_at, oldest)``, and the batch
        starts when it is full or ``max_wait`` after that pick.
        """
        if self.window == "first_pick":
            picked = max(free_at, oldest)
            return max(picked, min(full_at, picked + self.max_wait))
        return max(free_at, oldest, min(full_at, oldest + self.max_wait))

    def take(self, waiting: int) -> int:
        """How many of the ``waiting`` requests the starting batch takes: the oldest ``min(waiting, cap)``."""
        cap = self.cap
        return waiting if cap is None else min(waiting, cap)

    def observe(self, service_time: float, batch_size: int) -> None:
        """Tell the policy how long a batch took (only an AIMD cap uses it)."""
        if self._controller is not None:
            self._controller.observe(service_time, batch_size)

    def fresh(self) -> BatchPolicy:
        """A new policy with the same knobs, its AIMD (if any) back at its starting cap: for a new run."""
        return BatchPolicy(self._template if self._template is not None else self._fixed_cap, self.max_wait,
                           self.window)

    def __repr__(self) -> str:
        cap = self._template if self._template is not None else self._fixed_cap
        window = "" if self.window == "oldest_request" else f", window={self.window!r}"
        return f"BatchPolicy(max_batch_size={cap!r}, max_wait={self.max_wait!r}{window})"
