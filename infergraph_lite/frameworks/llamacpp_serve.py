"""Moved to :mod:`~infergraph_lite.frameworks.llamacpp.serve`
(issue 36: one folder per framework); this old path stays importable
for ``python -m`` from an older parent.

Every name of the old module is here: the listed ones imported, any other on first use (PEP 562).
A monkeypatch must target the real module: setting a name here changes nothing there.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from infergraph_lite.frameworks.llamacpp.serve import FAILED_STATUS, SHUTDOWN_GRACE, main

__all__ = ["FAILED_STATUS", "SHUTDOWN_GRACE", "main"]

_HOMES = ("infergraph_lite.frameworks.llamacpp.serve",)


def __getattr__(name: str) -> Any:
    # A name outside __all__ (a constant, a helper): looked up in the new home(s), in order.
    for home in _HOMES:
        module = importlib.import_module(home)
        if hasattr(module, name):
            return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
