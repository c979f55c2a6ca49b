"""llama.cpp's real server (xllamacpp): start/stop by PID, loopback only, named start-up errors, streaming
requests with exact token counts, batching seen in the server's own counters, and the step-time fit.

One 8-slot and one 1-slot server per module, on a ~3.4M-parameter random model, keep this file quick.
No timing is asserted: batching is read from llama.cpp's counters (tokens per decode call).
"""

from __future__ import annotations

import gc
import math
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from concurrent.futures import Future
from dataclasses import replace

import numpy as np
import psutil
import pytest

pytest.importorskip("xllamacpp")
pytest.importorskip("gguf")

from infergraph_lite.frameworks.llamacpp import (
    BadParameterError,
    Completion,
    CompletionRequest,
    LlamaCppClient,
    LlamaCppServer,
    ModelLoadError,
    ModelMissingError,
    PortTakenError,
    RequestError,
    ServerStartError,
    SlotMonitor,
    StepTimeModel,
    fit_step_time,
    parse_prometheus,
    prompt_of,
    tokens_per_decode,
    write_tiny_llama,
)
from infergraph_lite.frameworks.llamacpp import server as llamacpp_server  # the real module, for monkeypatch
from infergraph_lite.serving.loadtest import run_closed_loop, run_open_loop
from tests.proc_sockets import descendants, listening, not_loopback

N_PREDICT = 24


def own_processes() -> set[int]:
    return set(descendants(os.getpid()))


@pytest.fixture(scope="module", autouse=True)
def leaves_nothing():
    # Set up first, torn down last: after the module's servers have stopped, no process of ours is left.
    before = own_processes()
    yield
    left = own_processes() - before
    assert not left, f"processes left behind: {left}"


@pytest.fixture(scope="module")
def model():
    return write_tiny_llama(embd=256, layers=4, ff=768, heads=8, kv_heads=4, ctx=2048, seed=0)


@pytest.fixture(scope="module")
def server8(model):
    with LlamaCppServer(model, n_parallel=8, n_ctx=8 * 256, threads=1) as server:
        yield server
    assert not psutil.pid_exists(server.pid) or psutil.Process(server.pid).status() == psutil.STATUS_ZOMBIE


@pytest.fixture(scope="module")
def server1(model):
    with LlamaCppServer(model, n_parallel=1, n_ctx=512, threads=1) as server:
        yield server


# --- the model file ---------------------------------------------------------------------------------------------


def test_the_model_is_cached_and_reproducible(model, tmp_path):
    again = write_tiny_llama(embd=256, layers=4, ff=768, heads=8, kv_heads=4, ctx=2048, seed=0)
    assert again == model, "the same parameters reuse the cached file"
    a = write_tiny_llama(tmp_path / "a.gguf", embd=64, layers=1, ff=128, heads=4, kv_heads=2, ctx=512, seed=3)
    b = write_tiny_llama(tmp_path / "b.gguf", embd=64, layers=1, ff=128, heads=4, kv_heads=2, ctx=512, seed=3)
    c = write_tiny_llama(tmp_path / "c.gguf", embd=64, layers=1, ff=128, heads=4, kv_heads=2, ctx=512, seed=4)
    assert a.path.read_bytes() == b.path.read_bytes(), "seeded: the same bytes"
    assert a.path.read_bytes() != c.path.read_bytes(), "another seed, other weights"
    assert model.kv_bytes_per_token() == 2 * 4 * 4 * 32 * 2


@pytest.mark.parametrize(("kwargs", "named"), [({"embd": 100, "heads": 8}, "embd"), ({"kv_heads": 3}, "heads"),
                                               ({"layers": 0}, "layers"), ({"seed": -1}, "seed")])
def test_a_bad_model_shape_is_refused_by_name(kwargs, named, tmp_path):
    with pytest.raises(ValueError, match=named):
        write_tiny_llama(tmp_path / "x.gguf", **kwargs)
    assert not (tmp_path / "x.gguf").exists()


# --- start, stop, sockets ---------------------------------------------------------------------------------------


def test_every_listening_socket_of_the_server_is_loopback(server8):
    assert server8.running and server8.pid in own_processes()
    sockets = listening([server8.pid, *descendants(server8.pid)])
    assert server8.port in {port for *_, port in sockets}
    assert not_loopback(sockets) == [], sockets


def test_close_stops_the_process_by_its_pid_and_leaves_nothing(model):
    before = own_processes()
    server = LlamaCppServer(model, n_parallel=2, threads=1)
    pid = server.pid
    assert pid in own_processes()
    server.close()
    server.close()      # twice is harmless
    assert not server.running and own_processes() <= before
    assert not psutil.pid_exists(pid)


def test_a_block_that_raises_leaves_no_process(model):
    before = own_processes()
    with pytest.raises(ZeroDivisionError), LlamaCppServer(model, threads=1) as server:
        pid = server.pid
        raise ZeroDivisionError("a cell that fails")
    assert not psutil.pid_exists(pid) and own_processes() <= before


def test_a_server_nobody_closes_is_stopped_when_collected(model):
    before = own_processes()
    server = LlamaCppServer(model, threads=1)
    pid = server.pid
    del server
    gc.collect()
    assert not psutil.pid_exists(pid) and own_processes() <= before


def test_a_server_left_open_is_stopped_when_python_exits(model):
    code = textwrap.dedent(f"""
        from infergraph_lite.frameworks.llamacpp.server import LlamaCppServer
        s = LlamaCppServer({str(model.path)!r}, threads=1)
        print(s.pid, flush=True)
    """)     # no close(): the interpreter's exit must stop it
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    child = int(result.stdout.split()[0])
    assert result.returncode == 0, result.stderr
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE


def test_the_server_ends_when_its_parent_dies_without_cleaning_up(model):
    # The parent is SIGKILLed: no finaliser runs, but the child sees its stdin close and stops.
    code = textwrap.dedent(f"""
        from infergraph_lite.frameworks.llamacpp.server import LlamaCppServer
        s = LlamaCppServer({str(model.path)!r}, threads=1)
        print(s.pid, flush=True)
        import time; time.sleep(120)
    """)
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=dict(os.environ))
    try:
        child = int(parent.stdout.readline())
        assert psutil.pid_exists(child)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        parent.stdout.close()
    proc = psutil.Process(child) if psutil.pid_exists(child) else None
    if proc is not None:
        _, alive = psutil.wait_procs([proc], timeout=15)
        for p in alive:          # do not leave it behind even if the check fails
            p.kill()
        assert not alive, "the orphaned server kept running"


def test_a_ctrl_c_while_stopping_still_kills_the_server(model, monkeypatch):
    server = LlamaCppServer(model, threads=1)
    pid = server.pid

    def interrupted(pids, timeout=10.0):
        raise KeyboardInterrupt

    monkeypatch.setattr(llamacpp_server, "stop_processes", interrupted)
    with pytest.raises(KeyboardInterrupt):
        server.close()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_server_that_dies_mid_stream_fails_the_request_instead_of_hanging(model):
    server = LlamaCppServer(model, threads=1)
    with server.client(n_predict=2000, timeout=60) as client:
        future = client.submit(CompletionRequest(prompt_of(4), 240))
        while server.busy_slots() == 0 and not future.done():
            time.sleep(0.005)
        server.close()
        with pytest.raises(RequestError, match=r"llama\.cpp server \(pid \d+\) was stopped"):
            future.result(timeout=60)


def test_a_server_killed_mid_stream_fails_every_open_request_naming_its_death_and_leaves_nothing(model):
    # SIGKILL, not close(): no clean shutdown, the process's sockets just close under the open streams.
    before = own_processes()
    server = LlamaCppServer(model, n_parallel=4, n_ctx=4 * 512, threads=1)
    pid = server.pid
    try:
        with server.client(n_predict=400, timeout=60) as client:
            futures = [client.submit(CompletionRequest(prompt_of(4), 400)) for _ in range(4)]
            deadline = time.monotonic() + 60
            while not all(s["is_processing"] and s.get("next_token", [{}])[0].get("n_decoded", 0) > 0
                          for s in server.slots()):        # every request has streamed a token: mid-stream
                assert time.monotonic() < deadline and not any(f.done() for f in futures), "the streams never began"
                time.sleep(0.005)
            os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            died = rf"llama\.cpp server \(pid {pid}\) died \(killed by SIGKILL\); its log ends: '.+'"
            for future in futures:
                with pytest.raises(RequestError, match=died):
                    future.result(timeout=30)
            assert time.monotonic() - killed < 5, "each open request failed at once, not at its 60 s timeout"
            with pytest.raises(RequestError, match=died):
                client.complete("a request sent after the death")
    finally:
        server.close()
    assert not psutil.pid_exists(pid) and own_processes() <= before


# --- named start-up errors --------------------------------------------------------------------------------------


def test_a_missing_model_is_named_and_starts_nothing(tmp_path):
    before = own_processes()
    with pytest.raises(ModelMissingError, match=r"nope\.gguf"):
        LlamaCppServer(tmp_path / "nope.gguf")
    assert own_processes() <= before


def test_a_file_that_is_not_gguf_is_named_and_starts_nothing(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model" * 10)
    before = own_processes()
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        LlamaCppServer(bad)
    assert own_processes() <= before


def test_a_model_llama_cpp_cannot_load_is_named_from_its_log(model, tmp_path, monkeypatch):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(model.path.read_bytes()[:100_000])      # a GGUF header, then nothing
    monkeypatch.setattr(llamacpp_server, "trained_context_length", lambda path: None)   # let it reach llama.cpp
    before = own_processes()
    with pytest.raises(ModelLoadError, match="could not load the model"):
        LlamaCppServer(broken, threads=1)
    assert own_processes() <= before


def test_a_server_that_dies_during_start_up_is_named_with_its_pid_and_log_line(model, tmp_path, monkeypatch):
    # The child's interpreter dies before llama.cpp is reached (a sitecustomize that exits): its last words count.
    (tmp_path / "sitecustomize.py").write_text(
        "import os, sys\nprint('fatal: this CPU lacks AVX2', file=sys.stderr, flush=True)\nos._exit(4)\n")
    child_env = LlamaCppServer._child_env

    def dying_env(self: LlamaCppServer) -> dict[str, str]:
        env = child_env(self)
        return {**env, "PYTHONPATH": f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}"}

    monkeypatch.setattr(LlamaCppServer, "_child_env", dying_env)
    before = own_processes()
    began = time.monotonic()
    with pytest.raises(ServerStartError, match=r"\(pid \d+\) exited during start-up \(exit status 4, no output\); "
                                               r"its log ends: 'fatal: this CPU lacks AVX2'"):
        LlamaCppServer(model, threads=1)
    assert time.monotonic() - began < 10 and own_processes() <= before     # noticed at once, not at ready_timeout


def test_start_up_is_bounded_by_ready_timeout_and_leaves_nothing(model):
    before = own_processes()
    with pytest.raises(ServerStartError, match="ready_timeout"):
        LlamaCppServer(model, ready_timeout=0.05, threads=1)     # Python alone takes longer to start
    assert own_processes() <= before


def test_a_taken_port_is_named_before_start(model):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        before = own_processes()
        with pytest.raises(PortTakenError, match=str(port)):
            LlamaCppServer(model, port=port)
        assert own_processes() <= before


def test_a_port_taken_after_the_check_is_named_from_llama_cpps_log(model, monkeypatch):
    monkeypatch.setattr(llamacpp_server, "_port_is_free", lambda port: True)    # the race: taken after the check
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        before = own_processes()
        with pytest.raises(PortTakenError, match="could not be bound"):
            LlamaCppServer(model, port=taken.getsockname()[1], threads=1)
        assert own_processes() <= before


@pytest.mark.parametrize(("kwargs", "argument"), [
    ({"n_parallel": 0}, "n_parallel"),
    ({"n_parallel": 4, "n_ctx": 1000}, "n_ctx"),           # llama.cpp would round it
    ({"n_parallel": 1, "n_ctx": 4096}, "n_ctx"),           # more than the model's trained 2048
    ({"n_batch": 64, "n_ubatch": 128}, "n_ubatch"),
    ({"threads": 0}, "threads"),
    ({"port": 70000}, "port"),
    ({"cont_batching": "yes"}, "cont_batching"),
    ({"ready_timeout": 0}, "ready_timeout"),
])
def test_bad_parameters_are_named_before_any_process_starts(model, kwargs, argument):
    before = own_processes()
    with pytest.raises(BadParameterError, match=f"^{argument}=") as caught:
        LlamaCppServer(model, **kwargs)
    assert caught.value.argument == argument
    assert own_processes() <= before


def test_numpy_integers_are_taken_as_ints_by_the_model_server_and_client(model):
    # They used to reach json.dumps (an unnamed TypeError) or be refused as "n_ctx=0" / "ready_timeout=30".
    i = np.int64
    again = write_tiny_llama(embd=i(256), layers=i(4), ff=i(768), heads=i(8), kv_heads=i(4), ctx=i(2048), seed=i(0))
    assert again == model and type(again.embd) is int
    server = LlamaCppServer(model, n_parallel=i(2), n_batch=i(1024), n_ubatch=i(256), threads=i(1), port=i(18080),
                            ready_timeout=i(30), start=False)
    values = (server.n_parallel, server.n_ctx, server.n_batch, server.n_ubatch, server.threads, server._port_asked)
    assert values == (2, 1024, 1024, 256, 1, 18080) and all(type(v) is int for v in values)
    client = LlamaCppClient("http://127.0.0.1:1", n_predict=i(5), max_in_flight=i(2), seed=i(7))
    with client:
        assert (client.n_predict, client.seed) == (5, 7) and type(client.n_predict) is type(client.seed) is int
    with pytest.raises(BadParameterError, match=r"^n_parallel="):
        LlamaCppServer(model, n_parallel=i(0), start=False)
    with pytest.raises(BadParameterError, match=r"^port="):
        LlamaCppServer(model, port=np.float64(8080), start=False)
    with pytest.raises(ValueError, match="seed"):
        LlamaCppClient("http://127.0.0.1:1", seed=0.5)


# --- requests ---------------------------------------------------------------------------------------------------


def test_a_streamed_request_yields_exactly_n_tokens_with_their_times(server8):
    with server8.client(n_predict=N_PREDICT) as client:
        done = client.submit(CompletionRequest(prompt_of(10), 17)).result(timeout=120)
        default = client.complete("the model serves")
    assert done.n_tokens == 17 and len(done.token_times) == 17 and len(done.gaps) == 16
    assert done.prompt_tokens == 10 and done.stop_type == "limit"
    assert 0 < done.ttft <= done.e2e and np.all(done.gaps >= 0)
    assert np.all(np.diff(done.token_times) > 0), "byte tokens are banned, so every token arrives on its own"
    assert default.n_tokens == N_PREDICT
    assert set(done.server_timings) >= {"prompt_n", "predicted_n", "prompt_ms", "predicted_ms"}


def test_bad_requests_are_refused_before_sending(server8):
    with server8.client() as client:
        with pytest.raises(ValueError, match="n_predict"):
            client.submit(CompletionRequest("x", 0))
        with pytest.raises(TypeError, match="prompt"):
            client.submit(42)
    with pytest.raises(ValueError, match="url"):
        LlamaCppClient("127.0.0.1:8080")


def test_chat_and_both_endpoints_give_exact_counts_and_only_llamacpps_own_says_the_slot(server8):
    messages = [{"role": "user", "content": prompt_of(6)}]
    with server8.client(n_predict=9) as client:
        chat = client.chat(messages)
        plain = client.submit({"prompt": prompt_of(6), "n_predict": 7}).result(timeout=60)
        metrics = client.llm_metrics(slo={"ttft": 60.0}, percentiles=(50, 99))
    with server8.client(n_predict=7, api="llamacpp") as client:
        native = client.complete(prompt_of(6))
    assert chat.n_tokens == 9 and len(chat.token_times) == 9 and chat.prompt_tokens > 6, "the chat template's tokens"
    assert plain.n_tokens == native.n_tokens == 7 and plain.prompt_tokens == native.prompt_tokens == 6
    assert plain.text == native.text, "greedy: the same answer from both endpoints"
    assert chat.slot == plain.slot == -1 and 0 <= native.slot < 8, "the OpenAI stream does not say the slot"
    assert {"predicted_n", "prompt_ms"} <= set(chat.server_timings) and native.server_timings["predicted_n"] == 7
    assert metrics.completed == 2 and metrics.output_tokens == 16 and metrics.good == 2
    assert metrics.ttft.median == pytest.approx(np.median([chat.ttft, plain.ttft]))


def test_a_server_that_streams_several_tokens_to_a_chunk_and_no_timings_is_counted_by_its_usage(monkeypatch):
    # vLLM or SGLang: no llama.cpp timings; a chunk's text may hold two tokens; the usage chunk has the count.
    chunks = [{"choices": [{"text": "a", "finish_reason": None}]}, {"choices": [{"text": "bc", "finish_reason": None}]},
              {"choices": [{"text": "", "finish_reason": "length"}]},
              {"choices": [], "usage": {"completion_tokens": 3, "prompt_tokens": 5}}]
    with LlamaCppClient("http://127.0.0.1:1", n_predict=3) as client:
        monkeypatch.setattr(client, "_stream", lambda prompt, n: iter(chunks))
        done = client.complete("x")
        monkeypatch.setattr(client, "_stream", lambda prompt, n: iter(chunks[:2]))
        with pytest.raises(RequestError, match="without its final event"):
            client.complete("x")
    assert (done.n_tokens, done.prompt_tokens, done.text, done.stop_type) == (3, 5, "abc", "limit")
    assert done.token_times[1] == done.token_times[2], "the tokens of one chunk arrived together"
    assert done.slot == -1 and done.server_timings == {}


def test_a_prompt_longer_than_a_slot_is_an_error_naming_the_context(server8):
    assert server8.slot_ctx == 256
    with server8.client() as client, pytest.raises(RequestError, match="context") as caught:
        client.complete(prompt_of(400))             # a slot holds 2048 / 8 = 256
    assert caught.value.status == 400
    with server8.client() as client, pytest.raises(RequestError, match="n_predict=100 tokens, got 56"):
        client.complete(CompletionRequest(prompt_of(200), 100))     # 200 + 100 > 256: llama.cpp stops early


def test_a_slot_monitor_takes_its_first_sample_however_short_the_block():
    class Source:
        def busy_slots(self):
            return 2

    with SlotMonitor(Source(), interval=10.0) as monitor:   # closed long before a second sample is due
        pass
    assert monitor.busy == [2] and len(monitor.times) == 1


def test_concurrent_requests_on_8_slots_are_batched(server8):
    before = server8.metrics()
    with server8.client(n_predict=N_PREDICT, max_in_flight=8) as client, SlotMonitor(client) as monitor:
        report = run_closed_loop(client, n_clients=8, n_requests=16, make_item=lambda i: prompt_of(4 + i % 3))
        done = list(client.completions)
    after = server8.metrics()
    assert monitor.peak >= 2, f"/slots never showed two slots busy at once: {monitor.busy}"
    assert report.failed == 0 and len(report.latencies) == 16
    assert all(c.n_tokens == N_PREDICT for c in done)
    per_call = tokens_per_decode(before, after)
    assert per_call > 2, f"8 concurrent requests on 8 slots: {per_call:.2f} tokens per decode call"
    assert after["tokens_predicted_total"] - before["tokens_predicted_total"] == 16 * N_PREDICT


def test_one_slot_serves_one_request_at_a_time(server1):
    before = server1.metrics()
    with server1.client(n_predict=N_PREDICT, max_in_flight=4) as client, SlotMonitor(client) as monitor:
        report = run_open_loop(client, [0.0] * 4, make_item=lambda i: prompt_of(5))
    after = server1.metrics()
    assert report.failed == 0 and monitor.peak == 1
    assert tokens_per_decode(before, after) == pytest.approx(1.0), "one slot: one token per decode call"
    assert len(server1.slots()) == 1


def test_slots_report_each_slots_share_of_the_kv_cells(server8):
    slots = server8.slots()
    assert [s["id"] for s in slots] == list(range(8))
    assert {s["n_ctx"] for s in slots} == {2048 // 8}
    assert server8.busy_slots() == 0, "idle between tests"


def test_metrics_are_parsed_into_numbers(server8):
    metrics = server8.metrics()
    assert {"n_decode_total", "tokens_predicted_total", "prompt_tokens_total", "requests_processing"} <= set(metrics)
    assert all(isinstance(v, float) for v in metrics.values())
    assert parse_prometheus('x{a="1 2"} 3 1700000000\n# c\n') == {'x{a="1 2"}': 3.0}


# --- the step-time fit ------------------------------------------------------------------------------------------


def test_the_fit_recovers_known_coefficients_and_never_goes_negative():
    rng = np.random.default_rng(0)
    rows = [(0, s, s * n, 0.003 + 0.0008 * s + 2e-6 * s * n) for s in (1, 2, 4, 8) for n in (20, 60, 200)]
    rows += [(p, 0, p, 0.003 + 6e-5 * p + 2e-6 * p) for p in (8, 64, 256)]
    noisy = [(*r[:3], r[3] * (1 + 0.01 * rng.standard_normal())) for r in rows]
    model = fit_step_time(noisy)
    assert model.a == pytest.approx(0.003, rel=0.1) and model.b == pytest.approx(0.0008, rel=0.1)
    assert model.c == pytest.approx(6e-5, rel=0.2)
    # Step time that falls with the batch is noise; the fit holds that term at 0, not below.
    falling = [(0, s, 10 * s, 0.01 - 0.0001 * s) for s in (1, 2, 4, 8)] + [(64, 0, 64, 0.012)]
    held = fit_step_time(falling, kv=False)
    assert held.b == 0.0 and min(held.coefficients.values()) >= 0
    with pytest.raises(ValueError, match="samples"):
        fit_step_time([(0, 1, 1, -1.0), (0, 2, 2, 0.1)])


def test_the_fit_recovers_the_context_and_mixed_step_terms_exactly():
    # What llama.cpp measured here (probe, 8 slots): ~7 us per KV token, and a step that prefills beside decodes
    # paying a second fixed cost.  Decode samples over two context lengths identify d; mixed samples identify e.
    a, b, c, d, e = 0.005, 0.0018, 0.0018, 7e-6, 0.004
    rows = [(0, s, s * n, a + b * s + d * s * n) for s in (1, 2, 4, 8) for n in (20, 100)]
    rows += [(p, 0, p, a + c * p + d * p) for p in (16, 64)]
    rows += [(p, s, s * 40 + p, a + b * s + c * p + d * (s * 40 + p) + e) for s in (1, 4) for p in (16, 64)]
    model = fit_step_time(rows, relative=False)
    assert [model.a, model.b, model.c, model.d, model.e] == pytest.approx([a, b, c, d, e], rel=1e-9)
    assert model.rmse == pytest.approx(0, abs=1e-12)
    # The e term applies to a step holding both a prefill and decodes, and to no other.
    assert model(16, 0, 16) == pytest.approx(a + c * 16 + d * 16)
    assert model(0, 4, 160) == pytest.approx(a + b * 4 + d * 160)
    assert model(16, 4, 176) == pytest.approx(a + b * 4 + c * 16 + d * 176 + e)
    # Without mixed samples the term is not fitted (held at 0), and a context term the data makes negative is held.
    assert fit_step_time(rows[:10]).e == 0.0
    falling = [(0, s, s * n, 0.005 + 0.001 * s - 1e-6 * s * n) for s in (1, 4) for n in (10, 100)]
    assert fit_step_time(falling).d == 0.0


def test_slot_runs_and_their_expectation_over_random_placements():
    import itertools

    from infergraph_lite.frameworks.llamacpp.profile import expected_runs, slot_runs

    # llama.cpp's sequential split: one micro-batch per run of neighbouring slot ids, in any order given.
    assert [slot_runs(s) for s in ([0], [0, 1], [0, 2], [2, 0, 1, 5, 6], [7, 0], [])] == [1, 1, 2, 2, 2, 0]
    # The expectation over every placement of k sequences in n slots, counted, not assumed.
    for n in (2, 5, 8):
        for k in range(n + 1):
            placements = list(itertools.combinations(range(n), k))
            assert expected_runs(k, n) == pytest.approx(np.mean([slot_runs(c) for c in placements]))
    assert expected_runs(3, None) == 1.0 and expected_runs(0, None) == 0.0


def test_the_simulators_slot_placement_picks_the_slots_the_real_server_picks(model):
    # A fresh 4-slot server: lone requests, then three at once, then lone requests again, with prompts that are
    # prefixes of one text.  simulate_llm(slot_placement="prefix") must put every lone request where llama.cpp did,
    # and the three sent at once in the same three slots (which of them took which is the order they reached the
    # server in); tests/test_simulate_llm.py holds the same sequence without a server.
    from infergraph_lite import simulate_llm

    first, together, again = [16, 20, 16, 28, 24], [24, 24, 24], [16, 20, 24, 28, 12]
    with LlamaCppServer(model, n_parallel=4, n_ctx=4 * 256, threads=1) as server, \
            server.client(n_predict=4, max_in_flight=4, api="llamacpp") as client:   # the slot ids
        real = [client.complete(prompt_of(p)).slot for p in first]
        # 32 tokens each, so that the three overlap on the server however long the client takes to send them
        # (a 4-token answer takes ~7 ms here, the three sends spread over a few ms); placement ignores the lengths
        real += sorted((f.result(timeout=60).slot for f in [client.submit(CompletionRequest(prompt_of(p), 32))
                                                            for p in together]), reverse=True)
        real += [client.complete(prompt_of(p)).slot for p in again]
    prompts = first + together + again
    arrivals = [float(k) for k in range(5)] + [5.0] * 3 + [6.0 + k for k in range(5)]
    outputs = [4] * len(first) + [32] * len(together) + [4] * len(again)
    sim = simulate_llm(n_requests=len(prompts), prompt_tokens=prompts, output_tokens=outputs, step_time=0.01,
                       max_num_seqs=4, arrivals=arrivals, slot_placement="prefix")
    together_sim = sorted(sim.slot[5:8].tolist(), reverse=True)
    assert real == sim.slot[:5].tolist() + together_sim + sim.slot[8:].tolist()


def test_the_fit_charges_each_extra_micro_batch_and_the_twin_expects_them():
    # Steps measured with their micro-batches (from the slots): two decodes in slots apart cost two passes.
    a, b, c, d, e = 0.004, 0.0015, 0.0014, 8e-6, 0.0035
    def step(p, s, kv, batches):
        return (p, s, kv, a + b * s + c * p + d * kv + e * (batches - 1), batches)
    rows = [step(0, s, s * n, runs) for s, runs in ((1, 1), (2, 1), (2, 2), (3, 2), (4, 1), (4, 3), (8, 1))
            for n in (20, 100)]
    rows += [step(p, 0, p, 1) for p in (16, 64)]
    model = fit_step_time(rows, relative=False, slots=8)
    assert [model.a, model.b, model.c, model.d, model.e] == pytest.approx([a, b, c, d, e], rel=1e-9)
    # Told no slots, the model charges the runs expected at random placement, k - k(k-1)/8; told the step's extra
    # micro-batches (simulate_llm with slot_placement counts them), exactly those.
    assert model.slots == 8 and model.extra_batches(0, 2) == pytest.approx(0.75)
    assert model(0, 2, 80) == pytest.approx(a + 2 * b + d * 80 + e * 0.75)
    assert model(0, 2, 80, 0) == pytest.approx(a + 2 * b + d * 80)
    assert model(0, 2, 80, extra_batches=1) == pytest.approx(a + 2 * b + d * 80 + e)
    assert model(16, 0, 16) == pytest.approx(a + c * 16 + d * 16)                 # a lone prefill: one pass
    # 3 decodes: 2.25 runs expected, the prefill one more pass: 2.25 beyond the first.
    assert model(16, 3, 76) == pytest.approx(a + 3 * b + c * 16 + d * 76 + e * (3 - 3 * 2 / 8 + 1 - 1))
    assert model(0, 8, 800) == pytest.approx(a + 8 * b + d * 800)                  # every slot: one run
    # Without the slots (one pass for the decodes), only a prefill beside decodes costs e.
    flat = StepTimeModel(a=a, b=b, c=c, d=d, e=e)
    assert flat(0, 2, 80) == pytest.approx(a + 2 * b + d * 80) and flat.extra_batches(16, 4) == 1.0
    with pytest.raises(ValueError, match="samples"):
        fit_step_time([(0, 1), (0, 2)])


def test_a_profile_whose_fit_strays_from_its_lone_prefills_says_so():
    from infergraph_lite.frameworks.llamacpp.profile import StepSample, StepTimeProfile

    prefill = {16: 0.027, 32: 0.050, 64: 0.094}                   # 1.4 ms per prompt token
    samples = (StepSample(0, 2, 40, 0.011, "decode", 2), StepSample(16, 1, 36, 0.032, "mixed", 2))
    good = StepTimeProfile(StepTimeModel(a=0.004, b=0.0015, c=0.00146, e=0.0035), samples, prefill=prefill)
    assert good.problems == ()
    halved = StepTimeProfile(StepTimeModel(a=0.004, b=0.0015, c=0.0005, e=0.0035), samples, prefill=prefill)
    no_e = StepTimeProfile(StepTimeModel(a=0.004, b=0.0015, c=0.0014), samples, prefill=prefill)
    assert ["25 %" in p for p in halved.problems] == [True]
    assert ["e = 0" in p for p in no_e.problems] == [True]
    # A fit that misses one of its own samples by more than 20 % is not used either; 20 % itself is.
    for worst, named in ((0.26, True), (0.20, False), (0.17, False)):
        fitted = replace(good.model, worst_relative_error=worst)
        problems = StepTimeProfile(fitted, samples, prefill=prefill).problems
        assert ["26 % off its worst sample" in p for p in problems] == ([True] if named else [])


def test_the_mixed_step_is_read_from_the_decoding_streams_or_not_at_all():
    from infergraph_lite.frameworks.llamacpp.profile import mixed_gap

    # Three lock-step decoders, 5 ms steps, one 30 ms step ending with the joiner's first token (at 0.050 s).
    base = np.array([0.0, 0.005, 0.010, 0.015, 0.020, 0.050, 0.055, 0.060, 0.065])
    streams = [base, base + 2e-4, base + 5e-4]
    assert mixed_gap(streams, joined_at=0.0501) == (5, pytest.approx(0.030))
    # The median over the decoders: one stream's late token does not set the step.
    late = base.copy()
    late[5:] += 0.0015
    assert mixed_gap([base, base, late], joined_at=0.0501)[1] == pytest.approx(0.030)
    # A stream whose token is beyond the tolerance is left out; fewer than half within it: not read.
    assert mixed_gap([base, base, base + 0.004], joined_at=0.0501) == (5, pytest.approx(0.030))
    assert mixed_gap([base, base + 0.004, base + 0.004], joined_at=0.0501) is None
    assert mixed_gap(streams, joined_at=0.0540) is None
    # A gap no longer than the decoders' other gaps is a decode step, however near the joiner's token (what one
    # 8-slot profile took for a mixed step: 5.8 ms beside 5 ms decodes, which set e to 0 and c to half).
    assert mixed_gap(streams, joined_at=0.0551) is None
    # Too early in the stream, and streams that disagree on the step: not read.
    assert mixed_gap(streams, joined_at=0.0051) is None
    shifted = np.concatenate([[0.0, 0.002], base[1:]])      # one token more before the same step
    assert mixed_gap([base, shifted], joined_at=0.0501) is None
    with pytest.raises(ValueError, match="tolerance"):
        mixed_gap(streams, joined_at=0.05, tolerance=-1.0)


def test_a_fitted_model_carries_its_overheads_into_the_simulator():
    from infergraph_lite import simulate_llm

    model = StepTimeModel(a=0.005, b=0.001, c=0.0002, request_overhead=0.0015, response_overhead=0.0005)
    r = simulate_llm(n_requests=1, prompt_tokens=20, output_tokens=3, step_time=model, max_num_seqs=1)
    prefill, decode = model(20, 0, 20), model(0, 1, 21)   # kv_tokens: what the step leaves in the cache
    assert r.ttft[0] == pytest.approx(0.0015 + prefill, abs=1e-12)
    assert r.e2e[0] == pytest.approx(0.0015 + prefill + model(0, 1, 21) + model(0, 1, 22) + 0.0005, abs=1e-12)
    assert decode > 0 and "1.50 ms before its first step, 0.50 ms after its last token" in str(model)


def test_the_profile_measures_the_live_server(server8):
    from infergraph_lite.frameworks.llamacpp import profile_step_time

    profile = profile_step_time(server8, concurrencies=(1, 4), n_predict=10, prefill_lengths=(8, 128), repeats=1)
    assert sorted(profile.decode) == [1, 4] and sorted(profile.prefill) == [8, 128]
    # A mixed sample needs a decoding request's token and the joiner's first within 3 ms of each other; on a loaded
    # machine the streams can miss that for every try, so its absence is allowed, its shape is not.
    assert {"decode", "prefill"} <= {s.kind for s in profile.samples} <= {"decode", "prefill", "mixed"}
    contexts = {s.kv_tokens // s.decode_seqs for s in profile.samples if s.kind == "decode"}
    assert min(contexts) < 20 and max(contexts) > 96      # the two prompt lengths: decode steps over a context range
    mixed = [s for s in profile.samples if s.kind == "mixed"]
    # Joins beside each concurrency below n_parallel and beside n_parallel - 1.
    assert all(s.prefill_tokens in (8, 128) and s.decode_seqs in (1, 4, 7) for s in mixed)
    assert all(v >= 0 for v in profile.model.coefficients.values())
    assert profile(0, 4, 100) > 0 and profile.model.n_samples == len(profile.samples)
    # Every step knows its micro-batches from the slots the server reported: a mixed one at least two, and none
    # kept is shorter than the lone prefill of its prompt (such a gap is a misread one, left out).
    assert all(s.micro_batches >= (2 if s.kind == "mixed" else 1) for s in profile.samples)
    assert all(s.seconds >= profile.prefill[s.prefill_tokens] for s in mixed)
    assert all(s.seconds < profile.prefill[s.prefill_tokens] for s in profile.misread)
    assert profile.model.slots == 8
    # The prefill step is the server's own prompt time; what the client saw beyond it is the request overhead.
    assert all(0 < profile.prefill[p] < profile.ttft[p] for p in (8, 128))
    # One repeat of each lone length: the overhead is the median of their two terms, so it lies between them (a
    # comparison with a TTFT would rest on two noisy live timings; CI once failed such a one).
    terms = [profile.ttft[p] - profile.prefill[p] for p in (8, 128)]
    assert 0 < min(terms) <= profile.request_overhead + 1e-12 and profile.request_overhead <= max(terms) + 1e-12
    assert profile.response_overhead >= 0
    assert profile.model.request_overhead == profile.request_overhead
    assert server8.busy_slots() == 0
    with pytest.raises(ValueError, match="n_parallel"):
        profile_step_time(server8, concurrencies=(16,))
    with pytest.raises(ValueError, match="prompt_tokens"):
        profile_step_time(server8, prompt_tokens=())


def test_the_profile_takes_numpy_integers(server8):
    from infergraph_lite.frameworks.llamacpp import profile_step_time

    i = np.int64
    profile = profile_step_time(server8, concurrencies=np.array([1, 2]), prompt_tokens=i(8), n_predict=i(4),
                                prefill_lengths=(i(8),), repeats=i(1), mixed=False, timeout=i(60))
    assert sorted(profile.decode) == [1, 2] and sorted(profile.prefill) == [8]
    for bad, argument in ((dict(prompt_tokens=i(0)), r"prompt_tokens\[0\]"),
                          (dict(n_predict=np.float64(4)), "n_predict"), (dict(repeats=i(0)), "repeats"),
                          (dict(prefill_lengths=i(8)), "prefill_lengths"), (dict(timeout="1 min"), "timeout")):
        with pytest.raises(ValueError, match=argument):
            profile_step_time(server8, **bad)


class _WakingServer:
    """A stand-in 1-slot server whose time to first token is 5 ms longer after 0.1 s with nothing to do."""

    n_parallel = 1

    def __init__(self) -> None:
        self.free_at = -math.inf        # when its last answer ended (as it reports it)

    def client(self, **_: object) -> _WakingServer:
        return self

    def close(self) -> None:
        pass

    def complete(self, request: CompletionRequest) -> Completion:
        now = time.perf_counter()
        p = len(request.prompt.split()) + 1
        step = 0.002 + 1e-4 * p + (0.005 if now - self.free_at > 0.1 else 0.0)
        times = 0.001 + step + 0.003 * np.arange(request.n_predict)
        done = Completion(text="", n_tokens=request.n_predict, prompt_tokens=p, token_times=times,
                          e2e=float(times[-1]) + 0.0005, slot=0, server_timings={"prompt_ms": 1e3 * step},
                          sent_at=now)
        self.free_at = now + done.e2e      # no real time passes: back to back, the server is never idle
        return done

    def submit(self, request: CompletionRequest) -> Future[Completion]:
        future: Future[Completion] = Future()
        future.set_result(self.complete(request))
        return future


def test_the_profile_measures_the_cost_of_waking_an_idle_server():
    from infergraph_lite.frameworks.llamacpp import profile_step_time

    profile = profile_step_time(_WakingServer(), concurrencies=(1,), n_predict=6, prefill_lengths=(16, 32),
                                repeats=2, mixed=False, wake_pairs=3, wake_pause=0.15)
    assert len(profile.wake_samples) == 3
    assert all(cold - hot == pytest.approx(0.005, abs=1e-9) for hot, cold, _, _ in profile.wake_samples)
    assert profile.model.wake == pytest.approx(0.005, abs=1e-9) and profile.wake == profile.model.wake
    assert profile.idle_after == profile.model.idle_after == 0.15
    assert "5.00 ms more for a step after 150 ms idle" in str(profile.model)
    # The back-to-back lone prefills the step model is fitted to never found the server idle.
    assert profile.prefill[16] == pytest.approx(0.002 + 16e-4, abs=1e-9)
    assert profile_step_time(_WakingServer(), concurrencies=(1,), n_predict=6, prefill_lengths=(16,), repeats=1,
                             mixed=False).model.idle_after is None           # not asked: not measured
    with pytest.raises(ValueError, match="wake_pairs"):
        profile_step_time(_WakingServer(), wake_pairs=-1)
    with pytest.raises(ValueError, match="wake_pause"):
        profile_step_time(_WakingServer(), wake_pairs=2, wake_pause=0)
    with pytest.raises(ValueError, match="idle_after"):
        StepTimeModel(a=0.001, b=0.001, c=0.0, wake=0.002)


def test_the_profile_measures_waking_the_live_server(server1):
    from infergraph_lite.frameworks.llamacpp import profile_step_time

    profile = profile_step_time(server1, n_predict=6, prefill_lengths=(16,), repeats=1, mixed=False,
                                wake_pairs=2, wake_pause=0.05)
    hot, cold, hot_step, cold_step = np.array(profile.wake_samples).T
    assert len(hot) == 2 and np.all(hot_step < hot) and np.all(cold_step < cold)
    assert profile.wake == max(0.0, float(np.mean(cold) - np.mean(hot))) and profile.idle_after == 0.05


# --- the prompt cache and the router (notebook 10) -----------------------------------------------------------


def test_the_prompt_cache_is_off_by_default_and_reuses_the_slots_prefix_when_asked(model):
    system, question = prompt_of(120), [" cache graph request", " queue latency token"]
    with LlamaCppServer(model, n_parallel=1, cache_ram_mib=0) as server:
        with server.client(n_predict=3) as plain:
            off = [plain.complete(system + q) for q in question]
        with server.client(n_predict=3, cache_prompt=True) as caching:
            on = [caching.complete(system + q) for q in question]
        with server.client(n_predict=3, cache_prompt=True, api="llamacpp") as native:
            again = native.complete(system + question[0])
    assert [d.prompt_evaluated for d in off] == [d.prompt_tokens for d in off], "off: every token is evaluated"
    assert [d.cached_tokens for d in off] == [0, 0]
    for d in [*on, again]:
        assert d.cached_tokens >= 120 and d.prompt_evaluated == d.prompt_tokens - d.cached_tokens
        assert d.prompt_evaluated >= 1, "one token is always evaluated"
    assert on[1].prompt_evaluated <= 4, "only the question differs"


def test_the_cache_options_are_checked_by_name_before_any_process_starts(model):
    with pytest.raises(BadParameterError, match="cache_ram_mib"):
        LlamaCppServer(model, cache_ram_mib=-2)
    with pytest.raises(BadParameterError, match="slot_prompt_similarity"):
        LlamaCppServer(model, slot_prompt_similarity=1.5)
    with pytest.raises(TypeError, match="cache_prompt"):
        LlamaCppClient("http://127.0.0.1:1", cache_prompt="yes")


def test_a_second_tenant_evicts_the_first_from_a_single_slot_unless_host_memory_keeps_it(model):
    a, b = prompt_of(100), " ".join(reversed(prompt_of(100).split()))
    results = {}
    for ram in (0, 16):
        with LlamaCppServer(model, n_parallel=1, cache_ram_mib=ram) as server, \
                server.client(n_predict=2, cache_prompt=True) as client:
            results[ram] = [client.complete(p + " token").cached_tokens for p in (a, b, a)]
    assert results[0][2] <= 2, "one slot: B's prompt overwrote A's"
    assert results[16][2] >= 99, "--cache-ram saved A's prompt and loaded it back"


def test_a_router_of_two_servers_keeps_each_tenant_on_one_server_and_leaves_nothing(model):
    from infergraph_lite.frameworks.llamacpp.router import LlamaCppRouter, tenant_requests, tenant_systems

    requests = tenant_requests(tenant_systems(4, words=60, seed=0), 12, question_words=4, n_predict=2, seed=1)
    before = own_processes()
    with LlamaCppRouter(model, policy="prefix", server_options={"n_parallel": 2, "cache_ram_mib": 0}) as router:
        pids = router.pids
        assert len(pids) == 2 and set(pids) <= own_processes()
        sockets = listening(pids)
        assert {entry[0] for entry in sockets} == set(pids) and not not_loopback(sockets), "loopback only"
        answers = router.run(requests, arrivals=0.05 * np.arange(len(requests)))
    by_tenant: dict[str, set[int]] = {}
    for request, answer in zip(requests, answers, strict=True):
        by_tenant.setdefault(request["system"], set()).add(answer.server)
        assert answer.completion.n_tokens == 2 and answer.ttft >= answer.completion.ttft
    assert all(len(s) == 1 for s in by_tenant.values()), "prefix affinity: one server per tenant"
    hits = sum(a.completion.cached_tokens >= 60 for a in answers)
    assert hits >= len(requests) - len(by_tenant) - 2, f"most repeated tenants hit their server's cache: {hits}"
    assert own_processes() - before == set(), "every server stopped"
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
