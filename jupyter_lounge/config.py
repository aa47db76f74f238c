"""Settings that bound every start, from traitlets config: ``c.Lounge.max_engines = 8192``.

Read from the IPython profile in a kernel and from the Jupyter server's config in the server
extension; elsewhere (the ``lounge`` command) the defaults hold.
"""

from __future__ import annotations

from traitlets import Float, Integer
from traitlets.config import Config, Configurable

#: The defaults of every start, whichever face asks (``Cluster``, the flags, a REST body).
DEFAULT_ENGINES = "ipyparallel"
DEFAULT_BACKEND = "local"
DEFAULT_TIMEOUT = 120.0

_server_config: Config | None = None


class Lounge(Configurable):
    """Limits on what one request may ask for, so a typo or a stranger's request cannot make
    a controller, a server or a scheduler try to start a billion engines."""

    max_engines = Integer(4096, help="the most engines one start or scale may ask for").tag(
        config=True
    )
    max_timeout = Float(7 * 24 * 3600.0, help="the longest start timeout, in seconds").tag(
        config=True
    )


def use_server_config(config: Config) -> None:
    """The server extension's config (``jupyter_server_config.py``) for this process."""
    global _server_config
    _server_config = config


def settings() -> Lounge:
    """The settings in effect here: the server's config, the IPython profile's, or defaults."""
    if _server_config is not None:
        return Lounge(config=_server_config)
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        shell = None
    return Lounge(config=shell.config) if shell is not None else Lounge()
