"""The same stage graph on real serving frameworks: Triton, Ray Serve, Dask (notebook 07), and a real LLM
server, llama.cpp (notebook 08).

Each framework's heavy dependency is imported only inside its own module; nothing here is imported by
``infergraph_lite/__init__.py``.
"""
