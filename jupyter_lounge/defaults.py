"""The defaults of every start: ``%lounge start 30`` means what the researcher set up.

Each start option (``backend``, ``engines``, ``preload``, ``nodes``, ``timeout``,
``courtesy``, ``restart``, ``dashboard``, and each backend's options by their name:
``partition``, ``pool``, ...) takes its value from the highest of these places:

1. ``built-in``: the traits' defaults (``config.Lounge``, the backends' traits);
2. the lounge inventory's ``[start]`` table (``inventory.default_path()``, if it exists);
3. the traitlets config in effect (``config.load_config()``: the kernel's IPython profile,
   ``profile_default`` for the ``lounge`` command, that profile under
   ``jupyter_server_config`` in the server): ``c.Lounge.backend``, ``c.SSHBackend.pool``;
4. ``--profile NAME`` (REST: ``"profile"``): the inventory's ``[start.NAME]``, then the
   config files of the IPython profile ``profile_NAME``;
5. the flags of ``%lounge start`` / ``lounge start``, the fields of a REST start.

Every value read from a file is checked here, as a flag's is (the backend's own checks
included), and a mistake is one sentence naming the file, the line and the key. Every
value is then checked again by ``Cluster`` with the flags, so nothing reaches a command
line, a batch script or a remote shell unchecked. The faces (``commands`` for the magic and
the CLI, ``serverext.requests`` for REST, ``lounge config``) all resolve through here.
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import dataclass
from typing import Any

from . import config as lounge_config
from . import validate
from .backends import options as backend_options
from .errors import LoungeError

BUILT_IN = "built-in"
FLAG = "flag"
START_KEYS = lounge_config.START_KEYS
PROFILE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
PRECEDENCE = "a flag, then --profile NAME, the config (c.Lounge...), the inventory's [start]"


@dataclass(frozen=True)
class Setting:
    value: Any
    source: str  # built-in, flag, "<file> line N", "<inventory> line N ([start])"


@functools.lru_cache(maxsize=1)
def backend_option_table() -> dict[str, backend_options.Option]:
    """Every backend's config options by name (no two backends share a name)."""
    return {
        o.name: o for b in backend_options.BACKENDS if b != "local"
        for o in backend_options.declared(b)
    }  # fmt: skip


def option_names(rest: bool = False) -> list[str]:
    """The start options ``lounge config`` shows (``rest``: those ``GET backends`` sends, the
    fields of a REST start): the Lounge ones, then each backend's that a start may give."""
    table = backend_option_table()
    return list(START_KEYS) + [
        name for name, o in table.items() if o.start and (o.rest or not rest)
    ]


@dataclass
class Defaults:
    settings: dict[str, Setting]  # every start option and every backend config option
    profile: str | None = None

    def __getitem__(self, name: str) -> Any:
        return self.settings[name].value

    def source(self, name: str) -> str:
        return self.settings[name].source

    def cluster_options(self) -> dict:
        """The keywords of ``Cluster`` these defaults give: the Lounge options, every
        backend option a flag gave, and the chosen backend's options that a config or the
        inventory set (so they are kept in the cluster's state, and another process
        attaching to it builds the same backend)."""
        options = {key: self[key] for key in START_KEYS}
        if options["engines"] != "dask" and self.source("dashboard") != FLAG:
            options["dashboard"] = False  # a configured dashboard is for Dask starts
        table = backend_option_table()
        for name, setting in self.settings.items():
            if name not in table:
                continue
            if setting.source == FLAG or (
                table[name].backend == options["backend"] and setting.source != BUILT_IN
            ):
                options[name] = setting.value
        return options

    def as_json(self, rest: bool = False) -> dict:
        """``{option: {"value": ..., "source": ...}}`` (``GET backends``' ``defaults``)."""
        return {
            name: {"value": self[name], "source": self.source(name)} for name in option_names(rest)
        }

    def text(self) -> str:
        """The table ``lounge config`` prints: each option, its value and where it came from."""
        from .commands import format_table

        table = backend_option_table()
        rows = []
        for name in option_names():
            label = f"{name} ({table[name].backend})" if name in table else name
            rows.append({"option": label, "value": _show(self[name]), "from": self.source(name)})
        head = "The defaults of a start"
        if self.profile:
            head += f" with --profile {self.profile}"
        head += f"; each from the first place that sets it:\n{PRECEDENCE}, or built-in."
        return head + "\n" + format_table(rows, ["option", "value", "from"])


def _show(value: Any) -> str:
    if value is None or value == "" or value == []:
        return "(none)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


# -- the layers -------------------------------------------------------------------------------
def built_in() -> Defaults:
    """Only the traits' defaults."""
    traits = lounge_config.Lounge.class_traits()
    settings = {key: Setting(traits[key].default(), BUILT_IN) for key in START_KEYS}
    for name, o in backend_option_table().items():
        settings[name] = Setting(o.default, BUILT_IN)
    return Defaults(settings)


def resolve(given: dict | None = None, profile: str | None = None) -> Defaults:
    """The defaults of a start in this process, with ``given`` (flags, REST fields; None:
    not given) over them and ``profile``'s set under those. A mistake is one LoungeError."""
    settings = dict(built_in().settings)
    config = lounge_config.load_config()  # read once: the limits and the defaults
    limits = lounge_config.settings(config)
    table = _inventory()
    if table is not None:
        base = {k: v for k, v in table.table.items() if not isinstance(v, dict)}
        settings.update(_from_table(base, "start", table, limits))
        for name, named in table.table.items():
            if isinstance(named, dict):  # each named set is checked, used or not
                where = table.where.in_table(f"start.{name}")
                _check_profile_name(name, where)
                _from_table(named, f"start.{name}", table, limits)
    settings.update(_from_config(config, settings, None, limits))
    if profile:
        settings.update(_profile(profile, table, settings, limits))
    for key, value in (given or {}).items():
        if value is not None:
            settings[key] = Setting(value, FLAG)
    return Defaults(settings, profile or None)


def check_profile(profile: str) -> None:
    """A LoungeError unless ``profile`` names a set of defaults: a ``[start.NAME]`` table of
    the inventory or an IPython profile folder ``profile_NAME``."""
    _profile_places(profile, _inventory())


def for_rest(profile: str | None = None) -> dict:
    """``GET backends``' ``defaults`` and ``defaults_error``: the effective defaults of a
    start in the server, or, when a config or the inventory holds a mistake, the built-in
    ones and the sentence that says what to fix. An unknown ``profile`` raises (a 400)."""
    if profile:
        check_profile(profile)
    try:
        return {"defaults": resolve(profile=profile).as_json(rest=True), "defaults_error": None}
    except LoungeError as e:
        return {"defaults": built_in().as_json(rest=True), "defaults_error": str(e)}


def _inventory():
    from . import inventory

    return inventory.start_table()


def _from_table(values: dict, name: str, table, limits) -> dict[str, Setting]:
    """The settings of the inventory's table ``[name]`` (``start`` or ``start.NAME``)."""
    known = option_names()  # what an inventory's [start] or [start.NAME] may hold
    found = {}
    for key, value in values.items():
        spot = table.where.in_table(name, key)  # a mistake: "<file> line N: [start] key ..."
        here = f"{spot} ([{name}])"  # its source: "<file> line N ([start])"
        if isinstance(value, dict):
            raise LoungeError(
                f"{spot}: [{name}] may not hold a table {key!r}: a named set is [start.NAME], "
                "right under [start]."
            )
        if key not in known:
            raise LoungeError(
                f"{spot}: [{name}] has no option {key!r}: use one of {', '.join(known)}."
            )
        found[key] = Setting(_checked(key, value, f"[{name}] {key}", spot, limits), here)
    return found


def _from_config(config, lower: dict[str, Setting], files: list[str] | None, limits) -> dict:
    """The settings a traitlets config gives (``c.Lounge.backend``, ``c.SSHBackend.pool``),
    each with the file and line it was set at: in ``files`` (a profile's), or where the
    config in effect here was read from (``files`` None)."""
    found = {}
    texts: dict[str, str | None] = {}  # each file read once, whatever number of keys it sets
    section = _section(config, "Lounge")
    known = (*START_KEYS, *lounge_config.LIMIT_KEYS)
    for key in section:
        if key not in known:
            where = _locate("Lounge", key, files, texts)
            raise LoungeError(
                f"{where}: c.Lounge.{key} is not an option of jupyter_lounge: use one of "
                f"{', '.join(f'c.Lounge.{k}' for k in known)}."
            )
    wanted = [("Lounge", key) for key in START_KEYS]
    wanted += [(o.owner, name) for name, o in backend_option_table().items()]
    for owner, key in wanted:
        values = _section(config, owner)
        if key not in values:
            continue
        where = _locate(owner, key, files, texts)
        value = _lazy(values[key], lower[key].value)
        found[key] = Setting(_checked(key, value, f"c.{owner}.{key}", where, limits), where)
    return found


def _profile(profile: str, table, lower: dict[str, Setting], limits) -> dict[str, Setting]:
    """The settings of ``--profile NAME``: the inventory's ``[start.NAME]``, then the IPython
    profile ``profile_NAME``'s config files (which win)."""
    named, folder = _profile_places(profile, table)
    found = {}
    if named is not None:
        found.update(_from_table(named, f"start.{profile}", table, limits))
    if folder is not None:
        config = lounge_config.profile_config(profile, strict=True)
        files = lounge_config.profile_files(profile)
        found.update(_from_config(config, {**lower, **found}, files, limits))
    return found


def _profile_places(profile: str, table) -> tuple[dict | None, str | None]:
    """(the inventory's ``[start.NAME]`` or None, the IPython profile folder or None) of
    ``profile``; a LoungeError when it is in neither."""
    _check_profile_name(profile)
    named = table.table.get(profile) if table is not None else None
    if named is not None and not isinstance(named, dict):
        named = None  # a key of [start], not a set
    folder = lounge_config.profile_folder(profile)
    exists = os.path.isdir(folder)
    if named is None and not exists:
        from . import inventory

        where = (
            f"no [start.{profile}] table in {table.path}"
            if table is not None
            else f"no lounge inventory at {inventory.default_path()}"
        )
        raise LoungeError(
            f"No profile {profile!r}: there is {where} and no IPython profile folder {folder}: "
            f"add that table, make the folder (ipython profile create {profile}), or start "
            "without that profile."
        )
    return named, folder if exists else None


def _check_profile_name(name: str, where: str | None = None) -> None:
    """A profile name is a folder's name (``profile_NAME``) too: never a path."""
    if not PROFILE_RE.match(str(name)):
        what = f"{where}: profile name" if where else "Profile name"
        raise LoungeError(
            f"{what} {name!r} is not valid: use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit."
        )


def _section(config, name: str) -> dict:
    if name not in config:  # a Config makes a missing section when it is read
        return {}
    section = config[name]
    return section if isinstance(section, dict) else {}


def _lazy(value: Any, lower: Any) -> Any:
    """A config value, with ``c.Lounge.preload.append("numpy")`` applied to the one below."""
    from traitlets.config.loader import LazyConfigValue

    if isinstance(value, LazyConfigValue):
        return value.get_value(list(lower) if isinstance(lower, list) else lower)
    return value


# -- checks -----------------------------------------------------------------------------------
def _checked(key: str, value: Any, label: str, where: str, limits) -> Any:
    """``value`` checked as the flag ``key`` is, or one sentence starting at ``where``."""
    try:
        return check(key, value, label, limits)
    except LoungeError as e:
        raise LoungeError(f"{where}: {e}") from None


def check(key: str, value: Any, label: str, limits) -> Any:
    """The start option ``key``'s ``value`` (as a file gives it: ``label`` says how, e.g.
    ``c.Lounge.backend`` or ``[start] backend``), checked as its flag is; a mistake is one
    LoungeError naming ``label``. ``limits``: ``config.settings()``, read once by the caller."""
    if key == "backend":
        if value not in backend_options.BACKENDS:
            raise LoungeError(
                f"{label} is {value!r}, which is not a backend: use one of "
                f"{', '.join(backend_options.BACKENDS)}."
            )
        return value
    if key == "engines":
        from .engines import KINDS

        if value not in KINDS:
            raise LoungeError(
                f"{label} is {value!r}, which is not an engine kind: use one of {', '.join(KINDS)}."
            )
        return value
    if key == "preload":
        return _modules(value, label)
    if key == "timeout":
        return validate.seconds(value, label, limits.max_timeout)
    if key == "nodes":
        return None if value is None else validate.count(value, label, limits.max_engines)
    if key in ("courtesy", "restart", "dashboard"):
        if not isinstance(value, bool):
            raise LoungeError(f"{label} must be true or false, not {value!r}.")
        return value
    option = backend_option_table()[key]
    if not backend_options.of_kind(value, option.kind):
        words = backend_options.KIND_WORDS[option.kind]
        raise LoungeError(f"{label} must be {words}, not {value!r}.")
    if option.positive:
        validate.count(value, label, limits.max_engines)
    return backend_options.check(option.backend, key, value, limits)


def _modules(value: Any, label: str) -> list[str]:
    """Module names from a list or one comma-separated string."""
    value = validate.module_list(value)
    ok = isinstance(value, list)
    if ok:
        try:
            validate.module_names(value)
        except LoungeError:
            ok = False
    if not ok:
        raise LoungeError(
            f'{label} must be module names, e.g. ["tensorflow", "numpy"], not {_literal(value)}.'
        )
    return list(value)


def _literal(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (list, int, float)) else repr(value)


# -- where a config value was set ----------------------------------------------------------
def _locate(owner: str, key: str, files: list[str] | None, texts: dict | None = None) -> str:
    """``<file> line N`` where ``c.<owner>.<key>`` is set: in ``files``, or in the files the
    config in effect here was read from, the one read last first; the file alone where no
    line says it; what config it is where no file does. ``texts``: the files read so far
    (path -> text, None where unreadable), so a file is read once for all its keys."""
    texts = {} if texts is None else texts
    if files is None:
        server = lounge_config.server_config()
        if server is not None:  # the server's own config, or the profile's under it
            ours = key in _section(server, owner)
            files = lounge_config.server_files() if ours else lounge_config.profile_files()
        else:
            files = lounge_config.config_files()
    for path in reversed(files):
        if path not in texts:
            texts[path] = _read_text(path)
        line = None if texts[path] is None else _line_in(texts[path], path, owner, key)
        if line is not None:
            return f"{path} line {line}" if line else path
    return lounge_config.config_label()


def _read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def _line_in(text: str, path: str, owner: str, key: str) -> int | None:
    """The line of the file ``path`` (its ``text``) that sets ``c.<owner>.<key>`` (the last
    one), 0 when the file names both but no line sets it plainly, None when it does not name
    them."""
    lines = text.splitlines()
    if path.endswith(".json"):
        try:
            data = json.loads(text)
        except ValueError:
            return None
        if not (isinstance(data.get(owner), dict) and key in data[owner]):
            return None
        inside = False
        for i, line in enumerate(lines):
            inside = inside or f'"{owner}"' in line
            if inside and f'"{key}"' in line:
                return i + 1
        return 0
    assignment = re.compile(
        rf"^\s*c\s*\.\s*{re.escape(owner)}\s*\.\s*{re.escape(key)}\s*(=|\+=|\.\w+\()"
    )
    hits = [i + 1 for i, line in enumerate(lines) if assignment.match(line)]
    if hits:
        return hits[-1]
    if re.search(rf"\b{re.escape(owner)}\b", text) and re.search(rf"\b{re.escape(key)}\b", text):
        return 0
    return None


def config_error(section: dict) -> LoungeError:
    """The sentence for a limit of the wrong type in ``c.Lounge`` (``settings()``)."""
    from traitlets import TraitError

    for key, value in section.items():
        try:
            lounge_config.Lounge(**{key: value})
        except TraitError:
            kind = "a whole number" if key == "max_engines" else "a number of seconds"
            return LoungeError(
                f"{_locate('Lounge', key, None)}: c.Lounge.{key} must be {kind}, not {value!r}."
            )
    return LoungeError(f"{lounge_config.config_label()}: c.Lounge holds a value of the wrong type.")
