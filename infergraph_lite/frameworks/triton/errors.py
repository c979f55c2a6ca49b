"""The errors of the Triton adapter: a wrong config, a server that cannot run here, a server that did not start."""

from __future__ import annotations

__all__ = ["TritonConfigError", "TritonStartError", "TritonUnavailableError"]


class TritonConfigError(ValueError):
    """A model config (or an ensemble's wiring) is wrong; ``.model`` and ``.field`` say where.

    >>> str(TritonConfigError("embed", "max_batch_size", "must be >= 1, got 0"))
    "model 'embed', field max_batch_size: must be >= 1, got 0"
    """

    def __init__(self, model: str | None, field: str | None, problem: str):
        self.model, self.field, self.problem = model, field, problem
        where = [f"model {model!r}" if model else "", f"field {field}" if field else ""]
        super().__init__(", ".join(w for w in where if w) + f": {problem}" if any(where) else problem)


class TritonUnavailableError(RuntimeError):
    """The ``tritonserver`` binary cannot run here (no wheel for this platform, or not installed)."""


class TritonStartError(RuntimeError):
    """The server did not become ready; the message names the cause, ``.log`` holds the server's log."""

    def __init__(self, message: str, log: str = ""):
        self.log = log
        super().__init__(message)
