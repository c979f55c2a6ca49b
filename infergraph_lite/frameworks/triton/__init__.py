"""The stage graph on a real NVIDIA Triton server: model repository, configs, server, client.

A stage graph ``{name: (Stage, [deps])}`` becomes a Triton *model repository*:
one Python-backend model per node, whose ``model.py`` calls the node's real
batch function (``stage.fn``), and one ``platform: "ensemble"`` model whose
``ensemble_scheduling`` steps wire the nodes by tensor names, as the graph's
edges do.  The batching knobs map one to one (:func:`config_from_stage`; every
field's fate is in :data:`TRITON_FIELDS`)::

    Stage.max_batch_size  ->  max_batch_size (above 1, with a dynamic_batching block)
    Stage.max_wait (s)    ->  dynamic_batching { max_queue_delay_microseconds }
    Stage.max_queue_size  ->  dynamic_batching { default_queue_policy { max_queue_size } }
    Stage.replicas        ->  instance_group [ { count, kind: KIND_CPU } ]

Configs are Triton's own protobuf messages (``tritonclient``'s ``model_config_pb2``), written and read
with ``google.protobuf.text_format``; the ensemble is turned back into the package's graph shape and
checked by :mod:`infergraph_lite.core.graph` (cycles, missing tensors, levels) before any server starts.
:class:`TritonServer` runs the ``tritonserver`` binary shipped in the ``nvidia-pytriton`` wheel on
127.0.0.1, and :class:`TritonClient` drives it (``submit(item) -> Future``, the load generators'
interface) and reads its statistics: the real batch sizes.

One job per module: ``errors``, ``tensors`` (how values travel), ``runner`` (one request through the
batch functions), ``config`` (build, write, read, check), ``ensemble`` (an ensemble as a graph),
``repository`` (stage graph -> model repository and back), ``backend`` (what Triton's Python stub
imports: :class:`NodeModel`), ``server`` and ``client``, and ``engine`` (:class:`TritonGraph`: the three as one
:class:`~infergraph_lite.frameworks.engine.Engine`).  The names below are loaded on first use, so
a model process importing :mod:`.backend` loads neither the server, the client nor ``tritonclient``.

Introduced in notebook 07; exercise 5.4 and the 07 exercises use it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from infergraph_lite.frameworks.lazy import lazy_exports

if TYPE_CHECKING:  # the same names, for type checkers and editors
    from infergraph_lite.frameworks.triton.backend import NodeModel, load_factory
    from infergraph_lite.frameworks.triton.client import ModelStats, TritonClient
    from infergraph_lite.frameworks.triton.config import (
        ENGINE,
        TRITON_FIELDS,
        ModelConfig,
        check_model_config,
        config_from_stage,
        config_text,
        declare_tensors,
        ensemble_config,
        member_config,
        model_config_type_name,
        parse_model_config,
        read_config,
    )
    from infergraph_lite.frameworks.triton.engine import TritonGraph
    from infergraph_lite.frameworks.triton.ensemble import EnsembleGraph, ensemble_to_graph
    from infergraph_lite.frameworks.triton.errors import TritonConfigError, TritonStartError, TritonUnavailableError
    from infergraph_lite.frameworks.triton.repository import (
        Repository,
        add_model_version,
        read_repository,
        to_model_repository,
    )
    from infergraph_lite.frameworks.triton.runner import infer_tensor_types, run_stages_once
    from infergraph_lite.frameworks.triton.server import TritonServer, triton_available
    from infergraph_lite.frameworks.triton.tensors import (
        ENCODING_PARAMETER,
        Encoding,
        TensorType,
        declared_type,
        tensor_type_of,
    )

_EXPORTS = {
    "backend": ["NodeModel", "load_factory"],
    "client": ["ModelStats", "TritonClient"],
    "config": ["ENGINE", "TRITON_FIELDS", "ModelConfig", "check_model_config", "config_from_stage", "config_text",
               "declare_tensors", "ensemble_config", "member_config", "model_config_type_name", "parse_model_config",
               "read_config"],
    "engine": ["TritonGraph"],
    "ensemble": ["EnsembleGraph", "ensemble_to_graph"],
    "errors": ["TritonConfigError", "TritonStartError", "TritonUnavailableError"],
    "repository": ["Repository", "add_model_version", "read_repository", "to_model_repository"],
    "runner": ["infer_tensor_types", "run_stages_once"],
    "server": ["TritonServer", "triton_available"],
    "tensors": ["ENCODING_PARAMETER", "Encoding", "TensorType", "declared_type", "tensor_type_of"],
}

__all__ = [
    "ENCODING_PARAMETER",
    "ENGINE",
    "TRITON_FIELDS",
    "Encoding",
    "EnsembleGraph",
    "ModelConfig",
    "ModelStats",
    "NodeModel",
    "Repository",
    "TensorType",
    "TritonClient",
    "TritonConfigError",
    "TritonGraph",
    "TritonServer",
    "TritonStartError",
    "TritonUnavailableError",
    "add_model_version",
    "check_model_config",
    "config_from_stage",
    "config_text",
    "declare_tensors",
    "declared_type",
    "ensemble_config",
    "ensemble_to_graph",
    "infer_tensor_types",
    "load_factory",
    "member_config",
    "model_config_type_name",
    "parse_model_config",
    "read_config",
    "read_repository",
    "run_stages_once",
    "tensor_type_of",
    "to_model_repository",
    "triton_available",
]


# PEP 562: a name is imported from its module when first asked for, then kept here.
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
