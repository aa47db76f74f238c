"""Environment prepositioning: this virtualenv, shipped once to each lounge node's local disk.

``lounge sync`` (or ``--sync`` on start) puts the environment the notebook runs in (its
virtualenv, with jupyter_lounge itself even when it is an editable install) on every node at
``<local_dir>/envs/<fingerprint>/``, and the agents then run its ``bin/python``. The
fingerprint is a content hash: the Python version and base interpreter, every installed
distribution's RECORD (which lists the sha256 of each file it installed) and jupyter_lounge's
own source. A node that already has that fingerprint is not shipped to again, so only a
changed environment travels. All nodes are asked at once; the nodes that need it receive one
tar stream, written to all their SSH sessions together. The node's side (``envstore``, sent as
source to the node's base Python) checks that the folders are the user's alone, unpacks under
the store's lock into a unique temporary folder, verifies the hash of what arrived against
the one computed here while sending, and only then renames it into place (an interrupted or
damaged sync never leaves a half environment); of the older environments on a node the one
before stays, and none that a running agent uses is removed.

A virtualenv points at its base interpreter (``home`` in ``pyvenv.cfg``); a node must have
the same base Python at the same path, as identically imaged lounge PCs do. The sync checks
this first and says so when a node lacks it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import sysconfig
import tarfile
import time
from pathlib import Path

from . import envstore
from .envstore import TreeHash
from .errors import LoungeError
from .procs import call
from .protocol import read_json, write_json

KEEP = 2  # environments kept on a node: the new one and the one before


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


def fingerprint() -> str:
    """A content hash of this environment (16 hex digits)."""
    h = hashlib.sha256()
    h.update(f"{sys.version}\n{base_python()}\n".encode())
    site = Path(sysconfig.get_paths()["purelib"])
    for record in sorted(site.glob("*.dist-info/RECORD")):
        h.update(record.parent.name.encode() + b"\n" + record.read_bytes())
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


class _Hashing:
    """A file read through: what tarfile copies from it also goes into the tree hash."""

    def __init__(self, f, tree: TreeHash):
        self.f, self.tree = f, tree

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.tree.data(data)
        return data


class TarSender:
    """A tar stream to ``out`` whose members also go into ``tree`` (see envstore.TreeHash),
    in the order and shape the node hashes them as it unpacks."""

    def __init__(self, out, tree: TreeHash):
        # tarfile's stream re-copies its whole buffer on each write: keep it small
        self.tar = tarfile.open(fileobj=out, mode="w|", bufsize=1 << 16)
        self.tree = tree

    def add(self, path: Path, arcname: str) -> None:
        info = self.tar.gettarinfo(str(path), arcname)
        if info.isreg():
            self.tree.member("f", info.name, str(info.size))
            with open(path, "rb") as f:
                self.tar.addfile(info, _Hashing(f, self.tree))
        elif info.isdir():
            self.tree.member("d", info.name, "")
            self.tar.addfile(info)
        elif info.issym():
            self.tree.member("l", info.name, info.linkname)
            self.tar.addfile(info)

    def __enter__(self) -> TarSender:
        return self

    def __exit__(self, *exc) -> None:
        self.tar.close()


def write_tar(out, tree: TreeHash | None = None) -> int:
    """Write this environment as a tar stream to ``out``; return the bytes of file data. Every
    member also goes into ``tree``, as the node will hash it."""
    prefix, site = Path(sys.prefix), Path(sysconfig.get_paths()["purelib"])
    source = _source_dir()
    skip = _editable_hooks(site, source)
    inside = prefix in source.parents
    tree = tree or TreeHash()
    with TarSender(out, tree) as tar:
        for root, dirs, files in os.walk(prefix):
            dirs.sort()
            here = Path(root)
            for name in (*dirs, *sorted(files)):
                path = here / name
                if path in skip or (not inside and path == site / "jupyter_lounge"):
                    continue
                if name in dirs and path.is_symlink():
                    dirs.remove(name)  # a symlinked folder travels as the link
                tar.add(path, str(path.relative_to(prefix)))
        if not inside:  # an editable install: its source goes in as a plain package
            arc = site.relative_to(prefix) / "jupyter_lounge"
            tar.add(source, str(arc))
            for path in sorted(source.rglob("*")):
                if "__pycache__" in path.parts:
                    continue
                tar.add(path, str(arc / path.relative_to(source)))
    return tree.bytes


class _FanOut:
    """A file-like object that writes each chunk, as one frame, to every live session's stdin."""

    def __init__(self, procs: dict[str, subprocess.Popen]):
        self.procs = dict(procs)
        self.failed: dict[str, str] = {}

    def send(self, data: bytes) -> None:
        for name in list(self.procs):
            self.send_to(name, data)
        if not self.procs:
            raise LoungeError("every node's SSH session ended while the environment was shipped")

    def send_to(self, name: str, data: bytes) -> None:
        try:
            self.procs[name].stdin.write(data)
        except (BrokenPipeError, OSError) as e:
            self.failed[name] = f"the SSH session ended while shipping ({e})"
            del self.procs[name]

    def write(self, data: bytes) -> int:
        self.send(envstore.frame(b"D", bytes(data)))
        return len(data)

    def flush(self) -> None:
        pass


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


async def sync(nodes: list, ssh_command, force: bool = False) -> list[dict]:
    """Make sure each of these inventory nodes has this environment (reached with
    ``ssh_command(name)``); return one row per node: node, env, status ("present", "shipped" or
    "failed: why"), seconds, MiB."""
    fp, base = fingerprint(), base_python()
    by_name = {node.name: node for node in nodes}

    async def check(node) -> tuple[str, str]:
        cmd, first = _node_command(ssh_command, node, "check", node.local_dir, fp)
        try:
            out = await call(cmd, timeout=30, input=first + envstore.program())
        except LoungeError as e:
            if "exit code 127" in str(e):  # the shell found no such python
                return "nobase", ""
            return "failed", _said(str(e))
        try:
            answer = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return "failed", f"the node answered {out.strip()[-200:]!r}"
        return answer["state"], answer.get("problem") or ""

    t0 = time.monotonic()
    states = await asyncio.gather(*(check(n) for n in nodes))
    rows = {}
    for node, (how, why) in zip(nodes, states):
        row = {"node": node.name, "env": env_dir(node.local_dir, fp), "seconds": None, "MiB": 0}
        if how == "nobase":
            how = (
                f"failed: it has no {base}, the base Python this virtualenv was made from "
                "(install the same Python there, or give the node its own python= in the "
                "inventory and do not sync)"
            )
        elif how == "present" and force:
            how = "absent"
        elif how in ("failed", "refused"):
            how = f"failed: {why or 'no answer'}"
        row["status"] = how
        rows[node.name] = row
    todo = [n for n in nodes if rows[n.name]["status"] == "absent"]
    if todo:
        shipped = await asyncio.to_thread(_ship, ssh_command, todo, fp)
        for name, (status, mib) in shipped.items():
            rows[name].update(status=status, MiB=mib)
    memory = _memory()
    for row in rows.values():
        row["seconds"] = round(time.monotonic() - t0, 1)
        key = _key(by_name[row["node"]])
        if row["status"] in ("present", "shipped"):
            memory[key] = fp
        else:
            memory.pop(key, None)
    write_json(_memory_path(), memory)
    return list(rows.values())


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


def _ship(ssh_command, nodes, fp: str, write=write_tar, keep: int = KEEP) -> dict:
    """Send what ``write(out, tree)`` writes to every node at once, as environment ``fp``;
    node -> (status, MiB)."""
    procs, firsts = {}, {}
    for node in nodes:
        cmd, firsts[node.name] = _node_command(
            ssh_command, node, "receive", node.local_dir, fp, str(keep)
        )
        procs[node.name] = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
    fan = _FanOut(procs)
    tree, error = envstore.TreeHash(), ""
    try:
        for name, first in firsts.items():  # each node's own line first (Windows PCs)
            if first:
                fan.send_to(name, first)
        fan.send(envstore.program())
        write(fan, tree)
        trailer = {"tree": tree.hexdigest(), "files": tree.files, "bytes": tree.bytes}
        fan.send(envstore.frame(b"E", json.dumps(trailer).encode()))
    except LoungeError as e:
        error = str(e)
    result = {}
    for name, proc in procs.items():
        try:
            _, err = proc.communicate(timeout=300)  # closes stdin: the end of the stream
        except subprocess.TimeoutExpired:
            proc.kill()
            err = b"unpacking did not finish within 300 s"
        except (BrokenPipeError, OSError, ValueError):
            err = proc.stderr.read() if proc.wait(timeout=300) else b""
        if name in fan.failed or proc.returncode != 0 or error:
            why = err.decode(errors="replace").strip() or fan.failed.get(name) or error
            result[name] = (f"failed: {why.splitlines()[-1] if why else 'unknown'}", 0)
        else:
            result[name] = ("shipped", round(tree.bytes / 2**20))
    return result
