"""Simulated serving: one batching queue, a graph of stages, queueing theory, capacity planning, autoscaling
(notebooks 04-06), and an LLM engine stepping iteration by iteration (notebook 08).

Imports only :mod:`infergraph_lite.core`.
"""
