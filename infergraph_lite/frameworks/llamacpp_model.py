"""Moved to :mod:`~infergraph_lite.frameworks.llamacpp.model`
(issue 36: one folder per framework); this path stays for code written before the move.

A monkeypatch must target the real module: setting a name here changes nothing there.
"""

from infergraph_lite.frameworks.lazy import forward_names
from infergraph_lite.frameworks.llamacpp.model import *  # noqa: F403
from infergraph_lite.frameworks.llamacpp.model import __all__  # noqa: F401 - the old module's list

# Any other name of the old module, on first use.
__getattr__ = forward_names(__name__, ["infergraph_lite.frameworks.llamacpp.model"])
