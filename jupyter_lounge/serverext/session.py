"""The Jupyter server's session: the clusters the sidebar sees and starts, in the server's loop.

Async, and never blocking the loop: whatever asks a controller or runs a command goes to a
thread. It keeps one Cluster per name so that a refresh reuses its client instead of
connecting again, runs the starts it was asked for as tasks (a failed one is kept, with its
error, until it is deleted), and lists every cluster in the registry's one ``summary`` shape.
"""

from __future__ import annotations

import asyncio
import logging

from .. import runner, runstore, state
from ..cluster import Cluster, controller_alive, ensure_name_free, name_in_use
from ..errors import LoungeError, NoSuchCluster
from ..manager import corrupt_summary, forget_unreadable, names, summary
from . import requests

log = logging.getLogger(__name__)


class ServerSession:
    def __init__(self) -> None:
        self._clusters: dict[str, Cluster] = {}  # started or attached here, by name
        self._starting: dict[str, asyncio.Task] = {}  # starts running in this loop
        self._failed: dict[str, tuple[dict, str]] = {}  # a start from here that failed
        self._busy: set[str] = set()  # being scaled or stopped here: not reloaded meanwhile
        self._observing = asyncio.Lock()  # one thread at a time talks to the controllers
        self._machines = None

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
            rows[bad["name"]] = corrupt_summary(bad)
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
        keys = ("node", "status", "why", "ready", "target", "error", "cpu", "mem", "gpus", "users")
        return {**row, "nodes_status": [{k: r.get(k) for k in keys} for r in rows]}

    async def create(self, body: dict) -> str:
        """Check a start request, then start the cluster in this loop; return its name at
        once. A bad request raises a LoungeError before anything is started."""
        options = requests.start_request(body)
        name = options.pop("name") or self._free_name()
        n = options.pop("n")
        cluster = Cluster(n, name=name, stop_at_exit=False, wait=False, **options)
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
        n = requests.scale_request(body)
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
        from ..faces import interrupted

        cluster = self._live(name)
        cluster.reload()
        return interrupted(cluster, await cluster.interrupt())

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

    async def runs(self, name: str) -> list[dict]:
        """The cluster's runs, oldest first, as ``lounge runs NAME`` lists them (a run whose
        driver is gone gets it started again, so listing resumes it)."""
        self._has_runs_or_state(name)
        return await asyncio.to_thread(runner.runs, name)

    async def run(self, name: str, run: str) -> dict:
        """One run's summary."""
        self._has_runs_or_state(name)
        return await asyncio.to_thread(lambda: runstore.Run(name, run).summary())

    async def cancel_run(self, name: str, run: str) -> str:
        """Cancel a run (its rows so far stay); the sentence saying so."""
        self._has_runs_or_state(name)
        return await asyncio.to_thread(_cancel_run, name, run)

    async def delete_run(self, name: str, run: str) -> None:
        """Remove an ended run and its rows (a LoungeError while it runs)."""
        self._has_runs_or_state(name)
        await asyncio.to_thread(lambda: runstore.Run(name, run).delete())

    async def nodes(self) -> list[dict]:
        """This machine, then the lounge inventory's nodes, each with its engines running."""
        return await self._survey().nodes()

    async def backends(self, profile: str | None = None) -> dict:
        """Engine kinds and backends: whether each can be used here and its options; and
        the defaults of a start here (of ``profile``'s set), each with where it came from."""
        from .. import defaults

        found = await asyncio.to_thread(defaults.for_rest, profile)  # reads files
        return {**await self._survey().backends(), **found}

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
            from ..survey import MachineSurvey

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
            elif cluster is not None and name not in self._starting and name not in self._busy:
                cluster.reload(data)
        return dict(self._clusters), stale

    def _summary(self, data: dict, ready: int, pending: str | None, error: str | None = None):
        """The registry's ``summary``, with what only this session knows: its own starts (under
        way, or failed) and the clusters it is stopping right now."""
        name = data["name"]
        if error is not None:
            return summary(data, ready=ready, pending=pending, error=error, status="failed")
        if name in self._starting:
            return summary(data, ready=ready, pending=pending, status="starting", alive=True)
        between = data["status"] == "stopping" and name in self._busy
        return summary(data, ready=ready, pending=pending, alive=True if between else None)

    def _missing(self, name: str) -> NoSuchCluster:
        known = sorted({*names(), *self._starting, *self._failed})
        return NoSuchCluster(
            f"No cluster named {name!r} (running: {', '.join(known) or 'none'}); see `lounge list`."
        )

    def _has_runs_or_state(self, name: str) -> None:
        """A 404 unless the cluster is known here or its folder keeps runs (it was stopped)."""
        known = name in self._starting or name in self._failed or name in names()
        if not known and not (
            state.NAME_RE.match(name) and runstore.runs_dir(name, make=False).is_dir()
        ):
            raise self._missing(name)

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
        return cluster

    def _free_name(self) -> str:
        taken = {*names(), *self._starting, *self._failed}
        i = 1
        while f"lounge-{i}" in taken:
            i += 1
        return f"lounge-{i}"


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


def _cancel_run(name: str, run: str) -> str:
    """(blocking) Cancel the run unless it has ended; what was done, in one sentence."""
    from ..faces import cancel_run

    return cancel_run(runstore.Run(name, run))
