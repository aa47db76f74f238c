"""ClusterManager: every cluster on this machine, found through the state files.

No tornado here. The magics and the CLI use the synchronous methods (``list``, ``status``,
``scale``, ``stop``). The Jupyter server extension keeps one manager and uses the async ones
(``summaries``, ``summary``, ``create``, ``patch``, ``remove``, ``nodes``, ``backends``): they
run in the server's loop and never block it (whatever asks a controller or runs a command
goes to a thread), and the manager keeps one Cluster per name so that a refresh reuses its
client instead of connecting again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time

from . import state
from ._loop import run_sync
from .cluster import Cluster, controller_alive, ensure_name_free, in_use, name_in_use
from .errors import LoungeError, NoSuchCluster
from .procs import call, kill_group, started
from .serverext.requests import scale_request, start_request

log = logging.getLogger(__name__)


def connect_code(name: str) -> str:
    """What a notebook cell runs to use the cluster (the sidebar inserts it)."""
    return (
        f'from jupyter_lounge import Lounge\nlounge = Lounge.attach("{name}")\n'
        "client = lounge.client"
    )


class ClusterManager:
    def __init__(self) -> None:
        self._clusters: dict[str, Cluster] = {}  # started or attached here, by name
        self._starting: dict[str, asyncio.Task] = {}  # starts running in this loop
        self._failed: dict[str, tuple[dict, str]] = {}  # a start from here that failed
        self._busy: set[str] = set()  # being scaled or stopped here: not reloaded meanwhile
        self._observing = asyncio.Lock()  # one thread at a time talks to the controllers
        self._machines = None

    # -- synchronous: the magics and the CLI ---------------------------------------------------
    def names(self) -> list[str]:
        return sorted(
            [d["name"] for d in state.list_states()] + [d["name"] for d in state.corrupt_states()]
        )

    def get(self, name: str) -> Cluster:
        return Cluster.attach(name)

    def list(self) -> list[dict]:
        """One summary per cluster; a cluster whose controller died is reported ``dead``, one
        whose state file cannot be read ``corrupt`` (with the file's path)."""
        out = []
        for d in state.list_states():
            status = d["status"] if controller_alive(d) else "dead"
            out.append(
                {
                    "name": d["name"],
                    "engines": d["engines"],
                    "backend": d["backend"],
                    "n": d["n"],
                    "nodes": d["nodes"],
                    "status": status,
                    "age_s": round(time.time() - d["created"], 1),
                    "preload": ",".join(d["preload"]),
                }
            )
        for d in state.corrupt_states():
            out.append(
                {
                    "name": d["name"],
                    "status": "corrupt",
                    "age_s": 0,
                    "preload": "",
                    "note": f"{d['path']} cannot be read: lounge stop {d['name']} --forget",
                }
            )
        return sorted(out, key=lambda row: row["name"])

    def status(self, name: str) -> dict:
        cluster = self.get(name)
        rows = cluster.nodes_status()
        return {
            "name": name,
            "engines": cluster.kind.name,
            "backend": cluster.backend.name,
            "status": cluster.status,
            "ready": sum(r["ready"] for r in rows),
            "target": cluster.n,
            "nodes": rows,
        }

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

    def interrupt(self, name: str) -> str:
        return run_sync(self.get(name).interrupt())

    # -- async: the Jupyter server -------------------------------------------------------------
    async def summaries(self) -> list[dict]:
        """Every cluster: those in the state files (any process's), starts in progress here,
        and failed starts from here (kept until ``remove``), in name order."""
        datas = {d["name"]: d for d in state.list_states()}
        clusters, stale = self._track(datas)
        async with self._observing:
            seen = await asyncio.to_thread(_observe, clusters, stale)
        rows = {name: self._summary(d, *seen.get(name, (0, None))) for name, d in datas.items()}
        for name, cluster in self._clusters.items():
            if name in self._starting and name not in rows:  # its state file comes next
                rows[name] = self._summary(cluster.to_dict(), 0, None)
        for name, (data, error) in self._failed.items():
            rows.setdefault(name, self._summary(data, 0, None, error))
        for bad in state.corrupt_states():
            rows[bad["name"]] = {
                **dict.fromkeys(("engines", "backend", "pending", "preload"), ""),
                **dict.fromkeys(("n", "ready", "target", "nodes", "age_s"), 0),
                "name": bad["name"],
                "status": "corrupt",
                "error": bad["error"],
                "connect_code": "",
            }
        return [rows[name] for name in sorted(rows)]

    async def summary(self, name: str) -> dict:
        """One cluster as in ``summaries``, plus ``nodes_status``: per node agent."""
        row = next((r for r in await self.summaries() if r["name"] == name), None)
        if row is None:
            raise self._missing(name)
        cluster = self._clusters.get(name)
        rows = []
        if cluster is not None and row["status"] not in ("failed", "dead"):
            async with self._observing:
                rows = await asyncio.to_thread(cluster.nodes_status)
        keys = ("node", "status", "ready", "target", "cpu", "mem", "gpu", "users")
        return {**row, "nodes_status": [{k: r.get(k) for k in keys} for r in rows]}

    async def create(self, body: dict) -> str:
        """Check a start request, then start the cluster in this loop; return its name at
        once. A bad request raises a LoungeError before anything is started."""
        options = start_request(body)
        name = options.pop("name") or self._free_name()
        n = options.pop("n")
        cluster = Cluster(n, name=name, stop_at_exit=False, progress=False, wait=False, **options)
        if name in self._starting:  # its state file may not be written yet
            raise name_in_use(name)
        ensure_name_free(name)
        self._failed.pop(name, None)
        old = self._clusters.pop(name, None)  # a dead one of the same name
        if old is not None:
            await asyncio.to_thread(old.disconnect)
        self._clusters[name] = cluster
        self._starting[name] = asyncio.create_task(self._start(cluster))
        return name

    async def _start(self, cluster: Cluster) -> None:
        name = cluster.name
        try:
            await cluster.start()
        except asyncio.CancelledError:  # removed while starting: start() cleaned up
            self._clusters.pop(name, None)
            raise
        except Exception as e:  # noqa: BLE001 - every failure is shown, not raised
            self._clusters.pop(name, None)
            message = str(e) if isinstance(e, LoungeError) else f"{type(e).__name__}: {e}"
            self._failed[name] = (cluster.to_dict(), message)
            log.warning("jupyter_lounge: starting %s failed: %s", name, message)
        finally:
            self._starting.pop(name, None)

    async def patch(self, name: str, body: dict) -> dict:
        """Scale to ``body["n"]`` engines; return the cluster with its new target."""
        n = scale_request(body)
        cluster = self._live(name)
        self._busy.add(name)
        try:
            cluster.reload()
            await cluster.scale(n)
        finally:
            self._busy.discard(name)
        return await self.summary(name)

    async def interrupt_work(self, name: str) -> str:
        """Interrupt the running work on every engine of a running cluster (REST)."""
        cluster = self._live(name)
        cluster.reload()
        return await cluster.interrupt()

    async def remove(self, name: str) -> None:
        """Stop the cluster and return when nothing of it is left (or forget a failed
        start); a start in progress here is cancelled, which stops what it started."""
        task = self._starting.get(name)
        if task is not None:
            task.cancel()
            await asyncio.wait([task], timeout=60)
        found = task is not None or self._failed.pop(name, None) is not None
        try:
            data = state.load_state(name) if state.NAME_RE.match(name) else None
        except state.CorruptState:  # nothing to read: stop what its folder names, forget it
            await forget_unreadable(name)
            return
        if data is not None:
            cluster = self._clusters.get(name)
            if cluster is None or cluster.created != data["created"]:
                cluster = Cluster.from_state(data)
            self._busy.add(name)
            try:
                cluster.reload(data)
                await cluster.stop()
            finally:
                self._busy.discard(name)
                if self._clusters.get(name) is cluster:
                    del self._clusters[name]
            found = True
        if not found:
            raise self._missing(name)

    async def nodes(self) -> list[dict]:
        """This machine, then the lounge inventory's nodes, each with its engines running."""
        return await self._survey().nodes()

    async def backends(self) -> dict:
        """Engine kinds and backends: whether each can be used here and its options."""
        return await self._survey().backends()

    async def close(self) -> None:
        """Cancel starts in progress here and close every client (the clusters run on)."""
        tasks = list(self._starting.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=60)
        clusters = list(self._clusters.values())
        self._clusters.clear()
        async with self._observing:
            await asyncio.to_thread(_observe, {}, clusters)
        if self._machines is not None:
            await self._machines.close()

    # -- helpers -------------------------------------------------------------------------------
    def _survey(self):
        if self._machines is None:
            from .survey import MachineSurvey

            self._machines = MachineSurvey()
        return self._machines

    def _track(self, datas: dict[str, dict]) -> tuple[dict[str, Cluster], list[Cluster]]:
        """One Cluster per live cluster, kept between requests and brought up to date from
        its state file; those whose file is gone (or whose controller died) are dropped, and
        returned so their clients get closed."""
        stale = []
        for name, cluster in list(self._clusters.items()):
            if name in self._starting or name in self._busy:
                continue
            data = datas.get(name)
            if data is None or data["created"] != cluster.created or not controller_alive(data):
                del self._clusters[name]
                stale.append(cluster)
        for name, data in datas.items():
            cluster = self._clusters.get(name)
            if cluster is None and controller_alive(data):
                try:
                    cluster = self._clusters[name] = Cluster.from_state(data)
                except LoungeError as e:  # e.g. its inventory file is gone
                    log.warning("jupyter_lounge: cannot follow %s: %s", name, e)
                    continue
                cluster.progress = False
            elif cluster is not None and name not in self._starting and name not in self._busy:
                cluster.reload(data)
        return dict(self._clusters), stale

    def _summary(self, data: dict, ready: int, pending: str | None, error: str | None = None):
        name, agents = data["name"], data.get("agents") or []
        status, pid = data["status"], data.get("controller_pid")
        # one we are stopping right now
        between = status == "stopping" and name in self._busy
        if error is not None:
            status = "failed"
        elif name in self._starting:
            status = "starting"
        elif not in_use(data) and not between:
            status = "dead"
            error = f"Its controller (pid {pid}) is gone; delete it to clean up what is left."
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
        }

    def _missing(self, name: str) -> NoSuchCluster:
        known = sorted({*self.names(), *self._starting, *self._failed})
        return NoSuchCluster(
            f"No cluster named {name!r} (running: {', '.join(known) or 'none'}); see `lounge list`."
        )

    def _live(self, name: str) -> Cluster:
        """The Cluster to scale: one that runs, or a sentence saying why it cannot."""
        if name in self._failed:
            raise LoungeError(f"Cluster {name!r} failed to start: delete it and start another.")
        if name in self._starting:
            raise LoungeError(f"Cluster {name!r} is still starting: scale it once it runs.")
        data = state.load_state(name) if state.NAME_RE.match(name) else None
        if data is None:
            raise self._missing(name)
        if not controller_alive(data):
            raise LoungeError(
                f"Cluster {name!r} is dead (its controller is gone): delete it and start another."
            )
        cluster = self._clusters.get(name)
        if cluster is None or cluster.created != data["created"]:
            cluster = self._clusters[name] = Cluster.from_state(data)
            cluster.progress = False
        return cluster

    def _free_name(self) -> str:
        taken = {*self.names(), *self._starting, *self._failed}
        i = 1
        while f"lounge-{i}" in taken:
            i += 1
        return f"lounge-{i}"


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


def _observe(clusters: dict[str, Cluster], stale: list[Cluster]) -> dict[str, tuple]:
    """(blocking: run in a thread) Close the clients of ``stale``; (engines registered,
    Slurm pending reason or None) of each of ``clusters``."""
    for cluster in stale:
        cluster.disconnect()
    seen = {}
    for name, cluster in clusters.items():
        try:
            ready = len(cluster.registered())
        except Exception:  # noqa: BLE001 - a controller going away while we ask
            ready = 0
        pending = None
        for agent in list(cluster.agents):
            try:
                how, why = cluster.backend.agent_state(agent)
            except LoungeError:
                continue
            if how == "pending":
                pending = why
                break
        seen[name] = (ready, pending)
    return seen
