"""Real serving on this machine: the dynamic batcher, the graph server, load generators, request records, process
trees (notebooks 05-07).

Imports only :mod:`infergraph_lite.core`.
"""
