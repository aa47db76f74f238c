"""Environment prepositioning: this virtualenv, shipped once to each lounge node's local disk.

``lounge sync`` (or ``--sync`` on start) puts the environment the notebook runs in (its
virtualenv, with jupyter_lounge itself even when it is an editable install) on every node at
``<local_dir>/envs/<fingerprint>/``, and the agents then run its ``bin/python``. The
fingerprint is a content hash: the Python version and base interpreter, every installed
distribution's RECORD (which lists the sha256 of each file it installed) and jupyter_lounge's
own source. A node that already has that fingerprint is not shipped to again, so only a
changed environment travels, and of it only the files a node lacks (ship.py: files by
content, one stream written to all the nodes that lack the same ones). The node's side
(``envstore`` and ``treestore``, sent as source to the node's base Python) checks that the
folders are the user's alone, stores each file under the store's lock once it is confirmed to
be what was hashed, links the environment together in a temporary folder and only then
renames it into place (an interrupted or damaged sync never leaves a half environment); of
the older environments on a node the one before stays, and none that a running agent uses is
removed.

A virtualenv points at its base interpreter (``home`` in ``pyvenv.cfg``); a node must have
the same base Python at the same path, as identically imaged lounge PCs do. The sync checks
this first and says so when a node lacks it.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import shlex
import sys
import sysconfig
import time
from pathlib import Path

from . import envstore
from .errors import LoungeError
from .protocol import read_json, write_json

KEEP = envstore.KEEP  # environments kept on a node: the new one and the one before


def _source_dir() -> Path:
    return Path(__file__).resolve().parent


def base_python() -> str:
    """The interpreter this virtualenv was made from (what a node must also have)."""
    cfg = Path(sys.prefix) / "pyvenv.cfg"
    if sys.prefix == sys.base_prefix or not cfg.exists():
        raise LoungeError(
            "`lounge sync` ships a virtualenv, and this Python is not running in one: create "
            "one (python -m venv), install jupyter_lounge and your packages into it, and run "
            "from it."
        )
    for line in cfg.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home":
            return str(Path(value.strip()) / f"python{sys.version_info[0]}")
    raise LoungeError(f"{cfg} names no 'home' (the base interpreter) and cannot be shipped.")


def _installed(h) -> None:
    """Feed ``h`` what the installed part of this environment is: the Python version, the
    base interpreter and every installed distribution's RECORD (the sha256 of each file it
    installed)."""
    h.update(f"{sys.version}\n{base_python()}\n".encode())
    site = Path(sysconfig.get_paths()["purelib"])
    for record in sorted(site.glob("*.dist-info/RECORD")):
        h.update(record.parent.name.encode() + b"\n" + record.read_bytes())


def fingerprint() -> str:
    """A content hash of this environment (16 hex digits)."""
    h = hashlib.sha256()
    _installed(h)
    source = _source_dir()
    for path in sorted(source.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(source)).encode() + b"\n" + path.read_bytes())
    return h.hexdigest()[:16]


def remote_path(path: str) -> str:
    """A path for the node's shell: ``~/x`` becomes ``"$HOME"/x``, the rest is quoted."""
    if path == "~" or path.startswith("~/"):
        return '"$HOME"' + (shlex.quote(path[1:]) if len(path) > 1 else "")
    return shlex.quote(path)


def env_dir(local_dir: str, fp: str) -> str:
    return f"{local_dir.rstrip('/')}/envs/{fp}"


def _editable_hooks(site: Path, source: Path) -> set[Path]:
    """The .pth files and finders that point an editable install at its source folder."""
    hooks = set()
    for path in site.glob("*.pth"):
        try:
            if str(source.parent) in path.read_text() or "jupyter_lounge" in path.name:
                hooks.add(path)
        except (OSError, UnicodeDecodeError):
            continue
    hooks.update(site.glob("__editable__*jupyter_lounge*"))
    return hooks


def _env_parts():
    """The environment as it travels, in two parts of (name in it, local path), folders
    before their contents: what is installed (the virtualenv), and jupyter_lounge's source
    when it is an editable install (it goes in as a plain package, without the hooks that
    point at it here; else it is installed and in the first part)."""
    # plain strings, not pathlib: this walks some 50,000 files
    prefix, site = Path(sys.prefix), Path(sysconfig.get_paths()["purelib"])
    source = _source_dir()
    inside = prefix in source.parents
    skip = {str(p) for p in _editable_hooks(site, source)}
    if not inside:
        skip.add(str(site / "jupyter_lounge"))
    installed = _walk(str(prefix), "", skip)
    if inside:
        return installed, iter(())
    arc = str(site.relative_to(prefix) / "jupyter_lounge")
    return installed, _source_pairs(arc, source)


def _source_pairs(arc: str, source: Path):
    yield arc, str(source)
    yield from _walk(str(source), arc + "/", {str(source / "__pycache__")}, "__pycache__")


def env_tree(extra=(), rescan: bool = False):
    """The environment's tree (ship.Tree), with the pairs ``extra`` added. What is installed
    is walked and its files' hashes looked up only when it changed: when the RECORDs (which
    the fingerprint trusts too) or the mtime of the prefix, its bin/ or site-packages differ
    from the last walk; else that walk's part is reused (0.6 s, not 2.5 s, for 48k files).
    A walk takes the hash of an installed file from its RECORD while the file is as installed
    (``ship.record_hashes``). ``rescan``: walk and read everything (``lounge sync --force``).
    jupyter_lounge's own source, when editable, is always walked (a few dozen files)."""
    from . import ship

    installed, source = _env_parts()
    h = hashlib.sha256()
    _installed(h)
    prefix, site = Path(sys.prefix), Path(sysconfig.get_paths()["purelib"])
    for path in (prefix, prefix / "bin", site):
        h.update(f"{path}\0{path.stat().st_mtime_ns}\n".encode())
    key = h.hexdigest()[:32]
    part = None if rescan else ship.recalled_part(key, str(prefix))
    if part is None:
        trusted = None if rescan else ship.record_hashes(str(site))
        part = ship.scan(installed, private=False, what="env", trusted=trusted)
        ship.remember_part(key, str(prefix), part)
    rest = ship.scan([*source, *extra], private=False, what="env-source")
    return ship.joined(part, rest)


def _walk(top: str, arc: str, skip: set[str], skip_name: str = ""):
    """(``arc`` + name below ``top``, path) of everything below ``top``, sorted, folders
    before their contents; paths in ``skip`` and folders named ``skip_name`` left out."""
    cut = len(top) + 1
    for root, dirs, files in os.walk(top):
        dirs.sort()
        for name in list(dirs):
            path = f"{root}/{name}"
            if path in skip or name == skip_name:
                dirs.remove(name)
                continue
            if os.path.islink(path):
                dirs.remove(name)  # a symlinked folder travels as the link
            yield arc + path[cut:], path
        for name in sorted(files):
            path = f"{root}/{name}"
            if path not in skip:
                yield arc + path[cut:], path


def wsl_command(node, *argv: str) -> str:
    """A Windows PC's remote command: ``wsl.exe -d DISTRO --exec ARGV``, words that cmd.exe
    and PowerShell both pass on as they are (no shell runs in between on either side)."""
    from .inventory import WINDOWS_WORD_RE

    words = ["wsl.exe", "-d", node.wsl_distro, "--exec", *argv]
    bad = [w for w in words if not WINDOWS_WORD_RE.match(w)]
    if bad:
        raise LoungeError(
            f"Lounge node {node.name!r} is a Windows PC, and {bad[0]!r} cannot be a word of "
            "its command line: use letters, digits and . _ / - only."
        )
    return " ".join(words)


def node_program(node, action: str, *args: str) -> tuple[str, bytes]:
    """The remote command that runs the node program (envstore) with the base Python, and
    what goes first on its stdin. On a Windows PC the command is WSL's bash reading its one
    line from stdin (``bash -s``: it reads no further than that line, so the program and
    the stream after it reach Python): the command line stays free of any shell syntax."""
    argv = envstore.command(base_python(), action, *args)
    if getattr(node, "windows", False):
        return wsl_command(node, "/bin/bash", "-s"), (shlex.join(argv) + "\n").encode()
    return shlex.join(argv), b""


def _node_command(ssh_command, node, action: str, *args: str) -> tuple[list[str], bytes]:
    """ssh to ``node`` (``ssh_command(name)``: the ssh backend's), running the node program;
    and what goes first on stdin."""
    remote, first = node_program(node, action, *args)
    return [*ssh_command(node.name), remote], first


def _said(error: str) -> str:
    """What the node or ssh said, without our wrapping and the command line."""
    said = re.split(r"exit code -?\d+: |within ", error, maxsplit=1)[-1].strip()
    return said.splitlines()[-1] if said else "no answer"


def put_tree(
    nodes: list, ssh_command, kind: str, name: str, build, *, force=False, progress=True, keep=KEEP
) -> dict[str, dict]:
    """Ship the tree ``build()`` gives (only called when a node lacks it) as the environment or
    data set ``name`` to these inventory nodes at once (see ship.py); node -> its row."""
    from . import ship

    sessions = {}
    for node in nodes:
        cmd, first = _node_command(
            ssh_command, node, "put", node.local_dir, kind, name, "force" if force else ""
        )
        sessions[node.name] = ship.Session(node.name, cmd, first)
    return ship.ship(sessions, build, keep=keep, progress=progress)


async def sync(nodes: list, ssh_command, force: bool = False, progress: bool = True) -> list[dict]:
    """Make sure each of these inventory nodes has this environment (reached with
    ``ssh_command(name)``); return one row per node: node, env, status ("present", "shipped" or
    "failed: why"), files and MiB sent, seconds."""

    fp, base = fingerprint(), base_python()
    t0 = time.monotonic()
    shipped = await asyncio.to_thread(
        put_tree, nodes, ssh_command, "env", fp,
        lambda: env_tree(rescan=force), force=force, progress=progress,
    )  # fmt: skip
    seconds = round(time.monotonic() - t0, 1)
    rows = []
    memory = _memory()
    for node in nodes:
        row = shipped[node.name]
        status = row["status"]
        if status.startswith("failed: exit code 127"):  # the shell found no such python
            status = (
                f"failed: it has no {base}, the base Python this virtualenv was made from "
                "(install the same Python there, or give the node its own python= in the "
                "inventory and do not sync)"
            )
        rows.append({
            "node": node.name, "env": env_dir(node.local_dir, fp), "status": status,
            "files": row["files"], "MiB": round(row["bytes"] / 2**20, 2), "seconds": seconds,
        })  # fmt: skip
        if status in ("present", "shipped"):
            memory[_key(node)] = fp
        else:
            memory.pop(_key(node), None)
    write_json(_memory_path(), memory)
    return rows


# What this machine synced where: a ``--sync`` start trusts it instead of asking each node
# again (the node program that starts the agent checks the environment is there, and ours).
def _memory_path() -> Path:
    from .paths import lounge_dir

    return lounge_dir() / "synced.json"


def _memory() -> dict:
    return read_json(_memory_path()) or {}


def _key(node) -> str:
    return f"{node.user}@{node.host}:{node.port}:{node.local_dir}"


def remembered(nodes: list) -> dict[str, str]:
    """The nodes among these that this machine synced this very environment to: node name ->
    its fingerprint."""
    fp, memory = fingerprint(), _memory()
    return {node.name: fp for node in nodes if memory.get(_key(node)) == fp}


def launch_command(node, fp: str) -> tuple[str, bytes]:
    """The remote command that starts a node's agent from its synced environment, and what
    goes first on stdin: the node program checks the folders are the user's alone, then
    becomes that env's agent (the relay sends the program next, see ``--program``)."""
    return node_program(node, "launch", node.local_dir, fp)
