"""Data sets on every node's own disk: ``lounge stage DIR --name NAME``.

A data set is a folder shipped by content (ship.py, treestore.py) to each lounge node's
``<local_dir>/data/NAME``: the owner alone can read it there, a file any version of it already
has never travels again, and a change is switched in whole (the version before stays for
engines still reading it). Engines find it as ``lounge.data("NAME")``, or
``$LOUNGE_DATA_NAME``, both the folder on their own node's disk.

On Slurm nothing is shipped: ``--stage NAME=DIR`` on start makes each node agent copy DIR from
the shared file system to the node's scratch disk before it forks (``treestore.stage_copy``),
once per node and content, and later allocations on that node reuse it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from . import treestore
from .errors import LoungeError

LIST_COLUMNS = ["node", "name", "files", "MiB", "content", "staged", "path"]
STAGE_COLUMNS = ["node", "name", "status", "files", "MiB", "seconds", "path"]


def check_name(name: str | None) -> str:
    if not treestore.is_data_name(name):
        raise LoungeError(
            f"{name!r} cannot name a data set: use a letter, then letters, digits or _ (at most "
            "64), e.g. --name tissue_2026"
        )
    return name


def env_var(name: str) -> str:
    """The variable an engine finds data set ``name``'s folder in."""
    return f"LOUNGE_DATA_{name.upper()}"


def source_folder(source: str) -> Path:
    root = Path(os.path.expanduser(source))
    if not root.is_dir():
        raise LoungeError(f"{source!r} is not a folder here: give the folder to stage.")
    return root.resolve()


def scan(root: Path, name: str):
    from . import ship

    return ship.scan(ship.folder_pairs(root), private=True, what=f"data-{name}")


def stage(nodes: list, ssh_command, source: str, name: str, force=False, progress=True):
    """Ship folder ``source`` as data set ``name`` to these inventory nodes; a row per node."""
    from . import sync

    root, name = source_folder(source), check_name(name)
    t0 = time.monotonic()
    shipped = sync.put_tree(
        nodes, ssh_command, "data", name, lambda: scan(root, name),
        force=force, progress=progress, keep=treestore.DATA_KEEP,
    )  # fmt: skip
    seconds = round(time.monotonic() - t0, 1)
    return [
        {
            "node": n.name,
            "name": name,
            "status": shipped[n.name]["status"],
            "files": shipped[n.name]["files"],
            "MiB": round(shipped[n.name]["bytes"] / 2**20, 2),
            "seconds": seconds,
            "path": f"{n.local_dir.rstrip('/')}/data/{name}",
        }  # fmt: skip
        for n in nodes
    ]


async def _ask_all(nodes: list, ssh_command, action: str, *args: str) -> dict[str, object]:
    """Each node's answer to the node program's ``action`` (an exception when it failed)."""
    import asyncio

    from . import envstore, sync
    from .procs import call

    async def ask(node):
        cmd, first = sync._node_command(ssh_command, node, action, node.local_dir, *args)
        out = await call(cmd, timeout=60, input=first + envstore.program())
        return json.loads(out.strip().splitlines()[-1])

    answers = await asyncio.gather(*(ask(n) for n in nodes), return_exceptions=True)
    return {n.name: a for n, a in zip(nodes, answers)}


def _failed(node: str, error: BaseException) -> dict:
    from .sync import _said

    return {"node": node, "name": None, "error": _said(str(error))}


async def listing(nodes: list, ssh_command) -> list[dict]:
    """What data sets are where: a row per node and data set (a node with none: one row)."""
    rows = []
    for node, said in (await _ask_all(nodes, ssh_command, "data-list")).items():
        if isinstance(said, BaseException):
            rows.append(_failed(node, said))
            continue
        rows += [
            {
                "node": node,
                "name": d["name"],
                "files": d["files"],
                "MiB": round(d["bytes"] / 2**20, 1),
                "content": (d["tree"] or "")[:12],
                "staged": time.strftime("%Y-%m-%d %H:%M", time.localtime(d["time"])),
                "path": d["path"],
            }  # fmt: skip
            for d in said
        ] or [{"node": node, "name": None}]
    return rows


async def remove(nodes: list, ssh_command, name: str) -> list[dict]:
    """Remove data set ``name`` from these nodes: a row per node."""
    check_name(name)
    rows = []
    for node, said in (await _ask_all(nodes, ssh_command, "data-remove", name)).items():
        if isinstance(said, BaseException):
            rows.append(_failed(node, said) | {"status": f"failed: {_failed(node, said)['error']}"})
        else:
            rows.append({"node": node, "name": name,
                         "status": "removed" if said["removed"] else "not there"})  # fmt: skip
    return rows


def data(name: str) -> str:
    """In an engine: the folder of data set ``name`` on this node's own disk."""
    check_name(name)
    path = os.environ.get(env_var(name))
    if path:
        return path
    where = os.environ.get("LOUNGE_NODE")
    raise LoungeError(
        f"Data set {name!r} is not on {f'node {where!r}' if where else 'this machine'}: stage "
        f"it with `lounge stage DIR --name {name}` (lounge nodes), or start with "
        f"`--stage {name}=DIR` (Slurm, local)."
    )
