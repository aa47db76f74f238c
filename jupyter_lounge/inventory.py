"""The lounge inventory: a TOML file naming the machines, their pools and the idle policy.

Default ``~/.config/jupyter_lounge/lounge.toml`` (or ``$JUPYTER_LOUNGE_INVENTORY``)::

    [defaults]                 # applies to every node unless the node says otherwise
    user = "lounge"
    key = "~/.ssh/id_ed25519"
    python = "/opt/lounge/venv/bin/python"   # or let `lounge sync` preposition this one's
    local_dir = "/var/tmp/lounge"            # node-local disk (default ~/.cache/jupyter_lounge)
    engines = 4

    [idle]                     # when a PC counts as in use (HTCondor-style courtesy)
    cpu_percent = 20           # foreign processes above this much CPU ...
    gpu_percent = 10           # ... or GPU ...
    for_seconds = 30           # ... for this long
    idle_after_seconds = 300   # then engines come back after this long idle

    [pools.gpu.idle]           # a pool may tighten or relax the policy
    cpu_percent = 10

    [[node]]
    name = "pc01"
    host = "10.0.0.11"
    gpus = 1
    pools = ["gpu", "nlp"]

    [[node]]                   # a Windows gaming PC: the engines run in its WSL2 distro
    name = "pc07"
    host = "10.0.0.17"
    os = "windows"
    wsl_distro = "Ubuntu-22.04"
    python = "/usr/bin/python3"              # inside the distro
    local_dir = "/home/ana/.cache/jupyter_lounge"   # inside the distro, absolute

Every mistake is one LoungeError sentence naming the file, the line or key, and what is
expected.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from .errors import LoungeError
from .telemetry import IDLE_KEYS, IdlePolicy

DEFAULT_PATH = "~/.config/jupyter_lounge/lounge.toml"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
#: What ssh may be handed as a host (a name, IPv4 or IPv6): never an option (no leading '-').
HOST_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:%-]*\Z")
#: A login name on a node (POSIX portable names, and '$' for machine accounts).
USER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\$?\Z")
#: A word of a Windows node's remote command: nothing cmd.exe or PowerShell would interpret
#: (no quote, space, $ % ^ & | < > ( ) { } ; , ` @ ! or ~), so it means the same to both.
WINDOWS_WORD_RE = re.compile(r"^[A-Za-z0-9_./-][A-Za-z0-9_./:=+-]*\Z")
OS_NAMES = ("linux", "windows")


@dataclass(frozen=True)
class Node:
    name: str
    host: str
    user: str = ""
    port: int = 22
    key: str = ""
    known_hosts: str = ""  # a known_hosts file of its own (default: OpenSSH's)
    python: str = "python3"
    local_dir: str = "~/.cache/jupyter_lounge"  # node-local: prepositioned envs, agent files
    gpus: int = 0
    engines: int = 4
    pools: tuple[str, ...] = ()
    os: str = "linux"  # "windows": a gaming PC whose engines run in WSL2 (``wsl_distro``)
    wsl_distro: str = ""
    idle: IdlePolicy = field(default_factory=IdlePolicy)

    @property
    def windows(self) -> bool:
        return self.os == "windows"


NODE_KEYS = {f.name: f.type for f in fields(Node) if f.name not in ("idle",)}
TOP_KEYS = {"defaults", "idle", "pools", "node", "start"}  # [start]: see defaults.py


@dataclass
class Inventory:
    path: Path
    nodes: list[Node]

    @property
    def pools(self) -> list[str]:
        return sorted({p for n in self.nodes for p in n.pools})

    def select(self, pool: str | None = None) -> list[Node]:
        """The nodes of ``pool`` (all nodes when None)."""
        if pool is None:
            return list(self.nodes)
        chosen = [n for n in self.nodes if pool in n.pools]
        if not chosen:
            known = ", ".join(self.pools) or "none"
            raise LoungeError(f"Unknown pool {pool!r} in {self.path}: the pools there are {known}.")
        return chosen

    def rows(self) -> list[dict]:
        return [
            {
                "name": n.name,
                "host": n.host,
                "user": n.user,
                "port": n.port,
                "gpus": n.gpus,
                "engines": n.engines,
                "pools": ",".join(n.pools),
            }
            for n in self.nodes
        ]


def default_path() -> Path:
    return Path(os.path.expanduser(os.environ.get("JUPYTER_LOUNGE_INVENTORY", DEFAULT_PATH)))


def load(path: str | Path | None = None) -> Inventory:
    """Read and check the inventory; raise one clear sentence for the first mistake."""
    path = Path(os.path.expanduser(str(path))) if path else default_path()
    text, data = _read(path)
    return Inventory(path, _nodes(path, text, data))


def start_table(path: str | Path | None = None) -> StartTable | None:
    """The inventory's ``[start]`` table (the defaults of every start, and its named sets
    ``[start.NAME]``), or None when there is no inventory file. The file is checked as
    ``load`` checks it (yours or root's, valid TOML); its nodes are not needed here."""
    path = Path(os.path.expanduser(str(path))) if path else default_path()
    if not path.is_file():
        return None
    text, data = _read(path)
    where = _Where(path, text)
    _check_sections(data, where)
    return StartTable(path, where, _table(data, "start", where))


@dataclass
class StartTable:
    path: Path
    where: _Where
    table: dict  # its keys, and a dict per named set


def _read(path: Path) -> tuple[str, dict]:
    """The text and the parsed TOML of the inventory at ``path``, once it is known to be
    changeable only by us or root."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    try:
        text = path.read_text()
        st = path.stat()
    except FileNotFoundError:
        raise LoungeError(
            f"No lounge inventory at {path}: create it (see the README's inventory example) "
            "or name another with --inventory."
        ) from None
    except OSError as e:
        raise LoungeError(f"The lounge inventory {path} cannot be read: {e.strerror}.") from None
    # It says which machines get our keys and what runs there (an idle probe command):
    # only we, or root for a lounge-wide one, may change it.
    if st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
        raise LoungeError(
            f"The lounge inventory {path} can be changed by someone other than you or root "
            f"(owner uid {st.st_uid}, mode {st.st_mode & 0o777:04o}): make it yours and run "
            f"`chmod go-w {path}`."
        )
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise LoungeError(f"{path} is not valid TOML: {e}.") from None
    return text, data


def _nodes(path: Path, text: str, data: dict) -> list[Node]:
    where = _Where(path, text)
    _check_sections(data, where)
    defaults = _table(data, "defaults", where)
    policy = _idle(IdlePolicy(), _table(data, "idle", where), where, "[idle]")
    pool_policy = {}
    for pool, spec in _table(data, "pools", where).items():
        _check_name(pool, where.key(pool), "pool name")
        if not isinstance(spec, dict) or set(spec) - {"idle"}:
            raise LoungeError(
                f"{where.key(pool)}: [pools.{pool}] may only hold an idle table, "
                "e.g. [pools.gpu.idle] cpu_percent = 10."
            )
        pool_policy[pool] = spec.get("idle", {})
    raw_nodes = data.get("node", [])
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise LoungeError(
            f"{path}: no [[node]] entries; add one per machine, each with at least name and host."
        )
    nodes, seen = [], set()
    for i, raw in enumerate(raw_nodes):
        here = where.node(i)
        merged = {**defaults, **raw}
        for key in merged:
            if key not in NODE_KEYS:
                raise LoungeError(
                    f"{here}: unknown key {key!r}; expected one of {', '.join(sorted(NODE_KEYS))}."
                )
        for required in ("name", "host"):
            if required not in raw:
                raise LoungeError(
                    f"{here}: {required!r} is missing; every [[node]] needs a name and a host."
                )
        node = Node(**{k: _value(k, v, here) for k, v in merged.items()})
        _check_name(node.name, here, "node name")
        for pool in node.pools:
            _check_name(pool, here, "pool name")
        _check_windows(node, here)
        if node.name in seen:
            raise LoungeError(
                f"{here}: node name {node.name!r} is used twice; names must be unique."
            )
        seen.add(node.name)
        node_policy = policy
        for pool in node.pools:
            node_policy = _idle(
                node_policy, pool_policy.get(pool, {}), where, f"[pools.{pool}.idle]"
            )
        nodes.append(replace(node, idle=node_policy))
    return nodes


def _check_sections(data: dict, where: _Where) -> None:
    for key in data:
        if key not in TOP_KEYS:
            raise LoungeError(
                f"{where.key(key)}: unknown section {key!r}; expected "
                f"{', '.join(sorted(TOP_KEYS))}."
            )


def _check_windows(node: Node, here: str) -> None:
    """A Windows PC is reached as ``wsl.exe -d DISTRO --exec PYTHON ...``: no shell of its own
    expands ``~`` or reads quotes there, so every word must stand as it is."""
    if not node.windows:
        if node.wsl_distro:
            raise LoungeError(f"{here}: 'wsl_distro' is for os = \"windows\" nodes only.")
        return
    if not node.wsl_distro:
        raise LoungeError(
            f'{here}: os = "windows" needs wsl_distro, the WSL2 distro its engines run in, as '
            '`wsl -l -q` lists it, e.g. wsl_distro = "Ubuntu-22.04".'
        )
    for key in ("wsl_distro", "python", "local_dir"):
        value = getattr(node, key)
        plain = WINDOWS_WORD_RE.match(value) and not value.startswith("-")
        if not plain or (key == "local_dir" and value[0] != "/"):
            raise LoungeError(
                f"{here}: {key!r} {value!r} cannot be a word of a Windows PC's command line: "
                + (
                    "use an absolute path inside the distro, e.g. local_dir = "
                    '"/home/ana/.cache/jupyter_lounge" (wsl.exe --exec runs no shell to expand ~).'
                    if key == "local_dir"
                    else "use letters, digits and . _ / - only."
                )
            )


def _value(key: str, value, here: str):
    if key in ("port", "gpus", "engines"):
        low = 1 if key in ("port", "engines") else 0
        high = {"port": 65535, "gpus": 64, "engines": 4096}[key]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise LoungeError(
                f"{here}: {key!r} must be a whole number from {low} to {high}, not {value!r}."
            )
        return value
    if key == "pools":
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
            raise LoungeError(
                f'{here}: \'pools\' must be a list of names, e.g. ["gpu", "nlp"], not {value!r}.'
            )
        return tuple(value)
    if key == "os" and value not in OS_NAMES:
        raise LoungeError(f"{here}: 'os' must be one of {', '.join(OS_NAMES)}, not {value!r}.")
    if not isinstance(value, str) or (key in ("name", "host") and not value.strip()):
        raise LoungeError(f"{here}: {key!r} must be a non-empty string, not {value!r}.")
    return _checked(key, value, here)


def _checked(key: str, value: str, here: str) -> str:
    """A string value that reaches ssh's command line or the node's shell: refused with one
    sentence when it could mean more than it says (an option, a second line, a second word)."""
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise LoungeError(f"{here}: {key!r} {value!r} holds a control character (a newline?).")
    if key == "host" and not HOST_RE.match(value):
        raise LoungeError(
            f"{here}: 'host' {value!r} is not a host name or address (and may not start with '-')."
        )
    if key == "user" and value and not USER_RE.match(value):
        raise LoungeError(
            f"{here}: 'user' {value!r} is not a login name: use letters, digits, '_', '.' "
            "or '-', not starting with '-'."
        )
    if key in ("python", "local_dir", "key", "known_hosts") and value.startswith("-"):
        raise LoungeError(f"{here}: {key!r} {value!r} may not start with '-'.")
    if key == "local_dir" and not (value.startswith("/") or value == "~" or value[:2] == "~/"):
        raise LoungeError(
            f"{here}: 'local_dir' {value!r} must be an absolute path or start with ~/ "
            "(a folder on the node's own disk)."
        )
    if key in ("key", "known_hosts"):
        if any(c.isspace() or c in "\"'" for c in value):
            raise LoungeError(
                f"{here}: {key!r} {value!r} has a space or a quote, which ssh would split or "
                "unquote: use a path without them."
            )
        return os.path.expanduser(value)
    return value


def _idle(base: IdlePolicy, table: dict, where: _Where, label: str) -> IdlePolicy:
    for key, value in table.items():
        if key not in IDLE_KEYS:
            raise LoungeError(
                f"{where.key(key)} in {label}: unknown key {key!r}; expected one "
                f"of {', '.join(sorted(IDLE_KEYS))}."
            )
        if key == "games":
            if not isinstance(value, list) or not all(
                isinstance(g, str) and g.strip() and g.isprintable() for g in value
            ):
                raise LoungeError(
                    f"{where.key(key)} in {label}: 'games' must be a list of program names as "
                    f'Windows\' tasklist shows them, e.g. ["cs2.exe", "dota2.exe"], not {value!r}.'
                )
            table = {**table, "games": tuple(value)}
            continue
        ok = (
            isinstance(value, str)
            if key == "probe"
            else (isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0)
        )
        if not ok:
            what = "a command string" if key == "probe" else "a number of at least 0"
            raise LoungeError(
                f"{where.key(key)} in {label}: {key!r} must be {what}, not {value!r}."
            )
    return replace(base, **table)


def _table(data: dict, key: str, where: _Where) -> dict:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise LoungeError(f"{where.key(key)}: {key!r} must be a table ([{key}]).")
    return value


def _check_name(name: str, here: str, what: str) -> None:
    if not NAME_RE.match(str(name)):
        raise LoungeError(
            f"{here}: {what} {name!r} is not valid; use letters, digits, '.', '_' or '-'."
        )


class _Where:
    """Points at lines of the file for error messages (TOML parsers give no line numbers)."""

    def __init__(self, path: Path, text: str):
        self.path, self.lines = path, text.splitlines()

    def _line(self, pattern: str, nth: int = 0) -> int | None:
        hits = [i + 1 for i, line in enumerate(self.lines) if re.match(pattern, line.strip())]
        return hits[nth] if len(hits) > nth else None

    def key(self, key: str) -> str:
        line = self._line(rf"(\[+\s*)?{re.escape(key)}\b")
        return f"{self.path} line {line}" if line else f"{self.path}"

    def in_table(self, table: str, key: str | None = None) -> str:
        """``path line N``: the line of ``key`` within the table ``[table]`` (a
        dotted name: ``start.lounge-gpu``), or of the table's header when ``key`` is None or
        not found there."""
        parts = [re.escape(p) for p in table.split(".")]
        header = r"\[\s*" + r"\s*\.\s*".join(f"[\"']?{p}[\"']?" for p in parts) + r"\s*\]"
        start = self._line(header)
        line = start
        if start is not None and key is not None:
            for i in range(start, len(self.lines)):  # the lines after the header
                text = self.lines[i].strip()
                if text.startswith("["):
                    break
                if re.match(rf'["\']?{re.escape(key)}["\']?\s*=', text):
                    line = i + 1
                    break
        return f"{self.path} line {line}" if line else f"{self.path}"

    def node(self, index: int) -> str:
        line = self._line(r"\[\[\s*node\s*\]\]", index)
        spot = f" line {line}" if line else ""
        return f"{self.path}{spot} ([[node]] number {index + 1})"
