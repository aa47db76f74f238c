"""Engine kinds: *what* a node agent forks. Composed with any backend, never multiplied."""

from __future__ import annotations

from ..errors import LoungeError
from .base import EngineKind

KINDS = ("ipyparallel", "dask")


def engine_kind(name: str) -> EngineKind:
    """The engine kind called ``name``; imports only its light module (safe before a fork)."""
    if name == "ipyparallel":
        from .ipyparallel import IPyParallelEngines

        return IPyParallelEngines()
    if name == "dask":
        from .dask import DaskEngines

        return DaskEngines()
    raise LoungeError(
        f"Unknown engine kind {name!r}: use one of {', '.join(KINDS)} (e.g. --engines dask)."
    )
