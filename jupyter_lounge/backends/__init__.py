"""Backends: *where* node agents run. Composed with any engine kind."""

from __future__ import annotations

from ..errors import LoungeError
from .base import Backend

BACKENDS = ("local", "slurm", "ssh")
#: The options a start request may give each backend (the magic's flags, the REST body).
OPTIONS = {
    "local": (),
    "slurm": (
        "partition",
        "account",
        "qos",
        "time_limit",
        "engines_per_node",
        "cpus_per_engine",
        "mem_per_engine",
        "gpus_per_node",
    ),
    "ssh": ("pool", "inventory", "strict", "sync"),
}


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
            from .ssh import OPTIONS as SSH_OPTIONS

            option = sorted(options)[0]
            owner = "ssh" if option in SSH_OPTIONS else "slurm"
            raise LoungeError(
                f"The local backend takes no option {option!r}; it is for --backend {owner}."
            )
        return LocalBackend()
    if name == "slurm":
        from .slurm import SlurmBackend

        return SlurmBackend(config=_ipython_config(), **options)
    if name == "ssh":
        from .ssh import SSHBackend

        return SSHBackend(**options)
    raise LoungeError(f"Unknown backend {name!r}: use one of {', '.join(BACKENDS)}.")
