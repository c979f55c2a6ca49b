"""Simulated serving: one batching queue, a graph of stages, queueing theory, capacity planning, autoscaling
(notebooks 04-06).

Imports only :mod:`infergraph_lite.core`.
"""
