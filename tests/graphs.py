"""Graphs shared by the tests."""

from infergraph_lite.examples import BANANA_INPUTS, banana_nodes

__all__ = ["BANANA_INPUTS", "banana_nodes"]

