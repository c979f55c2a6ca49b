"""The child process of :class:`~infergraph_lite.frameworks.llamacpp.server.LlamaCppServer` (notebook 08).

``python -m infergraph_lite.frameworks.llamacpp.serve '{"model": ..., "n_parallel": ...}'`` starts
llama.cpp's own C++ HTTP server, embedded by the ``xllamacpp`` wheel, on 127.0.0.1, prints one line
``READY <address> <startup seconds>`` on stdout, and serves until SIGTERM, SIGINT, or its stdin closes
(the parent holds the other end, so a parent that dies takes this process with it); requests still
streaming then are cut off after ``SHUTDOWN_GRACE`` seconds.  On a start-up failure
it prints ``FAILED <reason>`` and exits with status 3; the parent reads llama.cpp's log to name the cause.
Not meant to be run by hand; ``xllamacpp`` is imported here and nowhere else.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from typing import Any

FAILED_STATUS = 3
SHUTDOWN_GRACE = 2      # seconds (a whole number: signal.alarm)


def _params(config: dict[str, Any]) -> Any:
    import xllamacpp  # type: ignore[import-untyped]  # no type information shipped

    p = xllamacpp.CommonParams()
    p.model.path = config["model"]
    p.n_ctx = config["n_ctx"]                       # the total KV pool; each slot gets n_ctx / n_parallel
    p.n_parallel = config["n_parallel"]
    p.n_batch = config["n_batch"]
    p.n_ubatch = config["n_ubatch"]
    p.cont_batching = config["cont_batching"]
    p.cpuparams.n_threads = config["threads"]
    p.cpuparams_batch.n_threads = config["threads"]
    p.hostnames = ["127.0.0.1"]                     # loopback only, whatever the caller asks
    p.port = config["port"]                         # 0: the OS picks a free port at bind time
    p.endpoint_metrics = True
    p.endpoint_slots = True
    p.warmup = config.get("warmup", False)
    p.cache_prompt = False                          # each request pays its own prefill, unless it asks (cache_prompt)
    if config.get("cache_ram_mib") is not None:     # host memory for prompts evicted from slots (-1: no limit, 0: off)
        p.cache_ram_mib = config["cache_ram_mib"]
    if config.get("slot_prompt_similarity") is not None:   # a slot is reused for a prompt this similar (0: never)
        p.slot_prompt_similarity = config["slot_prompt_similarity"]
    return p


def main(argv: list[str]) -> int:
    config = json.loads(argv[1])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    def watch_stdin() -> None:
        # The parent keeps our stdin open; EOF means it is gone (or closing us): stop.
        try:
            while sys.stdin.buffer.read(1):
                pass
        except (OSError, ValueError):
            pass
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    start = time.perf_counter()
    try:
        import xllamacpp

        server = xllamacpp.Server(_params(config))
    except RuntimeError as error:   # xllamacpp raises one RuntimeError for every cause; the log names it
        print(f"FAILED {type(error).__name__}: {error}", flush=True)
        return FAILED_STATUS
    print(f"READY {server.listening_address} {time.perf_counter() - start:.3f}", flush=True)
    while not stop.wait(0.2):
        pass
    # Dropping the server joins llama.cpp's main loop and HTTP threads.  An HTTP thread still streaming to a
    # client waits (30 s) for tokens that no longer come, and the destructor holds the GIL meanwhile, so no
    # Python thread could time it out: an OS alarm ends the process after SHUTDOWN_GRACE seconds instead.
    if hasattr(signal, "SIGALRM"):
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(SHUTDOWN_GRACE)
    del server
    if hasattr(signal, "SIGALRM"):
        signal.alarm(0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
