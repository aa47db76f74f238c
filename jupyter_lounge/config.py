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

Flags and REST fields override the config, which overrides the traits' defaults. The
defaults of a start (``c.Lounge.backend``, ``c.Lounge.preload``, ...) are layered, with
the inventory's ``[start]`` table and ``--profile NAME`` too, in ``defaults``.
"""

from __future__ import annotations

import copy
import functools
import os
import warnings

from traitlets import Bool, Float, Integer, List, Unicode
from traitlets.config import Config, Configurable

from .validate import module_list

_server_config: Config | None = None
_server_files: list[str] = []  # the server's config files, in the order it read them


class _Modules(List):
    """Module names: a list, or one comma-separated string (``"tensorflow,numpy"``)."""

    def validate(self, obj, value):
        return super().validate(obj, module_list(value))


class Lounge(Configurable):
    """The defaults of every start (``%lounge start 30`` takes the rest from here; see
    ``defaults`` for the other places they may come from), and limits on what one request
    may ask for, so a typo or a stranger's request cannot make a controller, a server or a
    scheduler try to start a billion engines."""

    # -- the defaults of a start: each a flag of `%lounge start` and a REST field too --------
    backend = Unicode("local", help="where the engines run: local, slurm or ssh").tag(config=True)
    engines = Unicode("ipyparallel", help="the engine kind: ipyparallel or dask").tag(config=True)
    preload = _Modules(
        Unicode(), help='modules each node imports once before it forks, e.g. ["tensorflow"]'
    ).tag(config=True)
    nodes = Integer(
        None, allow_none=True, help="how many nodes to spread the engines over; none: the backend's"
    ).tag(config=True)
    timeout = Float(120.0, help="seconds a start may take before it fails").tag(config=True)
    courtesy = Bool(False, help="engines yield to the person at a PC (the inventory's [idle])").tag(
        config=True
    )
    restart = Bool(True, help="a node agent forks a new engine when one dies").tag(config=True)
    dashboard = Bool(False, help="Dask's dashboard, on loopback (Dask engines only)").tag(
        config=True
    )

    # -- limits ---------------------------------------------------------------------------
    max_engines = Integer(4096, help="the most engines one start or scale may ask for").tag(
        config=True
    )
    max_timeout = Float(7 * 24 * 3600.0, help="the longest start timeout, in seconds").tag(
        config=True
    )


#: The names of the defaults of a start, in the order ``lounge config`` shows them.
START_KEYS = ("backend", "engines", "preload", "nodes", "timeout", "courtesy", "restart")
START_KEYS += ("dashboard",)
LIMIT_KEYS = ("max_engines", "max_timeout")

#: The built-in defaults, for code that needs one without a config (``Cluster``'s keywords).
DEFAULT_ENGINES = Lounge.class_traits()["engines"].default_value
DEFAULT_BACKEND = Lounge.class_traits()["backend"].default_value
DEFAULT_TIMEOUT = Lounge.class_traits()["timeout"].default_value


def use_server_config(config: Config, files=()) -> None:
    """The server extension's config (``jupyter_server_config.py``) for this process, and
    the files it was read from (where ``lounge config`` says a value came from)."""
    global _server_config, _server_files
    _server_config = config
    _server_files = [str(f) for f in files]


def load_config() -> Config:
    """The traitlets config in effect in this process (see the module's docstring)."""
    if _server_config is not None:
        merged = profile_config()
        merged.merge(copy.deepcopy(_server_config))  # the server's own config wins
        return merged
    shell = _ipython()
    return shell.config if shell is not None else profile_config()


def settings(config: Config | None = None) -> Lounge:
    """The limits in effect here (``c.Lounge.max_engines``, ``c.Lounge.max_timeout``), read
    from ``config`` where the caller has loaded it already (else ``load_config()``).

    Only the limits are read from the config: the defaults of a start are read, and each
    checked with its file and line, by ``defaults``, so a mistake there cannot stop a
    ``lounge stop``. A limit of the wrong type is one sentence naming where it was set."""
    from traitlets import TraitError

    config = load_config() if config is None else config
    section = config["Lounge"] if "Lounge" in config else {}
    limits = Config({"Lounge": {k: v for k, v in section.items() if k in LIMIT_KEYS}})
    try:
        return Lounge(config=limits)
    except TraitError:
        from .defaults import config_error

        raise config_error(limits["Lounge"]) from None


def config_files() -> list[str]:
    """The config files ``load_config()`` read here, lowest precedence first: the server's
    profile files then its own, the IPython application's, or the CLI's profile files."""
    if _server_config is not None:
        return profile_files() + _server_files
    shell = _ipython()
    if shell is not None:
        try:
            from IPython.core.application import BaseIPythonApplication

            if BaseIPythonApplication.initialized():
                return list(BaseIPythonApplication.instance().loaded_config_files)
        except Exception:  # noqa: BLE001 - an IPython without it: look in its profile
            pass
        folder = getattr(getattr(shell, "profile_dir", None), "location", None)
        return _existing(folder, ("ipython_config.py", "ipython_config.json")) if folder else []
    return profile_files()


def config_label() -> str:
    """What to call the config in effect here when no file says where a value came from."""
    if _server_config is not None:
        return "the Jupyter server's config"
    return "the IPython config"


def server_config() -> Config | None:
    """The server extension's own config, or None outside a server."""
    return _server_config


def server_files() -> list[str]:
    """The files the server's own config was read from, in the order it read them."""
    return list(_server_files)


def profile_folder(profile: str = "default") -> str:
    """The folder of the IPython profile ``profile`` (which may not exist)."""
    return os.path.join(_ipython_dir(os.environ.get("IPYTHONDIR")), f"profile_{profile}")


def profile_files(profile: str = "default") -> list[str]:
    """The config files of an IPython profile that exist, in the order they are read."""
    return _existing(profile_folder(profile), ("ipython_config.py", "ipython_config.json"))


def _existing(folder: str, names) -> list[str]:
    return [p for p in (os.path.join(folder, n) for n in names) if os.path.isfile(p)]


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


def profile_config(profile: str = "default", strict: bool = False) -> Config:
    """The config files of an IPython profile, read as IPython reads them: ``.py`` then
    ``.json`` (which wins); no file, an empty config; a file that cannot be read, a warning
    (``strict``: a LoungeError, for a profile a start names). They are the user's own code,
    which IPython runs at every start too."""
    from traitlets.config.loader import ConfigFileNotFound, JSONFileConfigLoader, PyFileConfigLoader

    folder = profile_folder(profile)
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
            if strict:
                from .errors import LoungeError

                raise LoungeError(
                    f"The IPython config {path} could not be read ({type(e).__name__}: {e}): "
                    "fix it, or start without that profile."
                ) from None
            warnings.warn(
                f"The IPython config {path} could not be read ({type(e).__name__}: {e}); "
                "jupyter_lounge goes on without it: fix it, or point $IPYTHONDIR elsewhere.",
                stacklevel=2,
            )
    return config
