"""Backends: *where* node agents run. Composed with any engine kind.

Each backend declares its options once, as traits (see ``options``)."""

from __future__ import annotations

from ..errors import LoungeError
from .base import Backend
from .options import BACKENDS, backend_class, owner_of

__all__ = ["BACKENDS", "Backend", "make_backend"]


def _ipython_config():
    """The IPython profile's config (``c.SlurmBackend.partition = ...``), when in IPython."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        return None
    return shell.config if shell is not None else None


def make_backend(name: str, **options) -> Backend:
    """The backend ``name`` with ``options`` (flags, REST fields, keywords) over the config
    (``c.SlurmBackend.partition``), over its traits' defaults."""
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
    return cls(config=_ipython_config(), **options)
