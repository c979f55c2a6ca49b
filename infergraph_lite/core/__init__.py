"""The graph shape, validation and the prepared Plan; the executors; Stage; BatchPolicy; argument checks
(notebooks 01-03, 05-06).

Imports nothing from the rest of the package.
"""
