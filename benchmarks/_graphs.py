"""Graphs the framework benchmark serves, in a module of their own so worker processes can import them by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def accelerator_stages() -> dict:
    """Notebook 07's graph: the text pipeline, topic and sentiment accelerator-like and batching (16, no wait).

    Each call of topic or sentiment first waits 12 ms + 0.2 ms per item, as a GPU launch would.  Copied into
    Triton's model repository as source, so it imports what it needs in its body.
    """
    import dataclasses
    import time
    from typing import Any  # noqa: F401 - the copy in the repository has no `from __future__ import annotations`

    from infergraph_lite.lessons.examples import text_pipeline_stages

    def on_accelerator(batch_fn: Any, alpha: float = 0.012, beta: float = 0.0002) -> Any:
        def call(batch: list[Any]) -> Any:
            time.sleep(alpha + beta * len(batch))
            return batch_fn(batch)
        return call

    stages = text_pipeline_stages()
    for name in ("topic", "sentiment"):
        stage, deps = stages[name]
        stages[name] = (dataclasses.replace(stage, fn=on_accelerator(stage.fn), max_batch_size=16, max_wait=0.0),
                        deps)
    return stages


def write_cpu_bound_factory(repository: Path, rounds: int) -> str:
    """Write into ``repository`` a factory of the CPU-bound chain at ``rounds`` per item; return its spec.

    Triton's stubs rebuild a graph by calling a factory with no arguments, so the rounds this run sized on its
    machine (``rounds_for``) are written into the factory's source; ``cpu_bound_stages()``'s default would be
    other work than the other engines serve.  A plain file at the repository's top, where Triton looks for
    models only in folders.
    """
    rounds = int(rounds)
    repository.mkdir(parents=True, exist_ok=True)
    (repository / "_factory_cpu_bound.py").write_text(
        "# Written by benchmarks/_graphs.py: the CPU-bound chain at the rounds bench_frameworks sized on its machine.\n"
        "from infergraph_lite.lessons.examples import cpu_bound_stages\n\n\n"
        "def stages():\n"
        f"    return cpu_bound_stages({{'parse': {rounds}, 'score': {rounds}}})\n", encoding="utf-8")
    return "file:_factory_cpu_bound.py:stages"


# One zero-argument factory per chain length, for Triton's stubs: each is copied into the repository as source,
# so it builds its chain from core alone (the stub then needs nothing newer than core.stage), the same nodes and
# wiring as serving.benchmark.noop_chain_stages (checked in main).
def noop_chain_1() -> dict:
    from infergraph_lite.core.stage import Stage

    def noop(items: list) -> list:
        return list(items)
    return {f"hop{k}": (Stage(fn=noop), ["request" if k == 1 else f"hop{k - 1}"]) for k in range(1, 2)}


def noop_chain_3() -> dict:
    from infergraph_lite.core.stage import Stage

    def noop(items: list) -> list:
        return list(items)
    return {f"hop{k}": (Stage(fn=noop), ["request" if k == 1 else f"hop{k - 1}"]) for k in range(1, 4)}


def noop_chain_4() -> dict:
    from infergraph_lite.core.stage import Stage

    def noop(items: list) -> list:
        return list(items)
    return {f"hop{k}": (Stage(fn=noop), ["request" if k == 1 else f"hop{k - 1}"]) for k in range(1, 5)}


def noop_chain_6() -> dict:
    from infergraph_lite.core.stage import Stage

    def noop(items: list) -> list:
        return list(items)
    return {f"hop{k}": (Stage(fn=noop), ["request" if k == 1 else f"hop{k - 1}"]) for k in range(1, 7)}


CHAIN_FACTORIES: dict[int, Any] = {1: noop_chain_1, 3: noop_chain_3, 4: noop_chain_4, 6: noop_chain_6}
