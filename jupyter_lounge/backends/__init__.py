"""Backends: *where* node agents run. Composed with any engine kind.

Each backend declares its options once, as traits (see ``options``)."""

from __future__ import annotations

from ..errors import LoungeError
from .base import Backend
from .options import BACKENDS, backend_class, owner_of

__all__ = ["BACKENDS", "Backend", "make_backend"]


def make_backend(name: str, **options) -> Backend:
    """The backend ``name`` with ``options`` (flags, REST fields, keywords) over the config
    in effect here (``c.SlurmBackend.partition``), over its traits' defaults."""
    cls = backend_class(name)
    if name == "local":
        if options:
            option = sorted(options)[0]
            owner = owner_of(option)
            if owner is None:
                raise LoungeError(
                    f"The local backend takes no option {option!r}, and no backend has one of "
                    f"that name: see `%lounge help`."
                )
            raise LoungeError(
                f"The local backend takes no option {option!r}; it is for --backend {owner}."
            )
        return cls()
    from ..config import load_config

    return cls(config=load_config(), **options)
