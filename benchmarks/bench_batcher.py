"""DynamicBatcher: saturated throughput against the model's own capacity, and added latency at low load.

Targets (issue 8): saturated throughput / (b / s(b)) >= 0.9 with the shared BatchPolicy, both measured in
turns in the same run (median of 5 pairs); and the latency the batcher adds to a lone request (greedy, so
no window), in microseconds.

    python benchmarks/bench_batcher.py      (or: make bench)
"""

from __future__ import annotations

import gc
import statistics
import time

import numpy as np
from _timing import best_of, machine, table, verdict

from infergraph_lite import DynamicBatcher
from infergraph_lite.lessons.models import TinyMLP


def main() -> None:
    rows, targets = [], []
    for label, mlp, b in [("TinyMLP 2048-2048-16", TinyMLP(2048, 2048, 16), 16),
                          ("TinyMLP 256-1024-16 (fast model)", TinyMLP(), 32)]:
        requests = np.random.default_rng(0).standard_normal((b, mlp.in_dim))

        def batch_fn(xs, mlp=mlp):
            return list(mlp(np.stack(xs)))

        # The model alone on full batches (its capacity b / s(b)) and the saturated batcher, measured in turns
        # so that both see the same machine; the ratio of each pair, median over the pairs.
        n = 200 * b
        pairs = []
        for _ in range(5):
            s_b = best_of(lambda mlp=mlp, requests=requests: mlp(requests), 15)
            gc.collect()
            gc.freeze()  # no full collections in the middle of the measurement (see notebook 05)
            with DynamicBatcher(batch_fn, max_batch_size=b, max_wait=0.0) as batcher:
                started = time.perf_counter()
                futures = [batcher.submit(requests[i % b]) for i in range(n)]  # all queued up front: full batches
                for f in futures:
                    f.result()
                elapsed = time.perf_counter() - started
            gc.unfreeze()
            pairs.append((s_b, n / elapsed))
        s_b = statistics.median(p[0] for p in pairs)
        model_capacity = b / s_b
        throughput = statistics.median(p[1] for p in pairs)
        ratio = statistics.median(p[1] * p[0] / b for p in pairs)
        rows.append([label, b, s_b * 1e3, model_capacity, throughput, ratio])
        targets.append([f"saturated throughput / b/s(b), {label}", ratio, ">= 0.9", verdict(ratio, 0.9, "higher")])

        # Low load: one request at a time; what does the batcher add to calling the model directly?
        one = requests[:1]
        direct = [0.0] * 200
        via = [0.0] * 200
        with DynamicBatcher(batch_fn, max_batch_size=b, max_wait=0.0) as batcher:
            for k in range(200):
                t0 = time.perf_counter()
                batch_fn([one[0]])
                direct[k] = time.perf_counter() - t0
                t0 = time.perf_counter()
                batcher.submit(one[0]).result()
                via[k] = time.perf_counter() - t0
        added = statistics.median(via) - statistics.median(direct)
        targets.append([f"added latency per request at low load (us, median), {label}", added * 1e6, "(info)", ""])
    table(f"DynamicBatcher under saturation ({machine()})",
          ["model", "max_batch_size", "s(b) ms", "model b/s(b) req/s", "batcher req/s", "ratio"], rows)
    table("Targets", ["measure", "value", "target", "verdict"], targets)


if __name__ == "__main__":
    main()
