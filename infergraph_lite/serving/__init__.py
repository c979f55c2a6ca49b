"""Real serving on this machine: the dynamic batcher, the graph server (its stages on threads or in worker
processes, :mod:`~infergraph_lite.serving.stage_workers`), load generators, request records, process trees
(notebooks 05-07); how engines are compared (:mod:`~infergraph_lite.serving.benchmark`, with
:mod:`~infergraph_lite.serving.watch` for where their CPU goes; notebook 07).

Imports only :mod:`infergraph_lite.core`.
"""
