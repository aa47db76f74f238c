"""Backends: *where* node agents run. Composed with any engine kind."""

from __future__ import annotations

from ..errors import LoungeError
from .base import Backend

BACKENDS = ("local", "slurm", "ssh")


def _ipython_config():
    """The IPython profile's config (``c.SlurmBackend.partition = ...``), when in IPython."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        return None
    return shell.config if shell is not None else None


def make_backend(name: str, **options) -> Backend:
    if name == "local":
        from .local import LocalBackend

        if options:
            raise LoungeError(
                f"The local backend takes no option {sorted(options)[0]!r}; "
                "it is for --backend slurm."
            )
        return LocalBackend()
    if name == "slurm":
        from .slurm import SlurmBackend

        return SlurmBackend(config=_ipython_config(), **options)
    if name == "ssh":
        from .ssh import SSHBackend

        return SSHBackend(**options)
    raise LoungeError(f"Unknown backend {name!r}: use one of {', '.join(BACKENDS)}.")
