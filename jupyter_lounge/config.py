"""The config in effect, the same in a kernel, the ``lounge`` command and the server
extension, and the settings that bound every start: ``c.Lounge.max_engines = 8192``,
``c.SlurmBackend.partition = "gpu"``.

Where it comes from (``load_config``):

- in a kernel (or any IPython): the IPython shell's config, i.e. its profile's;
- in the ``lounge`` command: the config files of the IPython profile ``profile_default``
  (``ipython_config.py``/``.json`` under ``$IPYTHONDIR``, default ``~/.ipython``), read as
  IPython reads them;
- in the Jupyter server extension: that profile's config under the server's own
  (``jupyter_server_config.py``): the server's wins.

Flags and REST fields override the config, which overrides the traits' defaults.
"""

from __future__ import annotations

import copy
import functools
import os
import warnings

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


def load_config() -> Config:
    """The traitlets config in effect in this process (see the module's docstring)."""
    if _server_config is not None:
        merged = profile_config()
        merged.merge(copy.deepcopy(_server_config))  # the server's own config wins
        return merged
    shell = _ipython()
    return shell.config if shell is not None else profile_config()


def settings() -> Lounge:
    """The limits in effect here (``c.Lounge``)."""
    return Lounge(config=load_config())


def _ipython():
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


@functools.lru_cache(maxsize=8)
def _ipython_dir(env: str | None) -> str:
    """IPython's folder for this ``$IPYTHONDIR``, found once: IPython makes the folder, or a
    temporary one where it cannot, and a server asks at every start."""
    from IPython.paths import get_ipython_dir

    return get_ipython_dir()


def profile_config(profile: str = "default") -> Config:
    """The config files of an IPython profile, read as IPython reads them: ``.py`` then
    ``.json`` (which wins); no file, an empty config; a file that cannot be read, a warning.
    They are the user's own code, which IPython runs at every start too."""
    from traitlets.config.loader import ConfigFileNotFound, JSONFileConfigLoader, PyFileConfigLoader

    folder = os.path.join(_ipython_dir(os.environ.get("IPYTHONDIR")), f"profile_{profile}")
    config = Config()
    files = (
        ("ipython_config.py", PyFileConfigLoader),
        ("ipython_config.json", JSONFileConfigLoader),
    )
    for filename, loader in files:
        try:
            config.merge(loader(filename, path=folder).load_config())
        except ConfigFileNotFound:
            continue
        except Exception as e:  # noqa: BLE001 - the user's own file: any error
            # Warned, not raised, as IPython does: a stop, `lounge list` or the keeper must
            # still work while the profile is broken.
            path = os.path.join(folder, filename)
            warnings.warn(
                f"The IPython config {path} could not be read ({type(e).__name__}: {e}); "
                "jupyter_lounge goes on without it: fix it, or point $IPYTHONDIR elsewhere.",
                stacklevel=2,
            )
    return config
