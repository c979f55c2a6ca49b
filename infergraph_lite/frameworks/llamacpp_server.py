"""Moved to :mod:`~infergraph_lite.frameworks.llamacpp.server`
(issue 36: one folder per framework); this old path stays importable
for code written before the move.

Every name of the old module is here: the listed ones by ``import *``, any other on first use (PEP 562).
A monkeypatch must target the real module: setting a name here changes nothing there.
"""

from __future__ import annotations

import importlib
from typing import Any

from infergraph_lite.frameworks.llamacpp.server import *  # noqa: F403
from infergraph_lite.frameworks.llamacpp.server import __all__  # noqa: F401 - the old module's list

_HOMES = ("infergraph_lite.frameworks.llamacpp.server",)


def __getattr__(name: str) -> Any:
    # A name outside __all__ (a constant, a helper): looked up in the new home(s), in order.
    for home in _HOMES:
        module = importlib.import_module(home)
        if hasattr(module, name):
            return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
