"""llama.cpp as a real LLM server for notebook 08: one import for the server, client, model writer and profile.

One job per module, as in every framework folder (llama.cpp serves one model, not a stage graph, so it has no
Stage-options mapping; its server parameters are checked by :func:`check_server_parameters`):

- :mod:`~infergraph_lite.frameworks.llamacpp.model`: :func:`write_tiny_llama` writes a small llama-architecture
  GGUF with seeded random weights (nothing downloaded) and says what its KV cache costs per token;
- :mod:`~infergraph_lite.frameworks.llamacpp.server`: :class:`LlamaCppServer`, llama.cpp's C++ server (the
  ``xllamacpp`` wheel) in its own process on 127.0.0.1, stopped by its PID, with named start-up errors;
- :mod:`~infergraph_lite.frameworks.llamacpp.client`: :class:`LlamaCppClient`, streaming requests on the
  OpenAI-compatible API (the `openai` package) with
  futures (TTFT, inter-token gaps, e2e per request), the server's ``/metrics`` and ``/slots``, and
  :class:`SlotMonitor` (busy slots over time);
- :mod:`~infergraph_lite.frameworks.llamacpp.profile`: :func:`profile_step_time` measures a step's time against
  what it holds and fits the callable the LLM simulator takes;
- :mod:`~infergraph_lite.frameworks.llamacpp.serve`: the server's child process (``python -m``);
- :mod:`~infergraph_lite.frameworks.llamacpp.engine`: :class:`LlamaCppEngine`, server and client as one
  :class:`~infergraph_lite.frameworks.engine.Engine`;
- :mod:`~infergraph_lite.frameworks.llamacpp.router`: :class:`LlamaCppRouter`, several servers behind a router
  stage (round robin or prefix affinity) in a GraphServer graph (notebook 10).

``xllamacpp`` is imported only in the server's child process, ``gguf`` only by the model writer, ``openai`` only when
a client is made.  The names below are loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from infergraph_lite.frameworks.lazy import lazy_exports

if TYPE_CHECKING:  # the same names, for type checkers and editors
    from infergraph_lite.frameworks.llamacpp.client import (
        Completion,
        CompletionRequest,
        LlamaCppClient,
        RequestError,
        SlotMonitor,
        counter_delta,
        parse_prometheus,
        tokens_per_decode,
    )
    from infergraph_lite.frameworks.llamacpp.engine import LlamaCppEngine
    from infergraph_lite.frameworks.llamacpp.model import (
        ModelInfo,
        cache_dir,
        describe,
        prompt_of,
        trained_context_length,
        write_tiny_llama,
    )
    from infergraph_lite.frameworks.llamacpp.profile import (
        StepSample,
        StepTimeModel,
        StepTimeProfile,
        expected_runs,
        fit_step_time,
        mixed_gap,
        profile_step_time,
        slot_runs,
    )
    from infergraph_lite.frameworks.llamacpp.router import LlamaCppRouter, Routed, router_stages
    from infergraph_lite.frameworks.llamacpp.server import (
        BadParameterError,
        LlamaCppServer,
        ModelLoadError,
        ModelMissingError,
        PortTakenError,
        ServerStartError,
        check_server_parameters,
    )

_EXPORTS = {
    "client": ["Completion", "CompletionRequest", "LlamaCppClient", "RequestError", "SlotMonitor", "counter_delta",
               "parse_prometheus", "tokens_per_decode"],
    "engine": ["LlamaCppEngine"],
    "model": ["ModelInfo", "cache_dir", "describe", "prompt_of", "trained_context_length", "write_tiny_llama"],
    "profile": ["StepSample", "StepTimeModel", "StepTimeProfile", "expected_runs", "fit_step_time", "mixed_gap",
                "profile_step_time", "slot_runs"],
    "router": ["LlamaCppRouter", "Routed", "router_stages"],
    "server": ["BadParameterError", "LlamaCppServer", "ModelLoadError", "ModelMissingError", "PortTakenError",
               "ServerStartError", "check_server_parameters"],
}

__all__ = [
    "BadParameterError",
    "Completion",
    "CompletionRequest",
    "LlamaCppClient",
    "LlamaCppEngine",
    "LlamaCppRouter",
    "LlamaCppServer",
    "ModelInfo",
    "ModelLoadError",
    "ModelMissingError",
    "PortTakenError",
    "RequestError",
    "Routed",
    "ServerStartError",
    "SlotMonitor",
    "StepSample",
    "StepTimeModel",
    "StepTimeProfile",
    "cache_dir",
    "check_server_parameters",
    "counter_delta",
    "describe",
    "expected_runs",
    "fit_step_time",
    "mixed_gap",
    "parse_prometheus",
    "profile_step_time",
    "prompt_of",
    "router_stages",
    "slot_runs",
    "tokens_per_decode",
    "trained_context_length",
    "write_tiny_llama",
]

# PEP 562: a name is imported from its module when first asked for, then kept here.
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
