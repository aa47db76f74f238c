"""Backends: *where* node agents run. Composed with any engine kind."""

from __future__ import annotations

from ..errors import LoungeError
from .base import Backend

BACKENDS = ("local",)


def make_backend(name: str, **options) -> Backend:
    if name == "local":
        from .local import LocalBackend

        return LocalBackend(**options)
    if name in ("ssh", "slurm"):
        raise LoungeError(
            f"The {name!r} backend is not available yet in this version; use --backend local."
        )
    raise LoungeError(f"Unknown backend {name!r}: use one of {', '.join(BACKENDS)}.")
