"""frameworks/triton: a stage graph becomes a Triton repository that the real schema accepts, and a real server answers.

Config tests need only tritonclient (every platform).  Server tests start the ``tritonserver`` binary from
the nvidia-pytriton wheel (Linux x86_64) on 127.0.0.1 and skip, saying why, where there is no wheel.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from tritonclient.grpc import model_config_pb2

from infergraph_lite import run_graph
from infergraph_lite.core.graph import CycleError, InvalidNodeError, MissingDependencyError, levels
from infergraph_lite.core.policy import AIMD
from infergraph_lite.core.stage import Stage, UnsupportedStageFieldError
from infergraph_lite.frameworks import triton
from infergraph_lite.frameworks.triton import (
    TRITON_FIELDS,
    TensorType,
    TritonClient,
    TritonConfigError,
    TritonServer,
    TritonStartError,
    TritonUnavailableError,
    add_model_version,
    config_from_stage,
    config_text,
    ensemble_to_graph,
    model_config_type_name,
    parse_model_config,
    read_config,
    read_repository,
    tensor_type_of,
    to_model_repository,
    triton_available,
)
from infergraph_lite.lessons.examples import BANANA_INPUTS, text_pipeline, text_pipeline_stages, trained_text_models
from infergraph_lite.lessons.triton_twin import calibrate_triton_hops
from infergraph_lite.serving.loadtest import run_closed_loop
from tests import stage_fns

TEXT = {"text": "The pizza was excellent for lunch."}
BATCHING = {"embed": {"max_batch_size": 16, "max_wait": 0.002, "max_queue_size": 64},
            "topic": {"max_batch_size": 16, "max_wait": 0.001, "replicas": 2},
            "sentiment": {"max_batch_size": 16, "max_wait": 0.001}}
needs_server = pytest.mark.skipif(triton_available() is not None, reason=f"no Triton here: {triton_available()}")


def tiny_stages() -> dict:
    """The seed's banana graph as batch functions (a factory the Triton stubs import from this module)."""
    return {
        "pre": (Stage(fn=lambda xs: [x.strip().lower() for x in xs], max_batch_size=4), ["text"]),
        "modelA": (Stage(fn=lambda xs: [len(x) for x in xs], max_batch_size=4), ["pre"]),
        "modelB": (Stage(fn=lambda xs: [x.count("a") for x in xs], max_batch_size=4), ["pre"]),
        "combine": (Stage(fn=lambda xs: [{"len": n, "a_count": a} for n, a in xs], max_batch_size=4),
                    ["modelA", "modelB"]),
    }


def tiny_stages_v2() -> dict:
    """Version 2 of the banana graph: combine also says which version answered."""
    stages = tiny_stages()
    stages["combine"] = (Stage(fn=lambda xs: [{"len": n, "a_count": a, "v": 2} for n, a in xs], max_batch_size=4),
                         ["modelA", "modelB"])
    return stages


def failing_stages() -> dict:
    """A graph whose modelB raises on the word 'boom'."""
    stages = tiny_stages()

    def model_b(xs: list) -> list:
        if any("boom" in x for x in xs):
            raise ValueError("cannot count 'boom'")
        if any("exit" in x for x in xs):
            raise SystemExit("asked to exit")  # a BaseException: uncaught, it would end the stub
        if any("crash" in x for x in xs):
            os._exit(3)  # the model's process dies mid-batch
        return [x.count("a") for x in xs]

    stages["modelB"] = (Stage(fn=model_b, max_batch_size=4), ["pre"])
    return stages


GATE = "INFERGRAPH_TEST_GATE"  # a folder: a gated stage holds each batch until GATE/release exists (60 s at most)


def gated_stages() -> dict:
    """One node that holds every batch while the folder named by $INFERGRAPH_TEST_GATE has no ``release`` file.

    Without the variable (this process, writing the repository) it answers at once; the server's stubs inherit
    it, so their requests stay open until the test says.
    """
    gate = os.environ.get(GATE)
    fn = (functools.partial(stage_fns.wait_for_file, started=f"{gate}/started", release=f"{gate}/release")
          if gate else list)
    return {"hold": (Stage(fn=fn, max_batch_size=4), ["text"])}


def text_stages() -> dict:
    return text_pipeline_stages(options=BATCHING)


def write_text_repository(path: Path):
    return to_model_repository(text_stages(), path, factory="infergraph_lite.lessons.examples:text_pipeline_stages",
                               example=TEXT, outputs=["format", "topic"])


# --- configs: the real schema and the graph module, no server ------------------------------------------------


def test_generated_configs_parse_with_triton_schema_and_carry_the_stage_knobs(tmp_path):
    repo = write_text_repository(tmp_path)
    configs = read_repository(tmp_path)
    assert sorted(configs) == sorted(repo.models) == sorted([*text_stages(), "pipeline"])
    embed = configs["embed"]
    assert (embed.backend, embed.max_batch_size) == ("python", 16)
    assert embed.dynamic_batching.max_queue_delay_microseconds == 2000
    kinds = [(g.count, model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind)) for g in configs["topic"].instance_group]
    assert kinds == [(2, "KIND_CPU")]
    assert embed.dynamic_batching.default_queue_policy.max_queue_size == 64
    assert not configs["sentiment"].dynamic_batching.HasField("default_queue_policy")  # no limit: none written
    assert not any(c.dynamic_batching.preferred_batch_size for c in configs.values())  # not modelled: not written
    assert not configs["merge"].HasField("dynamic_batching")  # max_batch_size 1: batching off
    assert [(t.name, list(t.dims)) for t in embed.output] == [("embed", [512])]
    assert model_config_type_name(embed.output[0].data_type) == "TYPE_FP64"  # the embedding travels as an array
    assert "model.py" in {p.name for p in (tmp_path / "embed" / "1").iterdir()}


def test_the_ensemble_follows_the_dag(tmp_path):
    repo = write_text_repository(tmp_path)
    graph = ensemble_to_graph(repo.config("pipeline"))
    stages = text_stages()
    assert graph.levels == levels(stages, ["text"])
    assert {n: sorted(deps) for n, (_, deps) in graph.nodes.items()} == {n: sorted(d) for n, (_, d) in stages.items()}
    assert graph.outputs == ["format", "topic"]


def test_tensor_types_follow_the_values():
    assert tensor_type_of(np.zeros(4, np.float32)) == TensorType.array("float32", (4,))
    assert tensor_type_of(True).data_type == "TYPE_BOOL"
    assert tensor_type_of(["a", "b"]).encoding == "json"
    kind = TensorType.scalar("int64")
    assert kind.decode(kind.encode([3, 4])) == [3, 4]
    with pytest.raises(TypeError, match="cannot travel"):
        tensor_type_of(object())


@pytest.mark.parametrize(("mistake", "field"), [
    ("max_batch_sise: 4", "max_batch_sise"),
    ("instance_group [ { kind: KIND_TPU } ]", "kind"),
    ('max_batch_size: "four"', "max_batch_size"),
    ("dynamic_batching { max_queue_delay: 100 }", "max_queue_delay"),
])
def test_a_config_the_schema_rejects_names_model_and_field(mistake, field):
    with pytest.raises(TritonConfigError) as err:
        parse_model_config(f'name: "embed"\nbackend: "python"\n{mistake}\n')
    assert (err.value.model, err.value.field) == ("embed", field)
    assert "embed" in str(err.value) and field in str(err.value)


def test_rules_beyond_the_schema_name_model_and_field(tmp_path):
    write_text_repository(tmp_path)
    config = tmp_path / "sentiment" / "config.pbtxt"
    config.write_text(config.read_text().replace("dynamic_batching {", "dynamic_batching { preferred_batch_size: 64"))
    with pytest.raises(TritonConfigError, match="preferred_batch_size") as err:
        read_repository(tmp_path)
    assert err.value.model == "sentiment"


@pytest.mark.parametrize("cap", [None, AIMD(latency_target=0.01)])
def test_stage_knobs_triton_cannot_express_are_refused_by_node_before_anything_is_written(tmp_path, cap):
    stages, ran = tiny_stages(), []
    stages["pre"] = (Stage(fn=lambda xs: ran.append(xs) or [x.lower() for x in xs], max_batch_size=4), ["text"])
    stages["modelA"] = (Stage(fn=stages["modelA"][0].fn, max_batch_size=cap), ["pre"])
    with pytest.raises(UnsupportedStageFieldError, match="Triton cannot serve stage 'modelA'") as err:
        to_model_repository(stages, tmp_path / "repo", factory="tests.test_triton:tiny_stages", example=BANANA_INPUTS)
    assert (err.value.engine, err.value.stage, err.value.field, err.value.value) == ("Triton", "modelA",
                                                                                     "max_batch_size", cap)
    assert not (tmp_path / "repo").exists() and not ran  # refused before anything was written or run


def test_the_repository_writer_takes_real_stages_only(tmp_path):
    with pytest.raises(InvalidNodeError, match=r"node 'n'.*Stage"):
        to_model_repository({"n": (lambda xs: xs, ["text"])}, tmp_path / "repo",
                            factory="tests.test_triton:tiny_stages", example={"text": "x"})
    stages = {"n": (Stage(service_time=1.0), ["text"])}  # simulated only: nothing to serve
    with pytest.raises(InvalidNodeError, match=r"node 'n'.*no fn"):
        to_model_repository(stages, tmp_path / "repo", factory="tests.test_triton:tiny_stages", example={"text": "x"})
    assert not (tmp_path / "repo").exists()


# --- config_from_stage: every Stage field mapped, ignored (and said so) or refused by name ---------------------


def test_every_stage_field_has_a_stated_fate():
    assert set(TRITON_FIELDS) == {f.name for f in dataclasses.fields(Stage)}


def test_batching_knobs_map_onto_their_triton_fields():
    config = config_from_stage("m", Stage(fn=list, max_batch_size=8, max_wait=0.0035, replicas=3, max_queue_size=10))
    assert config.max_batch_size == 8
    assert config.dynamic_batching.max_queue_delay_microseconds == 3500
    assert config.dynamic_batching.default_queue_policy.max_queue_size == 10
    assert [(g.count, g.kind) for g in config.instance_group] == [(3, model_config_pb2.ModelInstanceGroup.KIND_CPU)]
    assert config.backend == "python" and not config.dynamic_batching.preferred_batch_size
    greedy = config_from_stage("m", Stage(fn=list, max_batch_size=8))  # max_wait 0: the batcher still runs
    assert greedy.HasField("dynamic_batching") and greedy.dynamic_batching.max_queue_delay_microseconds == 0


def test_a_cap_of_one_keeps_the_batch_dimension_without_a_batcher_unless_the_queue_is_bounded():
    plain = config_from_stage("m", Stage(fn=list, max_batch_size=1, max_wait=0.5))
    assert plain.max_batch_size == 1 and not plain.HasField("dynamic_batching")
    bounded = config_from_stage("m", Stage(fn=list, max_batch_size=1, max_queue_size=4))
    assert bounded.dynamic_batching.default_queue_policy.max_queue_size == 4
    assert bounded.dynamic_batching.max_queue_delay_microseconds == 0 and bounded.max_batch_size == 1


def test_service_time_is_ignored_for_serving():
    with_cost = config_from_stage("m", Stage(fn=list, service_time=(2.0, 0.1), max_batch_size=4))
    assert with_cost == config_from_stage("m", Stage(fn=list, max_batch_size=4))


def test_a_stage_without_fn_is_refused_by_name():
    with pytest.raises(UnsupportedStageFieldError, match="stage 'm' with fn=None") as err:
        config_from_stage("m", Stage(service_time=1.0))
    assert err.value.field == "fn"


def test_a_field_the_adapter_does_not_know_is_refused_by_name():
    @dataclasses.dataclass(frozen=True)
    class PriorityStage(Stage):
        priority: int = 0

    assert config_from_stage("m", PriorityStage(fn=list)) == config_from_stage("m", Stage(fn=list))  # default: fine
    with pytest.raises(UnsupportedStageFieldError, match="priority=2") as err:
        config_from_stage("m", PriorityStage(fn=list, priority=2))
    assert err.value.field == "priority"


# --- writing and reading configs with protobuf's text format ---------------------------------------------------


def test_non_ascii_text_survives_a_write_and_read(tmp_path):
    config = config_from_stage("résumé", Stage(fn=list, max_batch_size=4), inputs=[("texte", TensorType.text())],
                               output=("résumé", TensorType.json()))
    config.parameters["note"].string_value = "naïve — 東京 ✓ \"quoted\" \\ back"
    text = config_text(config)
    assert "東京" in text and "résumé" in text  # written as UTF-8, readable
    (tmp_path / "config.pbtxt").write_text(text, encoding="utf-8")
    assert read_config((tmp_path / "config.pbtxt").read_text(encoding="utf-8"), "résumé") == config


def test_every_written_config_reads_back_as_the_message_it_was(tmp_path):
    write_text_repository(tmp_path)
    for model, config in read_repository(tmp_path).items():
        assert read_config(config_text(config), model) == config
        assert config_text(config) == (tmp_path / model / "config.pbtxt").read_text(encoding="utf-8")


@pytest.mark.parametrize(("text", "problem"), [
    ('name: "m" backend: "python" input [ { name: "x" }', "'[' opened on line 1 is never closed"),
    ('name: "m"\nbackend: "python"\ninput [ { name: "x" ] }', "line 3 has ']' where the '{' opened on line 3"),
    ('name: "m" backend: "python" }', "closes a '}' that was never opened"),
    ('name: "m" parameters { key: "a{" value { string_value: "[" } } }', "closes a '}' that was never opened"),
])
def test_an_unbalanced_bracket_is_a_config_error_naming_the_model(text, problem):
    with pytest.raises(TritonConfigError) as err:  # the old hand-written parser raised IndexError here
        read_config(text)
    assert err.value.model == "m" and problem in str(err.value)


def test_the_ensemble_lists_one_step_per_line_so_a_step_can_be_edited(tmp_path):
    repo = to_model_repository(tiny_stages(), tmp_path, factory="tests.test_triton:tiny_stages", example=BANANA_INPUTS)
    text = repo.config("pipeline")
    steps = [line for line in text.splitlines() if line.strip().startswith("step {")]
    assert [json.loads(line.split("model_name: ")[1].split()[0]) for line in steps] == list(tiny_stages())
    # combine's read of modelB is one unique piece of text (modelB's own step writes it in an output_map)
    broken = text.replace('input_map { key: "modelB" value: "modelB" }', 'input_map { key: "modelB" value: "modelBB" }')
    assert broken.count("modelBB") == 1
    with pytest.raises(TritonConfigError) as err:
        ensemble_to_graph(broken)
    assert isinstance(err.value.__cause__, MissingDependencyError) and err.value.model == "pipeline"


def test_parse_pbtxt_is_gone_and_every_public_name_resolves():
    assert not hasattr(triton, "parse_pbtxt")
    for name in triton.__all__:
        assert getattr(triton, name) is not None


def test_the_model_py_triton_runs_loads_the_backend_only(tmp_path):
    to_model_repository(tiny_stages(), tmp_path, factory="tests.test_triton:tiny_stages", example=BANANA_INPUTS)
    model_py = tmp_path / "modelA" / "1" / "model.py"
    assert "from infergraph_lite.frameworks.triton.backend import NodeModel" in model_py.read_text()
    probe = ("import json, runpy, sys; namespace = runpy.run_path(sys.argv[1]); "
             "assert namespace['TritonPythonModel'].node == 'modelA'; print(json.dumps(sorted(sys.modules)))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", probe, str(model_py)], capture_output=True, text=True,
                                       check=True).stdout)
    ours = {m.removeprefix("infergraph_lite.frameworks.triton") for m in loaded
            if m.startswith("infergraph_lite.frameworks.triton")}
    assert ours == {"", ".backend", ".tensors", ".errors"}
    assert not [m for m in loaded if m.split(".")[0] in ("tritonclient", "grpc", "google")]


ENSEMBLE = """
name: "banana"
platform: "ensemble"
max_batch_size: 4
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "RESULT" data_type: TYPE_STRING dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "pre" input_map { key: "IN" value: "TEXT" } output_map { key: "OUT" value: "clean" } },
  { model_name: "modelA" input_map { key: "IN" value: "clean" } output_map { key: "OUT" value: "length" } },
  { model_name: "modelB" input_map { key: "IN" value: "clean" } output_map { key: "OUT" value: "a_count" } },
  { model_name: "combine" input_map [ { key: "LEN" value: "length" }, { key: "A" value: "a_count" } ]
    output_map { key: "OUT" value: "RESULT" } }
] }
"""


def test_an_ensemble_reading_a_tensor_nobody_writes_is_a_missing_dependency():
    with pytest.raises(TritonConfigError) as err:
        ensemble_to_graph(ENSEMBLE.replace('value: "a_count" } ]', 'value: "a_cnt" } ]'))
    assert isinstance(err.value.__cause__, MissingDependencyError)
    assert err.value.model == "banana" and err.value.field == "ensemble_scheduling.step[3].input_map['A']"
    assert "'a_cnt'" in str(err.value) and "'combine'" in str(err.value)


def test_an_ensemble_whose_steps_feed_each_other_is_a_cycle():
    cyclic = ENSEMBLE.replace('key: "IN" value: "clean" } output_map { key: "OUT" value: "length"',
                              'key: "IN" value: "RESULT" } output_map { key: "OUT" value: "length"')
    with pytest.raises(TritonConfigError, match="not a DAG") as err:
        ensemble_to_graph(cyclic)
    assert isinstance(err.value.__cause__, CycleError)
    assert err.value.__cause__.cycle == ["combine", "modelA"]


def test_a_hand_written_ensemble_wires_the_members_tensor_names(tmp_path):
    repo = to_model_repository(tiny_stages(), tmp_path, factory="tests.test_triton:tiny_stages",
                               example=BANANA_INPUTS, ensemble=ENSEMBLE)
    configs = read_repository(tmp_path)
    assert repo.ensemble == "banana" and list(repo.inputs) == ["TEXT"]
    assert [t.name for t in configs["combine"].input] == ["LEN", "A"]  # in the order of combine's dependencies
    wrong = ENSEMBLE.replace('key: "LEN" value: "length"', 'key: "LEN" value: "clean"')
    with pytest.raises(TritonConfigError, match="depends on") as err:
        to_model_repository(tiny_stages(), tmp_path / "x", factory="tests.test_triton:tiny_stages",
                            example=BANANA_INPUTS, ensemble=wrong)
    assert err.value.field == "ensemble_scheduling.step[3].input_map['LEN']"


def test_a_platform_without_the_wheel_gets_a_clear_error(monkeypatch, tmp_path):
    to_model_repository(tiny_stages(), tmp_path, factory="tests.test_triton:tiny_stages", example=BANANA_INPUTS)
    monkeypatch.setattr(sys, "platform", "darwin")
    with pytest.raises(TritonUnavailableError, match="container"):
        TritonServer(tmp_path).start()


def test_a_missing_binary_gets_a_clear_error_and_starts_nothing(monkeypatch, tmp_path):
    from infergraph_lite.frameworks.triton import server

    to_model_repository(tiny_stages(), tmp_path, factory="tests.test_triton:tiny_stages", example=BANANA_INPUTS)
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(server.os, "uname", lambda: type("U", (), {"machine": "x86_64"})())
    monkeypatch.setattr(server.importlib.util, "find_spec", lambda name: None)
    before = own_processes()
    with pytest.raises(TritonUnavailableError, match="nvidia-pytriton is not installed"):
        TritonServer(tmp_path).start()
    assert own_processes() <= before


# --- the client's statistics wait for Triton to count what it has answered ------------------------------------


class LaggingStream:
    """A Triton stream whose counters show each answer only ``lag`` reads after it was given (as a backend reports
    its statistics after it sends the response)."""

    def __init__(self, lag: int):
        self.lag, self.answered, self.reads, self.pending = lag, 0, 0, []
        self.counted = {"pipeline": 0, "pre": 0, "post": 0, "other": 5}

    def get_model_config(self, model, as_json=True, client_timeout=None):
        tensors = {"input": [{"name": "text", "data_type": "TYPE_STRING", "dims": ["1"]}],
                   "output": [{"name": "out", "data_type": "TYPE_STRING", "dims": ["1"]}]}
        steps = [{"model_name": "pre"}, {"model_name": "post"}] if model == "pipeline" else []
        return {"config": {**tensors, "ensemble_scheduling": {"step": steps}} if steps else tensors}

    def infer(self, model, tensors, outputs=None, client_timeout=None):
        self.pending.append((self.reads + self.lag, [model, "pre", "post"] if model == "pipeline" else [model]))
        return type("Result", (), {"as_numpy": lambda self, name: np.array([b"ok"], dtype=object)})()

    def get_inference_statistics(self, model, version, as_json=True, client_timeout=None):
        self.reads += 1
        for _, names in [p for p in self.pending if p[0] < self.reads]:
            for name in names:
                self.counted[name] += 1
        self.pending = [p for p in self.pending if p[0] >= self.reads]
        return {"model_stats": [{"name": n, "inference_stats": {"success": {"count": c}}} for n, c in
                                self.counted.items()]}

    def close(self):
        pass


def test_statistics_wait_until_triton_has_counted_every_answer_this_client_had():
    client = TritonClient("127.0.0.1:1", settle_timeout=5.0)  # gRPC connects lazily: nothing is dialled
    client._stream = stream = LaggingStream(lag=3)
    before = client.statistics()
    for _ in range(4):
        client.infer({"text": "a"})
    client.infer({"text": "b"}, model="other")
    reads, started = stream.reads, time.monotonic()
    after = client.statistics()
    assert {name: after[name].requests - before[name].requests for name in after} == {
        "pipeline": 4, "pre": 4, "post": 4, "other": 1}  # the ensemble's members too; "other" from its own count
    assert stream.reads - reads >= 2  # it read again: the first read after the answers was early
    assert time.monotonic() - started < 1.0  # caught up, not timed out
    assert client.statistics(version="1")["pipeline"].requests == after["pipeline"].requests  # one read as it is
    stream.counted["pipeline"] = 0  # Triton reloaded the ensemble: its counters start again
    started = time.monotonic()
    assert client.statistics()["pipeline"].requests == 0 and time.monotonic() - started < 1.0  # owed from there
    client.infer({"text": "c"})
    assert client.statistics()["pipeline"].requests == 1
    client.settle_timeout = 0.0  # given no time, the counts come as they are
    client.infer({"text": "d"})
    assert client.statistics()["pipeline"].requests == 1


# --- a real server ---------------------------------------------------------------------------------------------


def own_processes() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.fixture(scope="module")
def text_server(tmp_path_factory):
    if triton_available() is not None:
        pytest.skip(f"no Triton here: {triton_available()}")
    repo = write_text_repository(tmp_path_factory.mktemp("text-repo"))
    with TritonServer(repo) as server:
        yield server


@pytest.fixture(scope="module")
def text_client(text_server):
    with text_server.client() as client:
        yield client


@needs_server
def test_the_served_graph_answers_as_run_graph_does(text_client):
    expected = run_graph(text_pipeline(*trained_text_models()), TEXT)
    answer = text_client.infer(TEXT)
    assert answer["format"] == expected["format"]
    assert answer["topic"] == expected["topic"]


@needs_server
def test_submit_gives_futures_and_statistics_give_the_real_batches(text_client):
    before = text_client.statistics()
    texts = [f"the match was great, goal number {i}" for i in range(48)]
    report = run_closed_loop(text_client, n_clients=8, n_requests=len(texts), make_item=lambda i: {"text": texts[i]})
    assert len(report.latencies) == 48 and report.failed == 0
    expected = run_graph(text_pipeline(*trained_text_models()), {"text": texts[5]})["format"]
    assert text_client.submit({"text": texts[5]}).result(timeout=30)["format"] == expected
    after = text_client.statistics()
    for name in ("embed", "topic", "merge"):
        delta = after[name] - before[name]
        assert delta.requests == 49
        assert sum(b * n for b, n in delta.batch_sizes.items()) == delta.inferences == 49
        assert delta.executions == sum(delta.batch_sizes.values())
    assert max(after["merge"].batch_sizes) == 1  # batching off there
    assert max(after["embed"].batch_sizes) <= 16
    times = (after["embed"] - before["embed"]).stage_times()
    assert times.queue >= 0 and times.compute > 0


@needs_server
def test_one_request_of_several_rows_is_one_request_and_one_batch_of_that_many(text_client):
    texts = ["the match was great", "awful hotel, never again", "my new laptop is fast"]
    stages = text_pipeline_stages()
    vectors = stages["embed"][0].fn(stages["tokenize"][0].fn(texts))
    before = text_client.statistics()["topic"]
    answers = text_client.infer_rows([{"embed": v} for v in vectors], model="topic")
    delta = text_client.statistics()["topic"] - before
    assert answers == [{"topic": t} for t in stages["topic"][0].fn(vectors)]  # one answer per row, in order
    assert (delta.requests, delta.inferences, delta.batch_sizes) == (1, 3, {3: 1})
    with pytest.raises(ValueError, match="rows must be a non-empty list"):
        text_client.infer_rows([], model="topic")
    with pytest.raises(ValueError, match="rows must be a non-empty list"):
        text_client.infer_rows({"embed": vectors[0]}, model="topic")  # one row's dict, not a list of rows
    with pytest.raises(ValueError, match="rows must be a non-empty list"):
        text_client.infer_rows("the match was great", model="topic")  # a text is a sequence, not rows


@needs_server
def test_lone_requests_measure_each_steps_hand_off_above_its_batching_delay_and_the_grpc_trip(text_client):
    hops = calibrate_triton_hops(text_client, "pipeline", text_stages(), lambda i: {"text": f"{TEXT['text']} {i}"},
                                 n_requests=12, spacing=0.1)
    assert sorted(hops.hop_delay) == sorted(text_stages())
    assert all(hops.counters[name].requests == 12 for name in [*text_stages(), "pipeline"])
    # embed's batcher waits its 2 ms max_queue_delay for a lone request; the hop is the queue time above it
    assert hops.counters["embed"].mean_queue >= 0.002
    assert hops.hop_delay["embed"] == pytest.approx(max(hops.counters["embed"].mean_queue - 0.002, 0.0))
    assert hops.hop_delay["merge"] == hops.counters["merge"].mean_queue  # no batcher there: all of it is hand-off
    assert all(0 <= d < 0.05 for d in hops.hop_delay.values())
    assert 0 < hops.server_latency < hops.client_latency  # the gRPC trip is real time
    with pytest.raises(ValueError, match="no model 'pipe'"):
        calibrate_triton_hops(text_client, "pipe", text_stages(), lambda i: TEXT)
    with pytest.raises(ValueError, match="the requests also went through format, merge, sentiment, tokenize, topic"):
        calibrate_triton_hops(text_client, "pipeline", {"embed": text_stages()["embed"]}, lambda i: TEXT,
                              n_requests=3, spacing=0.05)
    with pytest.raises(ValueError, match="no request reached rerank"):
        calibrate_triton_hops(text_client, "pipeline", {**text_stages(), "rerank": text_stages()["embed"]},
                              lambda i: TEXT, n_requests=3, spacing=0.05)
    with pytest.raises(ValueError, match=r"spacing=0\.001 s is shorter than 3 of the 3 lone requests' latencies"):
        calibrate_triton_hops(text_client, "pipeline", text_stages(), lambda i: TEXT, n_requests=3, spacing=0.001)


@needs_server
def test_every_listening_socket_of_the_server_is_loopback(text_server):
    server = psutil.Process(text_server.pid)
    family = [server, *server.children(recursive=True)]
    listening = [(p.pid, c.laddr) for p in family for c in p.net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN]
    assert {port for _, (_, port) in listening} >= {text_server.http_port, text_server.grpc_port,
                                                    text_server.metrics_port}
    for pid, (address, port) in listening:
        ip = ipaddress.ip_address(address)
        ip = getattr(ip, "ipv4_mapped", None) or ip  # ::ffff:127.0.0.1 is IPv4's loopback, seen from IPv6
        assert ip.is_loopback, f"process {pid} ({psutil.Process(pid).name()}) listens on {address}:{port}"


@needs_server
def test_a_node_that_raises_answers_with_an_error_naming_it(tmp_path):

    repo = to_model_repository(failing_stages(), tmp_path, factory="tests.test_triton:failing_stages",
                               example=BANANA_INPUTS)
    with TritonServer(repo) as server, server.client() as client:
        assert client.infer(BANANA_INPUTS)["combine"] == {"len": 6, "a_count": 3}
        with pytest.raises(RuntimeError, match=r"modelB.*cannot count 'boom'"):
            client.submit({"text": "boom"}).result(timeout=30)
        with pytest.raises(RuntimeError, match=r"modelB.*SystemExit.*asked to exit"):
            client.submit({"text": "exit"}).result(timeout=30)
        assert client.infer(BANANA_INPUTS)["combine"] == {"len": 6, "a_count": 3}, "the stub survived SystemExit"
        family = [p.pid for p in server.processes()]
        with pytest.raises(RuntimeError, match=r"modelB"):  # Triton names the instance whose stub died
            client.submit({"text": "crash"}).result(timeout=60)
        started = time.monotonic()
        server.stop(timeout=15)
        assert time.monotonic() - started < 15 + 5, "stop(timeout) is bounded"  # a promise, not a speed
    assert not [pid for pid in family if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]


@needs_server
def test_stopping_leaves_no_process_also_when_the_block_raises(tmp_path):
    to_model_repository(tiny_stages(), tmp_path, factory="tests.test_triton:tiny_stages", example=BANANA_INPUTS)
    with pytest.raises(KeyError), TritonServer(tmp_path) as server:
        family = [server.pid, *(p.pid for p in psutil.Process(server.pid).children(recursive=True))]
        assert len(family) >= 5  # the server and a Python stub per model
        raise KeyError("the cell failed")
    assert not [pid for pid in family if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert server.pid is None


def test_a_factory_that_cannot_rebuild_the_graph_is_refused_before_any_server(tmp_path):
    with pytest.raises(TritonConfigError, match="no_such_factory") as err:
        to_model_repository(tiny_stages(), tmp_path, factory="tests.test_triton:no_such_factory",
                            example=BANANA_INPUTS)
    assert err.value.field == "factory"
    with pytest.raises(TritonConfigError, match="does not rebuild node 'pre'"):
        to_model_repository(tiny_stages(), tmp_path, factory="infergraph_lite.lessons.examples:text_pipeline_stages",
                            example=BANANA_INPUTS)


@needs_server
def test_a_model_that_cannot_load_fails_fast_with_its_name_and_no_process(tmp_path):
    to_model_repository(tiny_stages(), tmp_path, factory="tests.test_triton:tiny_stages", example=BANANA_INPUTS)
    (tmp_path / "modelA" / "1" / "model.py").write_text("raise RuntimeError('the weights are corrupt')\n")
    before = own_processes()
    with pytest.raises(TritonStartError, match=r"model 'modelA' failed to load.*the weights are corrupt"):
        TritonServer(tmp_path, timeout=60).start()
    assert own_processes() <= before


def test_a_bad_config_fails_before_any_process_starts(tmp_path):
    to_model_repository(tiny_stages(), tmp_path, factory="tests.test_triton:tiny_stages", example=BANANA_INPUTS)
    config = tmp_path / "modelB" / "config.pbtxt"
    config.write_text(config.read_text().replace("kind: KIND_CPU", "kind: KIND_CPUS"))
    before = own_processes()
    with pytest.raises(TritonConfigError) as err:
        TritonServer(tmp_path).start()
    assert (err.value.model, err.value.field) == ("modelB", "kind")
    assert own_processes() <= before


@needs_server
def test_a_taken_port_is_named_and_leaves_no_process(tmp_path):
    to_model_repository(tiny_stages(), tmp_path, factory="tests.test_triton:tiny_stages", example=BANANA_INPUTS)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        free = [s.getsockname()[1] for s in [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]]
        before = own_processes()
        with pytest.raises(TritonStartError, match=rf"port.*{port}|{port}.*port"):
            TritonServer(tmp_path, ports=[port, *free], timeout=60).start()
    assert own_processes() <= before


@needs_server
def test_a_server_killed_with_requests_open_fails_each_naming_its_death_and_leaves_nothing(tmp_path, monkeypatch):
    to_model_repository(gated_stages(), tmp_path / "repo", factory="tests.test_triton:gated_stages",
                        example={"text": "hi"})
    monkeypatch.setenv(GATE, str(tmp_path))  # the stubs hold every batch: the requests stay open
    before = own_processes()
    with TritonServer(tmp_path / "repo", timeout=60) as server, server.client(timeout=60) as client:
        pid, family = server.pid, [p.pid for p in server.processes()]
        futures = [client.submit({"text": f"request {i}"}) for i in range(6)]
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists():  # a batch is inside the model: mid-request
            assert time.monotonic() < deadline and not any(f.done() for f in futures), "no batch ever started"
            time.sleep(0.005)
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        died = rf"tritonserver \(pid {pid}\) died \(killed by SIGKILL\); its log ends: '.+'"
        for future in futures:
            with pytest.raises(RuntimeError, match=died):
                future.result(timeout=30)
        assert time.monotonic() - killed < 5, "each open request failed at once, not at its 60 s deadline"
        with pytest.raises(RuntimeError, match=died):
            client.infer({"text": "a request sent after the death"})
    assert not [p for p in family if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
    assert own_processes() <= before


@needs_server
def test_a_server_that_exits_during_start_up_is_named_with_its_pid_and_log_line(tmp_path):
    to_model_repository(tiny_stages(), tmp_path, factory="tests.test_triton:tiny_stages", example=BANANA_INPUTS)
    before = own_processes()
    with pytest.raises(TritonStartError, match=r"tritonserver \(pid \d+\) exited \(exit status 1\): "
                                               r".*unrecognized option '--no-such-flag'"):
        TritonServer(tmp_path, extra_args=["--no-such-flag"], timeout=60).start()
    assert own_processes() <= before


@needs_server
def test_a_new_version_takes_the_traffic_when_loaded(tmp_path):
    repo = to_model_repository(tiny_stages(), tmp_path, factory="tests.test_triton:tiny_stages",
                               example=BANANA_INPUTS)
    with TritonServer(repo, model_control="explicit") as server, server.client() as client:
        assert client.infer(BANANA_INPUTS)["combine"] == {"len": 6, "a_count": 3}
        add_model_version(repo, "combine", 2, "tests.test_triton:tiny_stages_v2")
        assert client.infer(BANANA_INPUTS)["combine"] == {"len": 6, "a_count": 3}  # not loaded yet
        client.load("combine")
        assert client.ready_versions("combine") == ["2"]
        assert client.infer(BANANA_INPUTS)["combine"] == {"len": 6, "a_count": 3, "v": 2}


def test_a_ctrl_c_while_stopping_still_kills_the_server(monkeypatch):
    from infergraph_lite.frameworks.triton import server

    stubborn = subprocess.Popen(["bash", "-c", "trap '' INT; sleep 60"], start_new_session=True)
    real_wait, calls = stubborn.wait, []

    def interrupted_wait(timeout=None):
        calls.append(timeout)
        if len(calls) == 1:
            raise KeyboardInterrupt  # the learner presses Ctrl-C while the server shuts down
        return real_wait(timeout)

    monkeypatch.setattr(stubborn, "wait", interrupted_wait)
    with pytest.raises(KeyboardInterrupt):
        server._stop_process_group(stubborn, grace=5.0)
    assert stubborn.poll() is not None


def test_the_reader_takes_comments_escapes_and_repeated_fields():
    # Moved here with the reader from the exercise checks' tests (they tested the hand-written parser).
    config = parse_model_config('# a comment\nname: "a\\"b"\n'
                                'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1, -1 ] } ]\n'
                                "instance_group { count: 1 } instance_group { count: 2 kind: KIND_GPU }")
    assert config.name == 'a"b' and list(config.input[0].dims) == [1, -1]
    assert [(g.count, model_config_pb2.ModelInstanceGroup.Kind.Name(g.kind)) for g in config.instance_group] == [
        (1, "KIND_AUTO"), (2, "KIND_GPU")]


def test_a_start_that_fails_before_the_process_leaves_no_temporary_folder(monkeypatch, tmp_path):
    from infergraph_lite.frameworks.triton import server

    to_model_repository(tiny_stages(), tmp_path / "repo", factory="tests.test_triton:tiny_stages",
                        example=BANANA_INPUTS)
    fake = tmp_path / "pytriton"  # a wheel whose Python backend has no stub for this Python
    (fake / "backends" / "python").mkdir(parents=True)
    for name in ("libtriton_python.so", "triton_python_backend_utils.py"):
        (fake / "backends" / "python" / name).write_text("")
    monkeypatch.setattr(server, "_pytriton_root", lambda: fake)
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(server.tempfile, "tempdir", str(temp))
    with pytest.raises(TritonUnavailableError, match="no Python backend stub"):
        TritonServer(tmp_path / "repo").start()
    assert list(temp.iterdir()) == [], "the working folder of a failed start was left behind"


@needs_server
def test_a_port_taken_after_the_pick_is_retried_on_new_ports(monkeypatch, tmp_path):
    from infergraph_lite.frameworks.triton import server

    to_model_repository(tiny_stages(), tmp_path, factory="tests.test_triton:tiny_stages", example=BANANA_INPUTS)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        picks = []
        real = server._free_ports

        def racy_pick(count: int) -> list[int]:  # the first pick loses the race: its HTTP port is taken
            picks.append(real(count) if picks else [port, *real(count - 1)])
            return picks[-1]

        monkeypatch.setattr(server, "_free_ports", racy_pick)
        with TritonServer(tmp_path, timeout=60) as triton, triton.client() as client:
            assert triton.attempts == 2 and triton.http_port != port and len(picks) == 2
            assert client.infer(BANANA_INPUTS)["combine"] == {"len": 6, "a_count": 3}


@needs_server
def test_a_dask_cluster_beside_triton_stops_only_its_own_processes(text_server, text_client):
    pytest.importorskip("distributed")
    from infergraph_lite.frameworks.dask import DaskGraphCluster
    from infergraph_lite.lessons.examples import banana_nodes

    triton_family = {p.pid for p in text_server.processes()}
    cluster = DaskGraphCluster(banana_nodes(), inputs=["text"], n_workers=1).start()
    dask_pids = cluster.started_pids()
    assert dask_pids and not set(dask_pids) & triton_family
    assert cluster.submit(BANANA_INPUTS).result(timeout=60)["combine"] == {"len": 6, "a_count": 3}
    assert cluster.close(timeout=30) == []
    assert all(psutil.pid_exists(pid) for pid in triton_family), "closing Dask stopped a Triton process"
    assert text_client.infer(TEXT)["format"], "Triton still answers"


SCRIPT_SIDE_FACTORY = '''
def script_side_stages():
    from infergraph_lite.core.stage import Stage

    def shout(items):
        return [str(x).upper() for x in items]
    return {"pre": (Stage(fn=shout), ["text"])}
'''


def test_a_factory_beside_the_running_script_is_copied_as_source(tmp_path, monkeypatch):
    # `python benchmarks/bench_x.py` imports its sibling modules from benchmarks/, a folder Triton's stubs
    # (started in the working directory) never see: such a factory must travel as source, not as a name.
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "_side_graphs.py").write_text(SCRIPT_SIDE_FACTORY)
    monkeypatch.syspath_prepend(str(scripts))
    monkeypatch.setattr(sys, "argv", [str(scripts / "bench_side.py")])
    monkeypatch.delitem(sys.modules, "_side_graphs", raising=False)
    import _side_graphs

    repo = tmp_path / "models"
    to_model_repository(_side_graphs.script_side_stages(), repo, factory=_side_graphs.script_side_stages,
                        example={"text": "hi"})
    model_py = (repo / "pre" / "1" / "model.py").read_text()
    assert "FACTORY = 'file:_factory_script_side_stages.py:script_side_stages'" in model_py
    assert "def script_side_stages" in (repo / "_factory_script_side_stages.py").read_text()
    monkeypatch.chdir(scripts)  # run from the script's own folder, the stub would find it: a name is enough
    to_model_repository(_side_graphs.script_side_stages(), tmp_path / "again", factory=_side_graphs.script_side_stages,
                        example={"text": "hi"})
    assert "FACTORY = '_side_graphs:script_side_stages'" in (tmp_path / "again" / "pre" / "1" / "model.py").read_text()
