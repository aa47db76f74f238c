"""The registry: every cluster on this machine, found through the state files.

Synchronous, no tornado: the magics and the CLI use ``ClusterManager`` (``list``, ``status``,
``scale``, ``interrupt``, ``stop``); the Jupyter server's session (``serverext/session.py``)
uses the same ``summary`` shape for every cluster, so ``lounge list`` and ``GET clusters``
say the same things. Each cluster carries its runs (``runstore``), oldest first.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import time

from . import runstore, state
from ._loop import run_sync
from .cluster import Cluster, in_use
from .errors import LoungeError, NoSuchCluster
from .procs import call, kill_group, started


def connect_code(name: str) -> str:
    """What a notebook cell runs to use the cluster (the sidebar inserts it)."""
    return (
        f'from jupyter_lounge import Lounge\nlounge = Lounge.attach("{name}")\n'
        "client = lounge.client"
    )


def cluster_runs(name: str) -> list[dict]:
    """The summaries of a cluster's runs, oldest first; none when its run store cannot be
    read, so that listing the clusters never fails because of one."""
    try:
        return runstore.runs(name)
    except (LoungeError, OSError, sqlite3.Error):
        return []


def summary(
    data: dict,
    *,
    ready: int | None = None,
    pending: str | None = None,
    error: str | None = None,
    status: str | None = None,
    alive: bool | None = None,
) -> dict:
    """One cluster as every face lists it, from its state: ``ready`` engines (None when the
    controller was not asked), the Slurm ``pending`` reason, an ``error``; a cluster whose
    controller is gone, and whose start is not under way (``alive``: known to be), is
    ``dead``."""
    name, agents = data["name"], data.get("agents") or []
    status = status or data["status"]
    if error is None and not (in_use(data) if alive is None else alive):
        status = "dead"
        error = (
            f"Its controller (pid {data.get('controller_pid')}) is gone: stop it (`lounge stop "
            f"{name}`, or Delete in the sidebar) to clean up what is left."
        )
    return {
        "name": name,
        "engines": data["engines"],
        "backend": data["backend"],
        "status": status,
        "n": data["n"],
        "ready": ready if status in ("running", "starting") else 0,
        "target": data["n"],
        "nodes": len({a.get("node") or a["key"] for a in agents}) or data.get("nodes") or 1,
        "age_s": round(time.time() - data["created"], 1),
        "preload": ",".join(data["preload"]),
        "pending": pending,
        "error": error,
        "connect_code": connect_code(name),
        "runs": cluster_runs(name),
        "driver": driver_state(data) if status == "running" else None,
    }


def driver_state(data: dict) -> str:
    """``running``, or ``lost``: the cluster's run driver (runner.py) is gone. Following a
    run, listing the runs or the next map starts it again, and it resumes the runs."""
    from . import runner

    try:
        return "running" if runner.alive(data["name"]) else "lost"
    except LoungeError:
        return "lost"


def corrupt_summary(bad: dict) -> dict:
    """A state file that cannot be read (``state.corrupt_states``), in the same shape."""
    return {
        **dict.fromkeys(("engines", "backend", "preload"), ""),
        **dict.fromkeys(("n", "ready", "target", "nodes", "age_s"), 0),
        "name": bad["name"],
        "status": "corrupt",
        "pending": None,
        "error": bad["error"],
        "connect_code": "",
        "runs": cluster_runs(bad["name"]),
        "driver": None,
    }


def names() -> list[str]:
    """Every cluster's name, readable state file or not."""
    return sorted(
        [d["name"] for d in state.list_states()] + [d["name"] for d in state.corrupt_states()]
    )


class ClusterManager:
    """The clusters of this machine, for the magics and the CLI (synchronous)."""

    def names(self) -> list[str]:
        return names()

    def get(self, name: str) -> Cluster:
        return Cluster.attach(name)

    def list(self) -> list[dict]:
        """Every cluster's ``summary``, in name order, without asking any controller: one
        whose controller died is ``dead``, one whose state file cannot be read ``corrupt``
        (its error names the file and how to remove it)."""
        rows = [summary(d) for d in state.list_states()]
        rows += [corrupt_summary(bad) for bad in state.corrupt_states()]
        return sorted(rows, key=lambda row: row["name"])

    def status(self, name: str) -> dict:
        """The cluster's ``summary``, asked of its controller now, with ``nodes_status``: one
        row per node agent."""
        cluster = self.get(name)
        rows = cluster.nodes_status()
        row = summary(cluster.to_dict(), ready=sum(r["ready"] for r in rows))
        return {**row, "nodes_status": rows}

    def stop(self, name: str, forget: bool = False) -> list[str]:
        """Stop a cluster; with ``forget``, also remove one whose state file is corrupt (its
        processes and Slurm jobs found by its folder). Returns what ``forget`` stopped."""
        try:
            data = state.load_state(state.check_name(name))
        except state.CorruptState:
            if not forget:
                raise
            return run_sync(forget_unreadable(name))
        if data is None:
            known = ", ".join(self.names()) or "none"
            raise NoSuchCluster(f"No cluster named {name!r} to stop (running: {known}).")
        run_sync(Cluster.from_state(data).stop(forget=forget))
        return []

    def scale(self, name: str, n: int) -> None:
        run_sync(self.get(name).scale(n))

    def interrupt(self, name: str) -> int:
        """Interrupt the running work of cluster ``name``; how many engines ran it."""
        return run_sync(self.get(name).interrupt())


async def forget_unreadable(name: str) -> list[str]:
    """Remove a cluster whose state file cannot be read, and stop what is left of it without
    knowing its pids: every process of ours whose command line names the cluster's folder
    (controller, agents, relays, keeper) and every Slurm job of ours whose script lies there.
    Returns what was stopped, one line each."""
    import psutil

    folder = str(state.lounge_dir() / state.check_name(name))
    stopped = []
    for proc in psutil.process_iter(["pid", "cmdline", "uids"]):
        try:
            if proc.info["uids"].real != os.getuid() or proc.pid == os.getpid():
                continue
            args = proc.info["cmdline"] or []
            if any(a == folder or folder + "/" in a for a in args):
                pgid = os.getpgid(proc.pid)
                stopped.append(f"process {proc.pid}: {' '.join(args)[:100]}")
                if pgid == proc.pid:  # a leader: its group too (ipyparallel's schedulers)
                    await kill_group(proc.pid, started(proc.pid), grace=3.0)
                else:
                    proc.kill()
        except (psutil.Error, ProcessLookupError, OSError):
            continue
    if shutil.which("squeue"):
        try:
            out = await call(["squeue", "--me", "-h", "-o", "%i|%o"], timeout=30)
        except LoungeError:
            out = ""
        jobs = [
            line.split("|")[0]
            for line in out.splitlines()
            if line.partition("|")[2].startswith(folder + "/")
        ]
        if jobs:
            await call(["scancel", *jobs], timeout=30)
            stopped += [f"Slurm job {job}" for job in jobs]
    state.remove_state(name)
    return stopped
