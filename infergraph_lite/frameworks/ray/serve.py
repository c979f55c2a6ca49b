"""The same stage graph on Ray Serve: one deployment per node, composed with handles (notebook 07).

The stage graph of notebook 06, ``{name: (Stage(fn=..., max_batch_size=..., max_wait=..., replicas=...), [deps])}``,
becomes a Ray Serve application:

- every node is a *deployment* (:class:`StageReplica`) with ``num_replicas = stage.replicas`` and a
  fractional CPU share (``ray_actor_options={"num_cpus": ...}``), so a whole graph fits on two cores;
- a batching stage (``max_batch_size > 1``) runs its batch function under ``@serve.batch`` with
  ``max_batch_size`` and ``batch_wait_timeout_s = stage.max_wait`` (every ``Stage`` field is mapped, or
  refused by name, by :func:`~infergraph_lite.frameworks.ray.options.from_stage`).  Serve's rule is
  not Triton's: its window starts when the batcher picks a batch's first request, and the stage's batch
  function is blocking, so it holds the replica's event loop and the next window starts only when the batch
  returns — :class:`~infergraph_lite.core.policy.BatchPolicy` with ``window="first_pick"`` (a test in
  ``tests/test_ray_serve.py`` measures it);
- an *ingress* deployment (:class:`GraphIngress`) walks the DAG in topological order and hands each
  node the unawaited responses of its dependencies (Serve resolves them on the way), so the two
  branches of a fork really run at the same time;
- :class:`RayServeGraph` starts Ray on this machine (``num_cpus=2``, no dashboard, no HTTP proxy,
  every listener on 127.0.0.1), deploys, gives ``submit(inputs) -> Future`` for the package's load
  generators, and on exit shuts Ray down and checks, by PID, that no process it started is left.

Loopback only.  Ray normally binds its node to the machine's network address, and every Serve replica
opens an inter-deployment gRPC server on ``[::]:0`` (all interfaces; hard-coded in Ray 2.60's
``ray/serve/_private/replica.py``).  Two settings keep everything on 127.0.0.1:

1. ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (documented in Ray's cluster guide), set before ``import ray``:
   Ray's single-machine mode, the default on macOS and Windows, whose node address is 127.0.0.1.  (Passing
   ``_node_ip_address="127.0.0.1"`` alone is not enough: Ray rewrites a loopback address to the machine's
   network address when multi-node clusters are enabled.)
2. A ``worker_process_setup_hook`` (:func:`keep_replica_grpc_on_loopback`) that makes the replica's gRPC
   server bind ``127.0.0.1:0``.  It wraps an internal Ray name, so Ray is pinned (``ray[serve]==2.60.*``),
   the hook fails loudly if the name moves, and :meth:`RayServeGraph.start` lists every listening socket
   of every process Ray started and refuses to run if one is not on loopback.

Importing this module sets those environment variables and imports Ray (about a second).
"""

from __future__ import annotations

import os

# Before `import ray`: Ray reads these once, at import (see the module docstring).
LOOPBACK_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # single-machine mode: the node address is 127.0.0.1
    "RAY_USAGE_STATS_ENABLED": "0",  # no usage report is sent anywhere
}
for _key, _value in LOOPBACK_ENV.items():
    os.environ.setdefault(_key, _value)

import asyncio  # noqa: E402 - after the environment above, on purpose
import collections  # noqa: E402
import concurrent.futures  # noqa: E402
import contextlib  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterable, Mapping, Sequence  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import ray  # noqa: E402
from ray import serve  # noqa: E402
from ray._private import ray_constants  # noqa: E402
from ray.serve.exceptions import BackPressureError  # noqa: E402

from infergraph_lite.core.autoscaling import AutoscalingConfig  # noqa: E402
from infergraph_lite.core.execute import NodeError  # noqa: E402
from infergraph_lite.core.graph import Plan  # noqa: E402
from infergraph_lite.core.stage import Stage, batch_item, prepare_stages  # noqa: E402
from infergraph_lite.frameworks.ray.node import (  # noqa: E402
    LIGHT_IMPORT_STUBS,
    LocalRayNode,
    RayStartError,
    run_watched,
)
from infergraph_lite.frameworks.ray.options import (  # noqa: E402
    ENGINE,
    ServeStage,
    batch_options,
    deployment_options,
    from_stage,
)
from infergraph_lite.serving.batcher import QueueFullError  # noqa: E402
from infergraph_lite.serving.processes import (  # noqa: E402
    Listener,
    is_loopback,
    listening_sockets,
    living,
    owned_processes,
    process_tree,
    stop_processes,
    within,
)

__all__ = [
    "ENGINE",
    "INGRESS_DEPLOYMENT",
    "LIGHT_IMPORT_STUBS",
    "LOOPBACK_ENV",
    "STAGE_DEPLOYMENT",
    "TESTED_RAY",
    "GraphIngress",
    "Listener",
    "LoopbackError",
    "RayServeGraph",
    "RayStartError",
    "ServeStage",
    "StageReplica",
    "autoscaling_config",
    "batch_options",
    "deployment_options",
    "from_stage",
    "is_loopback",
    "keep_replica_grpc_on_loopback",
    "listening_sockets",
    "process_tree",
]

TESTED_RAY = "2.60."
"""The Ray release line whose internals :func:`keep_replica_grpc_on_loopback` was written and tested against."""

SETUP_HOOK = f"{__name__}.keep_replica_grpc_on_loopback"
class LoopbackError(RuntimeError):
    """A process we started listens on an address other than loopback (or loopback could not be ensured)."""


def keep_replica_grpc_on_loopback() -> None:
    """Ray ``worker_process_setup_hook``: make a Serve replica's gRPC server bind 127.0.0.1, not ``[::]``.

    Ray 2.60 starts, in every replica, an inter-deployment gRPC server on ``"[::]:0"`` (all interfaces)
    with no setting to change it.  This hook runs in each Ray worker process before any actor starts
    and wraps ``ray.serve._private.replica.add_port_to_grpc_server`` so that address becomes
    ``127.0.0.1:0``.  It is an internal name: if a Ray release moves it, the hook raises, the worker
    refuses to start, and nothing listens beyond loopback (fail closed).  Calling it twice is harmless.
    """
    from ray.serve._private import replica

    original = getattr(replica, "add_port_to_grpc_server", None)
    if original is None:
        raise LoopbackError(
            f"ray {ray.__version__}: ray.serve._private.replica.add_port_to_grpc_server is gone, so this hook "
            f"cannot keep the replicas' gRPC servers on 127.0.0.1; it was written for Ray {TESTED_RAY}*"
        )
    if getattr(original, "keeps_loopback", False):
        return

    def add_port_on_loopback(server: Any, address: str) -> int:
        host, _, port = address.rpartition(":")
        if host in ("[::]", "0.0.0.0", ""):
            address = f"127.0.0.1:{port}"
        return original(server, address)

    add_port_on_loopback.keeps_loopback = True  # type: ignore[attr-defined]
    replica.add_port_to_grpc_server = add_port_on_loopback


# --- from a Stage to Serve's options (plain functions, no Ray needed) ----------------------------------------
# batch_options, deployment_options and from_stage live in ray.options (importable without Ray).


def autoscaling_config(config: AutoscalingConfig | None = None, /, **fields: Any) -> dict[str, Any]:
    """Serve's ``autoscaling_config`` dict for a deployment: ``config.to_ray_config()``.

    Pass the :class:`~infergraph_lite.core.autoscaling.AutoscalingConfig` notebook 06's simulated autoscaler
    ran with, or its fields as keywords (Ray's names, seconds, Ray's defaults).  Serve keeps
    ``ceil(ongoing requests / target_ongoing_requests)`` replicas, within ``[min_replicas, max_replicas]``,
    and acts on a decision only after it has held for ``upscale_delay_s`` (to add) or ``downscale_delay_s``
    (to remove).  Pass the result as ``RayServeGraph(..., autoscaling={"topic": ...})``.

    >>> autoscaling_config(target_ongoing_requests=2, min_replicas=1, max_replicas=3, upscale_delay_s=5)
    {'min_replicas': 1, 'max_replicas': 3, 'target_ongoing_requests': 2.0, 'look_back_period_s': 30.0,
     'upscale_delay_s': 5.0, 'downscale_delay_s': 600.0}
    >>> autoscaling_config(min_replicas=3, max_replicas=1)
    Traceback (most recent call last):
    ...
    ValueError: max_replicas (1) must be >= min_replicas (3)
    """
    if config is None:
        config = AutoscalingConfig(**fields)
    elif fields or not isinstance(config, AutoscalingConfig):
        raise ValueError("autoscaling_config takes an AutoscalingConfig or its fields as keywords, not both; "
                         f"got {config!r} and {sorted(fields)}")
    return config.to_ray_config()


# --- the deployments ----------------------------------------------------------------------------------


class StageReplica:
    """One replica of one stage: runs the stage's batch function, in Serve's batches when the stage batches.

    A node with one dependency receives its value; with several, a tuple of their values in the
    order listed (the package's convention).  ``batch_sizes()`` reports the batches it ran.
    """

    def __init__(self, name: str, fn: Callable[[list[Any]], Sequence[Any]], batching: dict[str, Any] | None):
        self.name = name
        self.fn = fn
        self.batching = batching
        self.sizes: collections.Counter[int] = collections.Counter()
        if batching is not None:
            # @serve.batch wraps run_batch in an object with these setters (Ray's own hints say Callable).
            self.run_batch.set_max_batch_size(batching["max_batch_size"])
            self.run_batch.set_batch_wait_timeout_s(batching["batch_wait_timeout_s"])

    def run_items(self, items: list[Any]) -> list[Any]:
        """Call the batch function on ``items`` and check it gave one result per item."""
        self.sizes[len(items)] += 1
        try:
            results = list(self.fn(items))
        except Exception:
            raise
        except BaseException as error:  # noqa: BLE001 - reported to every caller of the batch
            # SystemExit, KeyboardInterrupt, ...: raised through Serve they would end this replica's batch loop
            # (leaving the batch's callers waiting) or the actor; as an ordinary error every caller hears of it.
            raise RuntimeError(f"stage {self.name!r} raised {type(error).__name__}: {error}") from None
        if len(results) != len(items):
            raise ValueError(f"stage {self.name!r}: its fn returned {len(results)} results for {len(items)} items")
        return results

    @serve.batch
    async def run_batch(self, items: list[Any]) -> list[Any]:
        """Serve collects concurrent calls into ``items`` (up to max_batch_size, waiting at most the timeout).

        ``async def``, as ``@serve.batch`` needs to collect calls, but ``run_items`` blocks: while it runs the
        replica's event loop does nothing else, so Serve's batcher forms the next batch only after this one
        returns (``BatchPolicy(window="first_pick")``), not while it runs."""
        return self.run_items(items)

    async def __call__(self, *values: Any) -> Any:
        item = batch_item(values)
        if self.batching is None:
            return self.run_items([item])[0]
        return await self.run_batch(item)

    def batch_sizes(self) -> dict[int, int]:
        """How many batches of each size this replica ran."""
        return dict(self.sizes)


@dataclass(frozen=True)
class _Failed:
    node: str
    error: BaseException


class GraphIngress:
    """The graph's entry point: sends each node its dependencies' responses, unawaited, in topological order.

    A ``DeploymentResponse`` passed as an argument is resolved by Serve before the node runs, so a node
    starts as soon as its inputs are ready and parallel branches run at the same time; the ingress only
    waits at the end, for every node's value (or the first failure, in topological order).
    """

    def __init__(self, order: list[str], deps: dict[str, list[str]], handles: dict[str, Any]):
        self.order, self.deps, self.handles = order, deps, handles

    async def __call__(self, inputs: dict[str, Any]) -> dict[str, Any] | _Failed:
        responses: dict[str, Any] = {}
        for name in self.order:
            args = [responses[d] if d in responses else inputs[d] for d in self.deps[name]]
            responses[name] = self.handles[name].remote(*args)
        results = {}
        for name in self.order:
            try:
                results[name] = await responses[name]
            except Exception as error:  # noqa: BLE001 - handed back to the caller as a NodeError naming the node
                return _Failed(name, getattr(error, "cause", None) or error)
        return results


# How a replica stops.  close() has cancelled every request before Serve shuts down, so a replica has nothing to
# drain: Serve's defaults would still have each one sleep a 2 s wait loop before it looks, and a replica whose
# batch function is still running (it blocks the replica's event loop) is killed only after 20 s.
SHUTDOWN_WAIT_LOOP_S, SHUTDOWN_TIMEOUT_S = 0.1, 2.0  # Serve's graceful_shutdown_wait_loop_s, _timeout_s

# The classes above as Serve deployments: each node's options are set in RayServeGraph.application().
STAGE_DEPLOYMENT = serve.deployment(StageReplica, graceful_shutdown_wait_loop_s=SHUTDOWN_WAIT_LOOP_S,
                                    graceful_shutdown_timeout_s=SHUTDOWN_TIMEOUT_S)
INGRESS_DEPLOYMENT = serve.deployment(GraphIngress, max_ongoing_requests=1000, ray_actor_options={"num_cpus": 0},
                                      graceful_shutdown_wait_loop_s=SHUTDOWN_WAIT_LOOP_S,
                                      graceful_shutdown_timeout_s=SHUTDOWN_TIMEOUT_S)


# --- the graph on a local Ray ---------------------------------------------------------------------------------


async def _cancel_pending() -> None:
    # Every request coroutine on this loop (all but this one) is cancelled and awaited, so no future is left
    # pending when the loop stops.
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _cpu_share(num_cpus: float, replicas: int) -> float:
    # Every replica gets the same fractional CPU, so all of them fit at once (rounded down to 1/100).
    return max(math.floor(100 * num_cpus / max(replicas, 1)) / 100, 0.01)


class RayServeGraph:
    """A stage graph served by Ray Serve on this machine, loopback only; a context manager.

    ``with RayServeGraph(stages, inputs=("text",)) as served:`` starts Ray (``num_cpus`` logical CPUs,
    no dashboard), deploys one deployment per node plus the ingress without any HTTP proxy, checks
    that every listening socket of every process Ray started is on loopback, and answers
    ``served.submit({"text": ...})`` with a ``concurrent.futures.Future`` of every node's value (so
    :func:`~infergraph_lite.serving.loadtest.run_open_loop` and ``run_closed_loop`` drive it).  A stage that
    raises (any ``BaseException``) or whose replica dies fails its requests with a ``NodeError`` naming it.
    ``close(timeout)`` (also on exit) cancels the requests still pending, shuts Serve and Ray down and
    stops, by PID, what is left of the processes Ray's node records it started and their descendants
    (:meth:`started_pids`) -- never another server's -- and returns within ``timeout``.

    ``num_cpus_per_replica`` defaults to an equal share of ``num_cpus`` for every replica;
    ``autoscaling`` maps stage names to an :class:`~infergraph_lite.core.autoscaling.AutoscalingConfig` or its
    :func:`autoscaling_config` dict (replacing ``replicas``).
    ``timings`` records seconds from the start to ``ray_init`` done and to ``deploy`` done.

    >>> from infergraph_lite.lessons.examples import banana_nodes
    >>> stages = {"pre": (Stage(fn=lambda xs: [x.strip().lower() for x in xs]), ["text"]),
    ...           "n": (Stage(fn=lambda xs: [len(x) for x in xs], max_batch_size=8, max_wait=0.005), ["pre"])}
    >>> with RayServeGraph(stages, inputs=("text",)) as served:  # doctest: +SKIP
    ...     served.submit({"text": "  BANANA  "}).result()
    {'pre': 'banana', 'n': 6}
    """

    def __init__(
        self,
        stages: Mapping[str, tuple[Stage, Sequence[str]]],
        inputs: Iterable[str] = ("request",),
        *,
        num_cpus: int = 2,
        num_cpus_per_replica: float | None = None,
        autoscaling: Mapping[str, AutoscalingConfig | Mapping[str, Any]] | None = None,
        app_name: str = "infergraph",
        timeout: float = 180.0,
    ):
        self.plan: Plan = prepare_stages(stages, inputs, need="fn")  # graph errors before anything starts
        ray_autoscaling: dict[str, dict[str, Any]] = {
            name: config.to_ray_config() if isinstance(config, AutoscalingConfig) else dict(config)
            for name, config in (autoscaling or {}).items()}
        unknown = sorted(set(ray_autoscaling) - set(self.plan.nodes))
        if unknown:
            raise ValueError(f"autoscaling names stages the graph does not have: {unknown}")
        replicas = sum(ray_autoscaling[n]["max_replicas"] if n in ray_autoscaling else stage.replicas
                       for n, (stage, _) in self.plan.nodes.items())
        self.num_cpus = num_cpus
        self.num_cpus_per_replica = (num_cpus_per_replica if num_cpus_per_replica is not None
                                     else _cpu_share(num_cpus, replicas))
        # Every stage's Serve settings, each Stage field mapped or refused by name, before Ray starts.
        self.served: dict[str, ServeStage] = {
            n: from_stage(n, stage, self.num_cpus_per_replica, ray_autoscaling.get(n))
            for n, (stage, _) in self.plan.nodes.items()}
        self.autoscaling = ray_autoscaling
        self.app_name = app_name
        self.ingress_name = next(n for n in ("ingress", "_ingress", "__ingress") if n not in self.plan.nodes)
        self.timeout = timeout
        self.timings: dict[str, float] = {}
        self._roots: set[int] = set()  # the processes Ray's node records it started
        self._owned: dict[int, None] = {}  # every process found under those roots, in order
        self._ray: LocalRayNode | None = None
        self._closing: threading.Thread | None = None  # the thread running the last close's shutdown
        self._handle: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None

    # -- the application ----------------------------------------------------------------------------------

    def application(self) -> Any:
        """The Serve application: one bound :class:`StageReplica` per node, composed by a :class:`GraphIngress`."""
        bound = {}
        for name, served in self.served.items():
            bound[name] = STAGE_DEPLOYMENT.options(  # a Deployment (Ray's own hints say a decorator)
                name=name, **served.options).bind(name, served.fn, served.batching)
        order = list(self.plan.order)
        deps = {name: list(self.plan.nodes[name][1]) for name in order}
        return INGRESS_DEPLOYMENT.options(name=self.ingress_name).bind(
            order, deps, bound)

    # -- lifecycle ------------------------------------------------------------------------------------------

    def start(self, attempts: int = 3) -> RayServeGraph:
        """Start Ray, deploy the application, and check that every listener is on loopback, within ``timeout``.

        Raises :class:`RayStartError` if a process Ray started dies on the way (naming it, quoting its log line)
        or if the whole start takes longer than ``timeout`` seconds (naming the step); what was started is
        stopped by PID first.  A start that failed on a port another process took is tried again on fresh ports,
        up to ``attempts`` times in all, within the same ``timeout``.  Starting the head node and ``ray.init`` run
        on this thread (see :func:`~infergraph_lite.frameworks.ray.node.run_watched`) and are bounded by Ray's own
        waits (30 s for its GCS, 30 s for the raylet to register), checked as soon as they return.
        """
        if ray.is_initialized():
            raise RuntimeError("Ray is already running in this process; RayServeGraph starts and stops its own")
        if ray_constants.ENABLE_RAY_CLUSTER:
            if os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") != "0":
                raise LoopbackError("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER is set to enable multi-node clusters, so Ray's "
                                    "node would listen on the network; unset it to serve on 127.0.0.1 only")
            # Ray was imported before this module set the variable, and read it then; its node-address
            # lookup reads this flag on every call, so setting it now has the effect the variable would have had.
            ray_constants.ENABLE_RAY_CLUSTER = False
        if not ray.__version__.startswith(TESTED_RAY):
            raise LoopbackError(f"ray {ray.__version__} is installed; the loopback hook was tested with "
                                f"{TESTED_RAY}* (requirements.txt pins it)")
        for name in ("ray", "ray.serve"):
            logging.getLogger(name).setLevel(logging.WARNING)
        started = time.perf_counter()
        deadline = time.monotonic() + self.timeout
        for attempt in range(1, attempts + 1):
            try:
                self._start_once(started, deadline)
                return self
            except RayStartError as error:
                self._stop_ray(min(30.0, max(deadline - time.monotonic(), 5.0)), broken=True)
                # Only a taken port is worth another try; and only once this driver has let go of the first node:
                # a ray.shutdown still running on the close thread would tear down the next attempt's connection.
                if not error.port_taken or attempt == attempts or not self._shut_down_by(deadline):
                    raise
            except BaseException:
                self.close()
                raise
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _start_once(self, started: float, deadline: float) -> None:
        # Why each step is watched (ray.node.run_watched): a process of Ray's that dies while it starts is not
        # reported to the driver -- ray.init may already have returned, and serve.start then waits in ray.get,
        # with no deadline, for a controller no node can run.  Why the node is started as it is (ports handed to
        # the raylet, no monitors, no prestarted workers, the light-import stubs): ray.node.LocalRayNode.
        node = self._ray = LocalRayNode(self.num_cpus)
        # On this thread: the node's processes share its fate (see run_watched); Ray bounds this step itself
        # (it waits at most 30 s for its GCS, and the raylet at most agent_register_timeout_ms for an agent).
        run_watched("starting the head node", node.start, node, deadline, on_this_thread=True)
        self._roots |= set(node.roots)
        # On this thread too: ray.init sets up signal handling that only the main thread may, and it gives the
        # raylet at most 30 s to register.  The steps after it wait in ray.get with no deadline: on a helper thread.
        run_watched("connecting this driver (ray.init)", lambda: ray.init(
            address=node.node.address, logging_level=logging.WARNING, log_to_driver=False,
            _node_ip_address="127.0.0.1", runtime_env={"worker_process_setup_hook": SETUP_HOOK}),
            node, deadline, on_this_thread=True)
        self.timings["ray_init"] = time.perf_counter() - started
        run_watched("starting Serve's controller (serve.start)", lambda: serve.start(
            proxy_location="Disabled", logging_config={"log_level": "WARNING"}), node, deadline)
        self._handle = run_watched("deploying the graph (serve.run)", lambda: serve.run(
            self.application(), name=self.app_name, route_prefix=None,
            logging_config={"log_level": "WARNING"}), node, deadline)
        self.timings["deploy"] = time.perf_counter() - started
        self.check_loopback()
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, name="ray-serve-graph", daemon=True)
        self._loop_thread.start()

    def started_pids(self) -> list[int]:
        """The PIDs of every process Ray started for this graph that is still alive.

        Ray's own record of the processes its node started (GCS, raylet, agents, reaper, ...) are the roots;
        the rest (workers, replicas) are their descendants.  Nothing else is counted, so another server running
        in this interpreter (a Dask cluster, a Triton server) is never taken for Ray's.
        """
        for pid in owned_processes(self._roots):
            self._owned.setdefault(pid)
        return living(self._owned)

    def listeners(self) -> list[Listener]:
        """Every listening socket of this process and of every process Ray started."""
        return listening_sockets([os.getpid(), *self.started_pids()])

    def check_loopback(self) -> list[Listener]:
        """:meth:`listeners`, raising :class:`LoopbackError` if any is not on loopback."""
        listeners = self.listeners()
        exposed = [x for x in listeners if not is_loopback(x.ip)]
        if exposed:
            raise LoopbackError(f"listening beyond loopback: {exposed}")
        return listeners

    def close(self, timeout: float = 60.0) -> list[int]:
        """Resolve every pending request, shut Serve and Ray down, and wait, by PID, for every process Ray started.

        Returns within about ``timeout`` seconds, with the PIDs that had to be stopped (none, normally).  A
        request still in flight is cancelled (its future raises ``CancelledError``) before the loop that
        serves it stops.  Safe to call twice, and after a failed start.
        """
        deadline = time.monotonic() + timeout
        self._handle = None
        if self._loop is not None:
            loop, self._loop = self._loop, None
            # The loop may be stopped already, or too busy to finish the cancelling in time: go on either way.
            with contextlib.suppress(RuntimeError, TimeoutError, concurrent.futures.TimeoutError):
                asyncio.run_coroutine_threadsafe(_cancel_pending(), loop).result(timeout=min(5.0, timeout / 4))
            loop.call_soon_threadsafe(loop.stop)
            if self._loop_thread is not None:
                self._loop_thread.join(timeout=max(min(5.0, deadline - time.monotonic()), 0.0))
            if not loop.is_running():
                loop.close()
            self._loop_thread = None
        return self._stop_ray(max(deadline - time.monotonic(), 1.0))

    def _stop_ray(self, timeout: float, *, broken: bool = False) -> list[int]:
        # serve.shutdown and ray.shutdown have no timeout of their own: run them on a helper thread and give up
        # waiting at the deadline; then every process Ray started is stopped by its PID.  A node that broke while
        # starting (broken=True) is stopped by PID first, and Serve is not asked to shut down: it would wait for
        # a controller that is not there, and a driver still waiting on it would keep ray.shutdown from finishing.
        deadline = time.monotonic() + timeout
        if self._ray is not None:
            self._roots |= set(self._ray.roots)  # a node that failed while starting: what it had spawned so far
        pids = self.started_pids()
        node, self._ray = self._ray, None
        if broken:
            stop_processes(pids, timeout=0.0, signal_wait=min(3.0, timeout / 4))

        def shut_down() -> None:
            if ray.is_initialized():
                if not broken:
                    with contextlib.suppress(Exception):
                        serve.shutdown()  # deletes the app and stops Serve's handles before their cluster goes away
                with contextlib.suppress(Exception):
                    ray.shutdown()  # disconnects this driver
            if node is not None:
                with contextlib.suppress(Exception):
                    node.stop()

        worker = self._closing = threading.Thread(target=shut_down, name="ray-serve-graph-close", daemon=True)
        worker.start()
        worker.join(timeout=max(0.6 * (deadline - time.monotonic()), 0.0))
        stopped = stop_processes(pids, **within(deadline - time.monotonic()))
        self._roots, self._owned = set(), {}
        if node is not None:
            node.remove_site()
        return stopped

    def _shut_down_by(self, deadline: float) -> bool:
        """Whether the last close's shutdown of Serve and Ray finished, waiting for it until ``deadline``."""
        if self._closing is not None:
            self._closing.join(timeout=max(deadline - time.monotonic(), 0.0))
            if self._closing.is_alive():
                return False
        return not ray.is_initialized()

    def __enter__(self) -> RayServeGraph:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- requests ----------------------------------------------------------------------------------------------

    def submit(self, inputs: Mapping[str, Any]) -> concurrent.futures.Future:
        """Send one request; the future gives every node's value, or a NodeError naming the node that failed."""
        self.plan.check_inputs(inputs)  # a missing input, or one named like a node, as every engine refuses it
        if self._handle is None or self._loop is None:
            raise RuntimeError("not started: use `with RayServeGraph(...) as served:` or call .start()")
        response = self._handle.remote(dict(inputs))
        return asyncio.run_coroutine_threadsafe(self._answer(response), self._loop)

    @staticmethod
    async def _answer(response: Any) -> dict[str, Any]:
        result = await response
        if isinstance(result, _Failed):
            if isinstance(result.error, BackPressureError):  # max_queued_requests: Serve shed it, as it says
                raise QueueFullError(f"Ray Serve refused the request at stage {result.node!r}: {result.error}",
                                     stage=result.node) from result.error
            raise NodeError(result.node, result.error) from result.error
        return result

    def run(self, inputs: Mapping[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """Send one request and wait for its answer (every node's value)."""
        return self.submit(inputs).result(timeout=self.timeout if timeout is None else timeout)

    def batch_sizes(self) -> dict[str, dict[int, int]]:
        """For each batching stage, how many batches of each size its replicas ran (all replicas together)."""
        if self._loop is None:
            raise RuntimeError("not started: use `with RayServeGraph(...) as served:` or call .start()")
        sizes = {}
        for name, served in self.served.items():
            if served.batching is None:
                continue
            handle = serve.get_deployment_handle(name, app_name=self.app_name)
            total: collections.Counter[int] = collections.Counter()
            # On our own loop: Serve's sync results() refuses to run where a loop is running (a notebook).
            replies = asyncio.run_coroutine_threadsafe(handle.broadcast("batch_sizes").results_async(timeout_s=30),
                                                       self._loop).result(timeout=60)
            for replica_sizes in replies:
                total.update(replica_sizes)
            sizes[name] = dict(sorted(total.items()))
        return sizes

    def statistics(self) -> dict[str, Any]:
        """What the :class:`~infergraph_lite.frameworks.engine.Engine` protocol asks for: the batch sizes each
        batching stage ran (:meth:`batch_sizes`, while started) and the start's ``timings``."""
        return {"batch_sizes": self.batch_sizes() if self._loop is not None else {}, "timings": dict(self.timings)}
