"""Graphs shared by the tests."""

from infergraph_lite.models import banana_nodes

__all__ = ["BANANA_INPUTS", "banana_nodes"]

BANANA_INPUTS = {"text": "  BANANA  "}
