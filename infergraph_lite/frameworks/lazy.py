"""A framework folder's facade: its public names, each imported from its own module on first use (PEP 562); and
the ``__getattr__`` of a module left at an old path after a move (:func:`forward_names`).

Every framework folder (``triton/``, ``ray/``, ``dask/``, ``llamacpp/``) lists its names by module in its
``__init__.py`` and hands the list to :func:`lazy_exports`.  Why lazily: a process that needs one light part of a
framework (Triton's model stub, a Ray replica, the options mapping a test reads) should not pay for the heavy
parts it never touches (``tritonclient``, ``import ray``, ``distributed``).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["forward_names", "lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, Sequence[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of a facade ``package`` whose ``exports`` map a submodule to its names.

    A name is imported from ``package.submodule`` when first asked for, then kept in the package's namespace, so
    the second look-up is an ordinary attribute.  An unknown name raises ``AttributeError`` (which also lets
    ``from package import submodule`` find the submodule itself).

    >>> getattr_, dir_ = lazy_exports("infergraph_lite.frameworks.ray", {"options": ["from_stage"]})
    >>> getattr_("from_stage").__module__
    'infergraph_lite.frameworks.ray.options'
    >>> "from_stage" in dir_()
    True
    >>> getattr_("nothing")
    Traceback (most recent call last):
    ...
    AttributeError: module 'infergraph_lite.frameworks.ray' has no attribute 'nothing'
    """
    module_of = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *module_of})

    return __getattr__, __dir__


def forward_names(old: str, homes: Sequence[str]) -> Callable[[str], Any]:
    """The ``__getattr__`` of module ``old``, whose code moved to ``homes``: a name ``old`` does not import itself
    (a constant, a helper outside ``__all__``) is looked up in each home in turn, so every name importable from
    the old path before the move still is.

    >>> forward = forward_names("old_place", ["infergraph_lite.frameworks.ray.options"])
    >>> forward("ENGINE")
    'Ray Serve'
    >>> forward("nothing")
    Traceback (most recent call last):
    ...
    AttributeError: module 'old_place' has no attribute 'nothing'
    """

    def __getattr__(name: str) -> Any:
        for home in homes:
            module = importlib.import_module(home)
            if hasattr(module, name):
                return getattr(module, name)
        raise AttributeError(f"module {old!r} has no attribute {name!r}")

    return __getattr__
