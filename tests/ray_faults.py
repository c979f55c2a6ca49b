"""Faults injected into a RayServeGraph's start, each in a process of its own (run by tests/test_ray_serve.py).

    python -m tests.ray_faults kill-raylet     # SIGKILL the raylet right after ray.init returns
    python -m tests.ray_faults taken-port      # another process holds the agent's gRPC port on the first try
    python -m tests.ray_faults never-deploys   # a replica that asks for more CPUs than the node has

Prints one JSON line: the error (type, message, process, port_taken) or the answer, the seconds start() took,
how many times ports were picked, the PIDs Ray's node started and those of them still alive after close.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time

import psutil
import ray

from infergraph_lite.core.stage import Stage
from infergraph_lite.frameworks.ray import node as ray_node  # the real module: a patch on the old path would miss it
from infergraph_lite.frameworks.ray.serve import RayServeGraph


def main(fault: str) -> dict:
    stages = {"n": (Stage(fn=lambda xs: [len(x) for x in xs]), ["text"])}
    options = {"num_cpus_per_replica": 5.0} if fault == "never-deploys" else {}
    graph = RayServeGraph(stages, inputs=("text",), timeout=float(os.environ.get("FAULT_TIMEOUT", "120")), **options)
    roots: set[int] = set()
    picks = []
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    real_pick, real_init = ray_node.free_ports, ray.init

    def pick(count: int, **kwargs: object) -> list[int]:
        ports = real_pick(count, **kwargs)
        picks.append(ports)
        if fault == "taken-port" and len(picks) == 1:
            ports[0] = held.getsockname()[1]  # the dashboard agent's gRPC port: it fails to bind, the raylet follows
        return ports

    def init(*args: object, **kwargs: object) -> object:
        answer = real_init(*args, **kwargs)
        roots.update(graph._ray.roots)
        if fault == "kill-raylet":
            os.kill(next(pid for pid, kind in graph._ray.roots.items() if kind == "raylet"), signal.SIGKILL)
        return answer

    ray_node.free_ports, ray.init = pick, init
    result: dict = {}
    started = time.monotonic()
    try:
        with graph:
            result["seconds"] = time.monotonic() - started
            result["answer"] = graph.run({"text": "abc"}, timeout=60)
    except Exception as error:  # noqa: BLE001 - reported to the test as data
        result["seconds"] = time.monotonic() - started
        result["error"] = {"type": type(error).__name__, "message": str(error),
                           "process": getattr(error, "process", None), "port_taken": getattr(error, "port_taken", None)}
    result["picks"] = len(picks)
    result["roots"] = sorted(roots)
    result["left"] = [p.pid for p in psutil.Process().children(recursive=True)
                      if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    result["ray_initialized"] = ray.is_initialized()
    return result


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])), flush=True)
