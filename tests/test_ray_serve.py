"""The stage graph on Ray Serve: same answers as run_graph, real batches, loopback only, nothing left behind.

One Ray session serves the whole module (starting Ray costs 10-30 s on two cores); the tests that need
no Ray (options, validation) run first and start nothing.
"""

from __future__ import annotations

import os

import numpy as np
import psutil
import pytest

pytest.importorskip("ray")

import ray  # imported before infergraph_lite.ray_serve on purpose: start() keeps Ray on loopback either way

from infergraph_lite import CycleError, InvalidNodeError, MissingDependencyError, NodeError, run_closed_loop
from infergraph_lite.core.autoscaling import AutoscalingConfig
from infergraph_lite.core.execute import run_graph
from infergraph_lite.core.policy import AIMD
from infergraph_lite.core.stage import Stage, UnsupportedStageFieldError
from infergraph_lite.frameworks.ray.serve import (
    TESTED_RAY,
    RayServeGraph,
    autoscaling_config,
    batch_options,
    deployment_options,
    is_loopback,
)
from infergraph_lite.lessons.examples import text_pipeline, text_pipeline_stages, trained_text_models
from tests.proc_sockets import descendants, listening, not_loopback

TEXTS = [
    "The pasta was delicious and the staff were lovely.",
    "Terrible battery, the phone died after an hour.",
    "A gripping novel, I could not put it down.",
    "",
]
BATCHED = ("embed", "topic", "sentiment", "fault")


def _stages() -> dict:
    """The text pipeline, plus a batching leaf `fault` that raises, exits, crashes or sleeps when asked to."""
    stages = text_pipeline_stages(options={name: {"max_batch_size": 16, "max_wait": 0.005} for name in BATCHED[:3]})

    def fault(texts: list) -> list:
        for text in texts:
            if text == "please raise":
                raise ValueError("asked to raise")
            if text == "please exit":
                raise SystemExit("asked to exit")  # a BaseException: it would end Serve's batch loop
            if text == "please crash":
                os._exit(3)  # the replica's process dies mid-batch
            if isinstance(text, str) and text.startswith("please sleep"):
                import time

                time.sleep(float(text.split()[-1]))
        return [len(text) if isinstance(text, str) else 0 for text in texts]

    stages["fault"] = (Stage(fn=fault, max_batch_size=4, max_wait=0.001), ["text"])
    return stages


# --- no Ray needed ---------------------------------------------------------------------------------------


def test_ray_is_the_pinned_release():
    assert ray.__version__.startswith(TESTED_RAY), "requirements.txt pins ray[serve]==2.60.*: the hook wraps internals"


def test_stage_knobs_become_serve_options():
    stage = Stage(fn=list, max_batch_size=16, max_wait=0.002, replicas=3, max_queue_size=50)
    assert batch_options(stage) == {"max_batch_size": 16, "batch_wait_timeout_s": 0.002}
    options = deployment_options(stage, num_cpus=0.2)
    assert options["num_replicas"] == 3 and options["ray_actor_options"] == {"num_cpus": 0.2}
    assert options["max_ongoing_requests"] >= 16, "a replica must accept a full batch at once"
    assert options["max_queued_requests"] == 50
    assert batch_options(Stage(fn=list)) is None
    with pytest.raises(UnsupportedStageFieldError, match="max_batch_size=None"):
        batch_options(Stage(fn=list, max_batch_size=None))  # Serve needs a number: refused, not made up


def test_autoscaling_replaces_replicas():
    config = autoscaling_config(target_ongoing_requests=2, min_replicas=1, max_replicas=4, upscale_delay_s=3)
    options = deployment_options(Stage(fn=list, replicas=2), 0.1, autoscaling=config)
    assert "num_replicas" not in options and options["autoscaling_config"]["max_replicas"] == 4
    with pytest.raises(ValueError, match="target_ongoing_requests"):
        autoscaling_config(target_ongoing_requests=0, min_replicas=1, max_replicas=2)
    scaler = AutoscalingConfig(target_ongoing_requests=2, max_replicas=4, upscale_delay_s=3)
    assert autoscaling_config(scaler) == config == scaler.to_ray_config()   # the simulated autoscaler's settings
    assert deployment_options(Stage(fn=list), 0.1, autoscaling=scaler)["autoscaling_config"] == config


def test_loopback_addresses():
    assert all(map(is_loopback, ["127.0.0.1", "127.0.0.53", "::1", "::ffff:127.0.0.1"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "10.1.2.3", "::ffff:10.1.2.3", "fe80::1%eth0"]))


@pytest.mark.parametrize(
    ("stages", "error"),
    [
        ({"a": (Stage(fn=list), ["b"]), "b": (Stage(fn=list), ["a"])}, CycleError),
        ({"a": (Stage(fn=list), ["nowhere"])}, MissingDependencyError),
        ({"a": (Stage(service_time=1.0), ["text"])}, InvalidNodeError),  # nothing to serve
        ({"a": (len, ["text"])}, InvalidNodeError),  # a function, not a Stage
    ],
)
def test_bad_graph_fails_before_ray_starts(stages, error):
    with pytest.raises(error):
        RayServeGraph(stages, inputs=("text",))
    assert not ray.is_initialized()


def test_aimd_cap_is_refused_before_ray_starts():
    with pytest.raises(ValueError, match="AIMD"):
        RayServeGraph({"a": (Stage(fn=list, max_batch_size=AIMD(1.0)), ["text"])}, inputs=("text",))
    assert not ray.is_initialized()


# --- one Ray session for the rest --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served():
    graph = RayServeGraph(_stages(), inputs=("text",))
    with graph:
        yield graph


@pytest.mark.ray
def test_answers_like_run_graph(served):
    nodes = text_pipeline(*trained_text_models())
    for text in TEXTS:
        expected = run_graph(nodes, {"text": text})
        got = served.run({"text": text})
        assert list(got) == list(served.plan.order)
        assert got.pop("fault") == len(text)
        for name, value in got.items():
            if isinstance(value, np.ndarray):
                np.testing.assert_array_equal(value, expected[name])
            else:
                assert value == expected[name], name


@pytest.mark.ray
def test_batches_form_under_concurrent_load(served):
    before = served.batch_sizes()
    report = run_closed_loop(served, n_clients=8, n_requests=120, make_item=lambda i: {"text": TEXTS[i % 3]},
                             max_seconds=60)
    assert report.failed == 0 and len(report.latencies) == 120
    after = served.batch_sizes()
    assert set(after) == set(BATCHED), "exactly the stages with max_batch_size > 1 run under @serve.batch"
    new = {name: {b: n - before.get(name, {}).get(b, 0) for b, n in after[name].items()} for name in BATCHED}
    assert all(sum(b * n for b, n in sizes.items()) >= 120 for sizes in new.values()), new
    assert max(b for b, n in new["embed"].items() if n > 0) > 1, f"no batch above one item: {new}"
    assert all(b <= 16 for sizes in new.values() for b in sizes), "a batch exceeded max_batch_size"


@pytest.mark.ray
def test_every_listener_is_on_loopback(served):
    # Read from /proc, independently of the module: every process under this one, and this one.
    entries = listening([os.getpid(), *descendants(os.getpid())])
    assert not_loopback(entries) == [], "a process we started listens beyond 127.0.0.1"
    commands = [os.path.basename(command) for _, command, _, _ in entries]
    # Not vacuous: the core services and every replica (whose gRPC server the hook moves) were seen listening.
    assert {"gcs_server", "raylet"} <= set(commands), commands
    replicas = {c for c in commands if c.startswith("ray::ServeReplica")}
    assert len(replicas) == len(served.plan.nodes) + 1, replicas  # one per stage, plus the ingress
    # The module's own check agrees.
    assert {x.port for x in served.check_loopback()} == {port for _, _, _, port in entries}


@pytest.mark.ray
def test_a_failing_node_is_named(served):
    with pytest.raises(NodeError) as caught:
        served.run({"text": None})  # tokenize(None) fails
    assert caught.value.node == "tokenize"
    assert served.run({"text": TEXTS[0]})["format"], "the server still answers after a failed request"


@pytest.mark.ray
def test_serve_batch_starts_its_window_when_the_busy_replica_picks_the_first_request(served):
    # Ray's own @serve.batch, in our StageReplica, deployed as a second app on the module's Ray: request 0
    # waits out its window alone and keeps the replica busy for SERVICE s (the batch function blocks, as every
    # stage's does); requests 1-3 arrive meanwhile.  Triton's rule would start them the moment the replica is
    # free (they have waited more than WINDOW); Ray's rule, BatchPolicy(window="first_pick"), picks request 1
    # then and waits a whole WINDOW more.  The two rules' predictions for the second batch differ by WINDOW,
    # so agreeing within WINDOW / 2 says which rule Ray follows, with room for a busy machine's delays.  The
    # gap between the two batches' starts, both read inside the replica, does not depend on routing delays
    # as long as requests 1-3 reach the replica while batch 0 runs (at least 0.4 s of slack on each side).
    import time

    from ray import serve

    from infergraph_lite.frameworks.ray.options import from_stage
    from infergraph_lite.frameworks.ray.serve import STAGE_DEPLOYMENT
    from infergraph_lite.simulation.queue import simulate_batching

    window, service = 0.5, 1.5

    def timed(items):
        began = time.time()
        time.sleep(service)
        return [(began, len(items))] * len(items)

    probe = from_stage("probe", Stage(fn=timed, max_batch_size=8, max_wait=window), num_cpus=0.01)
    options = {**probe.options, "ray_actor_options": {"num_cpus": 0}}  # the module's graph holds the CPUs
    handle = serve.run(STAGE_DEPLOYMENT.options(name="probe", **options).bind("probe", probe.fn, probe.batching),
                       name="raybatch-probe", route_prefix=None)
    try:
        handle.remote(0).result(timeout_s=30)   # warm: the first call sets up routing
        offsets = [0.0, 0.9, 1.1, 1.3]          # 1-3 arrive while batch 0 runs (about 0.5 to 2.0)
        t0, responses = time.time(), []
        for offset in offsets:
            time.sleep(max(0.0, t0 + offset - time.time()))
            responses.append(handle.remote(offset))
        answers = [r.result(timeout_s=30) for r in responses]
    finally:
        serve.delete("raybatch-probe")
    starts = sorted({began for began, _ in answers})
    sizes = [size for _, size in sorted(set(answers))]
    assert sizes == [1, 3], f"request 0 alone, then the three that queued while it ran: {answers}"
    real_gap = starts[1] - starts[0]
    ray_rule = simulate_batching(None, service, 8, window, arrivals=offsets, warmup=0.0, allow_unstable=True,
                                 window="first_pick")
    triton_rule = simulate_batching(None, service, 8, window, arrivals=offsets, warmup=0.0, allow_unstable=True)
    assert ray_rule.batches_size.tolist() == triton_rule.batches_size.tolist() == [1, 3]
    predicted = {rule: float(np.diff(r.batches_start)[0]) for rule, r in
                 (("first_pick", ray_rule), ("oldest_request", triton_rule))}
    assert predicted == {"first_pick": service + window, "oldest_request": service}
    assert abs(real_gap - predicted["first_pick"]) < window / 2, (real_gap, predicted)


@pytest.mark.ray
def test_a_stage_that_raises_anything_or_dies_fails_its_requests_by_name(served):
    for text, said in (("please raise", "ValueError"), ("please exit", "SystemExit")):
        with pytest.raises(NodeError) as caught:
            served.run({"text": text}, timeout=120)
        assert caught.value.node == "fault" and said in str(caught.value), caught.value
    assert served.run({"text": TEXTS[0]}, timeout=120)["fault"] == len(TEXTS[0]), "the batch loop survived"
    with pytest.raises(NodeError) as caught:
        served.run({"text": "please crash"}, timeout=180)
    assert caught.value.node == "fault", caught.value
    # Serve replaces the dead replica; the graph answers again.
    assert served.run({"text": TEXTS[1]}, timeout=180)["fault"] == len(TEXTS[1])


@pytest.mark.ray
def test_zz_close_leaves_no_process(served):
    import time

    pytest.importorskip("distributed")
    from infergraph_lite.frameworks.dask import DaskGraphCluster
    from infergraph_lite.lessons.examples import BANANA_INPUTS, banana_nodes

    pids = served.started_pids()
    assert len(pids) >= 10, "Ray's services and one process per replica should have been running"
    # Another server in this interpreter, started after Ray: closing Ray must leave its processes alone.
    with DaskGraphCluster(banana_nodes(), inputs=["text"], n_workers=1) as cluster:
        dask_pids = cluster.started_pids()
        assert dask_pids and not set(dask_pids) & set(pids), "Ray counts only the processes its node started"
        slow = served.submit({"text": "please sleep 30"})  # still running when close begins
        time.sleep(1.0)
        started = time.monotonic()
        assert served.close(timeout=60) == [], "every process exited on its own after ray.shutdown()"
        assert time.monotonic() - started < 60 + 5, "close(timeout) is bounded"  # a promise, not a speed
        assert slow.done(), "close left a request pending"
        assert all(psutil.pid_exists(pid) for pid in dask_pids), "closing Ray stopped a Dask worker"
        assert cluster.submit(BANANA_INPUTS).result(timeout=60)["combine"] == {"len": 6, "a_count": 3}
    assert not ray.is_initialized()
    left = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert left == []


# --- faults while starting, each in a process of its own -------------------------------------------------------


def _start_with_fault(fault: str, timeout: float = 120.0) -> dict:
    import json
    import subprocess
    import sys

    env = {**os.environ, "FAULT_TIMEOUT": str(timeout)}
    # The child's own bound: start() within `timeout`, close within its 60 s, and Python's start and exit.
    done = subprocess.run([sys.executable, "-m", "tests.ray_faults", fault], capture_output=True, text=True,
                          timeout=timeout + 120, env=env, cwd=os.path.dirname(os.path.dirname(__file__)))
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"the fault run printed no result (exit {done.returncode}): {done.stderr[-2000:]}"
    result = json.loads(lines[-1])
    assert not [pid for pid in result["roots"] if psutil.pid_exists(pid)
                and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE], "a process Ray started outlived the run"
    return result


@pytest.mark.ray
def test_a_raylet_killed_while_starting_fails_the_start_by_name_and_leaves_nothing():
    # Before: serve.start waited in ray.get for a controller no node could run, with no deadline (issue 37).
    result = _start_with_fault("kill-raylet")
    error = result["error"]
    assert error["type"] == "RayStartError" and error["process"] == "raylet", error
    assert "raylet" in error["message"] and "SIGKILL" in error["message"], error
    assert result["seconds"] < 120, "the start ends long before its timeout: at the death, not at the deadline"
    assert result["left"] == [] and not result["ray_initialized"]


@pytest.mark.ray
def test_a_port_taken_while_starting_is_tried_again_on_fresh_ports():
    result = _start_with_fault("taken-port")
    assert result.get("answer") == {"n": 3}, result
    assert result["picks"] == 2, "the first pick's taken port failed the start, the second pick served"
    assert result["left"] == []


@pytest.mark.ray
def test_a_start_that_cannot_finish_ends_at_its_timeout_naming_the_step():
    result = _start_with_fault("never-deploys", timeout=25.0)
    error = result["error"]
    assert error["type"] == "RayStartError" and "deploying the graph" in error["message"], error
    assert 25.0 <= result["seconds"] < 25.0 + 30, "bounded by the timeout (and the stop that follows it)"
    assert result["left"] == []
