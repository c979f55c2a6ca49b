"""Graphs shared by the tests."""

from infergraph_lite.lessons.examples import BANANA_INPUTS, banana_nodes

__all__ = ["BANANA_INPUTS", "banana_nodes"]

