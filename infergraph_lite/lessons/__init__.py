"""What the lessons need beside the package proper: the example graphs, tiny numpy models, drawings, `expect`,
the seed's original loop.
"""
