"""What each word of ``%lounge`` (the notebook face) and ``lounge`` (the shell face) does,
written once for both: ``COMMANDS`` maps a command to a function of the parsed arguments and
the face, which returns the text to print, or, in the magic, the Cluster a start or attach
gives (the notebook keeps it). Where the faces differ, a ``Face`` says so:

- the shell's clusters outlive the command (no stop at exit, no progress panel), and a
  command about one cluster must name it; the magic's defaults to the current cluster, and
  follows a start or a scale with the launch progress (``widgets.LaunchProgress``);
- the shell says what it did (``Started ...``, ``Stopped ...``); the magic hands back the
  cluster, whose display says it.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import commands
from .errors import LoungeError


@dataclass(frozen=True)
class Face:
    prog: str  # how its commands are spelled: %lounge, lounge
    shell: bool  # the CLI: clusters outlive the command; commands name their cluster

    def cluster(self, name: str | None, how: str):
        """The cluster a command is about: ``name``'s; unnamed, the magic's current one, and
        in the shell a LoungeError saying ``how`` to name it."""
        from .cluster import Cluster, current

        if name:
            return Cluster.attach(name)
        if self.shell:
            raise LoungeError(how)
        return current()


MAGIC = Face("%lounge", shell=False)
SHELL = Face("lounge", shell=True)


# -- the commands ------------------------------------------------------------------------------
def _help(args: argparse.Namespace, face: Face) -> str:
    return commands.usage(face.prog)


def _start(args: argparse.Namespace, face: Face):
    from .cluster import Cluster

    keep = {"stop_at_exit": False} if face.shell else {}
    cluster = Cluster(args.n, **keep, **commands.start_options(args))
    if args.dry_run:
        return job_script(cluster)
    if not face.shell:
        follow(cluster)
    cluster.start_sync()
    if not face.shell:
        return cluster
    return (
        f"Started {cluster.name}: {describe(cluster)}\n"
        f"Attach with: from jupyter_lounge import Lounge; lounge = Lounge.attach("
        f"{cluster.name!r})   or   %lounge attach {cluster.name}"
    )


def _config(args: argparse.Namespace, face: Face) -> str:
    """The defaults a start with these flags would take, and where each came from."""
    import json

    found = commands.resolve(args)
    return json.dumps(found.as_json(), indent=1) if args.json else found.text()


def _scale(args: argparse.Namespace, face: Face) -> str | None:
    how = "Say which cluster to scale: `lounge scale N --name NAME`."
    cluster = face.cluster(args.name, how)
    if not face.shell:
        follow(cluster)
    cluster.scale_sync(args.n)
    return f"Scaled {cluster.name} to {args.n} engines." if face.shell else None


def _interrupt(args: argparse.Namespace, face: Face) -> str:
    how = "Say which cluster to interrupt: `lounge interrupt NAME`."
    cluster = face.cluster(args.name, how)
    return interrupted(cluster, cluster.interrupt_sync())


def _status(args: argparse.Namespace, face: Face) -> str:
    from .cluster import current
    from .manager import ClusterManager

    manager = ClusterManager()
    if args.name:
        names = [args.name]
    else:  # the shell shows every cluster; the magic its current one
        names = manager.names() if face.shell else [current().name]
    if not names:
        return f"No cluster is running; start one with `{face.prog} start N`."
    return "\n".join(commands.format_status(manager.status(name)) for name in names)


def _list(args: argparse.Namespace, face: Face) -> str:
    from .manager import ClusterManager

    return commands.format_list(ClusterManager().list())


def _nodes(args: argparse.Namespace, face: Face) -> str:
    path, rows = node_rows(args.inventory, args.pool, args.live)
    if args.live and not args.json:
        rows = [commands.node_cells(row) for row in rows]
    columns = commands.LIVE_COLUMNS if args.live else commands.NODE_COLUMNS
    table = commands.format_rows(rows, columns, args.json)
    return table if args.json else f"{path}:\n{table}"


def _sync(args: argparse.Namespace, face: Face) -> str:
    rows = sync_rows(args.inventory, args.pool, args.force)
    return commands.format_rows(rows, commands.SYNC_COLUMNS, args.json)


def _stage(args: argparse.Namespace, face: Face) -> str:
    from . import stage
    from ._loop import run_sync

    if not (args.dir or args.list or args.remove):
        raise LoungeError(
            f"Say which folder to stage, e.g. `{face.prog} stage ~/tissue --name tissue`, or "
            "give --list or --remove NAME."
        )
    backend = _ssh_backend(args.inventory, args.pool)
    nodes = list(backend.nodes.values())
    if args.list:
        rows = run_sync(stage.listing(nodes, backend.reusing_ssh_command))
        return commands.format_rows(rows, stage.LIST_COLUMNS + ["error"], args.json)
    if args.remove:
        rows = run_sync(stage.remove(nodes, backend.reusing_ssh_command, args.remove))
        return commands.format_rows(rows, ["node", "name", "status"], args.json)
    name = args.name or Path(os.path.expanduser(args.dir)).resolve().name
    rows = stage.stage(nodes, backend.reusing_ssh_command, args.dir, name, force=args.force)
    if not any(r["status"] in ("present", "shipped") for r in rows):
        why = "; ".join(f"{r['node']}: {r['status'].removeprefix('failed: ')}" for r in rows)
        raise LoungeError(f"No lounge node has data set {name!r} now ({why}).")
    return commands.format_rows(rows, stage.STAGE_COLUMNS, args.json)


def _stop(args: argparse.Namespace, face: Face) -> str | None:
    from .manager import ClusterManager

    if not args.name and not face.shell:  # the current cluster, through its own handle
        from .cluster import current

        current().stop_sync(forget=args.forget)
        return None
    if not args.name:
        raise LoungeError("Say which cluster to stop: `lounge stop NAME` (see `lounge list`).")
    left = ClusterManager().stop(args.name, forget=args.forget)
    lines = [f"Stopped what was left of it: {line}" for line in left]
    if face.shell:
        lines.append(f"{'Forgot' if args.forget else 'Stopped'} {args.name}.")
    return "\n".join(lines) or None


def _attach(args: argparse.Namespace, face: Face):
    from .cluster import Cluster

    cluster = Cluster.attach(args.name)
    return f"{cluster.name}: {describe(cluster)}" if face.shell else cluster


def _doctor(args: argparse.Namespace, face: Face) -> str:
    from ._loop import run_sync
    from .doctor import COLUMNS, diagnose

    backend = _ssh_backend(args.inventory, args.pool)  # an unknown pool is an error
    if args.node:
        if args.node not in backend.nodes:
            known = ", ".join(backend.nodes)
            raise LoungeError(f"No lounge node {args.node!r} in {backend.inv.path} ({known}).")
        backend.nodes = {args.node: backend.nodes[args.node]}
    rows = run_sync(diagnose(backend, tensorflow=not args.quick))
    return commands.format_rows(rows, COLUMNS, args.json)


def _runs(args: argparse.Namespace, face: Face) -> str:
    from . import runstore

    if args.name:
        try:  # a running cluster's listing also restarts a driver found gone
            found = face.cluster(args.name, "").runs()
        except LoungeError:  # a stopped one: its kept runs
            found = runstore.runs(args.name)
    else:
        found = runstore.runs()
    if not found:
        where = f"cluster {args.name!r}" if args.name else "any cluster"
        return f"No run in {where} yet: `lounge.map(f, items, name=...)` makes one."
    return commands.format_table([commands.run_cells(r) for r in found], commands.RUN_COLUMNS)


def _run(args: argparse.Namespace, face: Face) -> str:
    from . import runstore

    cluster = args.cluster
    if cluster is None and not face.shell:  # the magic: its current cluster's, if it has one
        from .cluster import _current

        if _current is not None and runstore.store_path(_current.name, args.run).exists():
            cluster = _current.name
    run = runstore.run(args.run, cluster)
    if args.cancel:
        return cancel_run(run)
    if args.delete:
        run.delete()
        return f"Deleted run {run.name!r} of {run.cluster!r}."
    if args.wait:
        run.wait(progress=not face.shell)
    lines = [commands.format_table([commands.run_cells(run.summary())], commands.RUN_COLUMNS)]
    if args.csv:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", runstore.PartialResult)  # the table says how far
            df = run.result()
        df.to_csv(args.csv)
        lines.append(f"Wrote {len(df)} rows of {df.attrs['total']} to {args.csv}.")
    return "\n".join(lines)


def follow(cluster) -> None:
    """The magic's launch progress: a panel (in a notebook) or lines, once agents are placed."""
    from .widgets import LaunchProgress

    if not any(isinstance(w, LaunchProgress) for w in cluster._watchers):
        cluster.watch(LaunchProgress(cluster))


# -- sentences of the cluster's data -----------------------------------------------------------
def node_state(row: dict) -> str:
    """A ``nodes_status`` row's status, with why in parentheses: ``in use (ana logged in)``."""
    return f"{row['status']} ({row['why']})" if row.get("why") else row["status"]


def describe(cluster) -> str:
    """``3/4 ready; pc1: running 2/2, pc2: pending (...) 1/2``: where the engines are."""
    return cluster.where_engines_are()


def ran(where: dict) -> str | None:
    """After ``%%lounge``: which engines it could not reach (None: it reached every one)."""
    if where["ran"] >= where["target"]:
        return None
    short = ", ".join(f"{r['node']} {node_state(r)}" for r in where["missing"])
    return f"ran on {where['ran']} of {where['target']} engines; {short}\n"


def cancel_run(run) -> str:
    """Cancel a run unless it has ended; what was done, in one sentence (the faces' and the
    REST API's)."""
    from .runstore import UNDER_WAY

    status = run.summary()["status"]
    if status not in UNDER_WAY:
        return (
            f"Run {run.name!r} of {run.cluster!r} is already {status}: there is nothing to cancel."
        )
    run.cancel()
    return f"Cancelled run {run.name!r} of {run.cluster!r}; its rows so far stay readable."


def interrupted(cluster, count: int) -> str:
    """What an interrupt did, in one sentence (the faces' and the REST API's)."""
    return (
        f"Interrupted {count} engine{'s' if count != 1 else ''} of {cluster.name!r}: "
        f"{cluster.kind.interrupt_note}."
    )


COMMANDS: dict[str, Callable[[argparse.Namespace, Face], object]] = {
    "help": _help,
    "start": _start,
    "scale": _scale,
    "interrupt": _interrupt,
    "status": _status,
    "list": _list,
    "nodes": _nodes,
    "sync": _sync,
    "stage": _stage,
    "stop": _stop,
    "attach": _attach,
    "doctor": _doctor,
    "runs": _runs,
    "run": _run,
    "config": _config,
}


def run(args: argparse.Namespace, face: Face):
    """Do what the parsed command says, in ``face``'s way."""
    return COMMANDS[args.command](args, face)


# -- the work behind the tables ----------------------------------------------------------------
def job_script(cluster) -> str:
    """The batch script a start of ``cluster`` would submit; nothing is submitted, and the
    cluster's folder, made to name the script's paths, is left only if it was there."""
    folder = Path(cluster.dir)
    fresh = not any(folder.iterdir())
    try:
        return cluster.job_script()
    finally:
        if fresh and not any(folder.iterdir()):
            folder.rmdir()


def _ssh_backend(inventory: str | None, pool: str | None):
    from .backends import make_backend

    return make_backend("ssh", inventory=inventory, pool=pool)  # c.SSHBackend applies


def node_rows(inventory: str | None, pool: str | None, live: bool) -> tuple[Path, list[dict]]:
    """The inventory's file and its nodes (of ``pool``): as written there, or, ``live``,
    each node's state asked over SSH now."""
    from ._loop import run_sync

    backend = _ssh_backend(inventory, pool)  # an unknown pool is an error
    if live:
        from .survey import ask_lounge

        return backend.inv.path, run_sync(ask_lounge(backend))
    return backend.inv.path, [r for r in backend.inv.rows() if r["name"] in backend.nodes]


def sync_rows(inventory: str | None, pool: str | None, force: bool) -> list[dict]:
    """Preposition this environment on the lounge's nodes (of ``pool``): one row per node
    saying what happened. Raises when no node has it afterwards."""
    from ._loop import run_sync

    rows = run_sync(_ssh_backend(inventory, pool).sync_env(force=force, progress=True))
    if not any(r["status"] in ("present", "shipped") for r in rows):
        why = "; ".join(f"{r['node']}: {r['status'].removeprefix('failed: ')}" for r in rows)
        raise LoungeError(f"No lounge node has the environment now ({why}).")
    return rows
