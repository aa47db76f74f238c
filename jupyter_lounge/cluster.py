"""Cluster: one controller plus node agents and their engines, with a name and a state file.

Async-first (``await lounge.start()``), with ``*_sync`` twins that work inside a running
kernel loop. ``scale`` edits the desired ranks and reconciles; ``map`` spreads work over the
engines and returns a DataFrame.
"""

from __future__ import annotations

import asyncio
import atexit
import math
import os
import time
import uuid
from pathlib import Path
from typing import Any

from . import protocol, runner, runstore, state, validate
from ._loop import run_sync
from .backends import make_backend
from .config import DEFAULT_BACKEND, DEFAULT_ENGINES, DEFAULT_TIMEOUT, settings
from .engines import engine_kind
from .errors import LoungeError, LoungeTimeout, NoSuchCluster
from .paths import make_socket_dir, remove_socket_dir
from .procs import kill_group, ours, spawn, started, tail

_current: Cluster | None = None


def current() -> Cluster:
    """The cluster most recently started or attached in this process."""
    if _current is None:
        raise LoungeError("No cluster in this process yet: start one with `%lounge start N`.")
    return _current


#: The controller's heartbeat pings per second it is sized for: 256 engines at 150 ms. An
#: engine's death is told by its node (the nanny, or its closed connection), a lost node by
#: its SSH session, report or Slurm job (see mapping's look): the heartbeat is a last resort
#: and must not load the controller as engines are added (1,024 at 150 ms: 31% of a core).
HEARTBEAT_PINGS_PER_S = 256 / 0.150
HEARTBEAT_MIN_MS = 150


def heartbeat_for(engines: int) -> int:
    """The ipyparallel controller's heartbeat period (ms) for a cluster of ``engines``:
    150 ms up to 256 engines, then as long as keeps about 1,700 pings a second (1,024: 600 ms,
    4,096: 2.4 s). The hub counts a new engine at its next beat, so short is quick to start."""
    return max(HEARTBEAT_MIN_MS, math.ceil(1000 * engines / HEARTBEAT_PINGS_PER_S))


class Cluster:
    def __init__(
        self,
        n: int = 1,
        *,
        name: str | None = None,
        engines: str = DEFAULT_ENGINES,
        backend: str = DEFAULT_BACKEND,
        preload: list[str] | str = (),
        nodes: int | None = None,
        wait: bool = False,
        timeout: float = DEFAULT_TIMEOUT,
        restart: bool = True,
        gpus: list[str] | None = None,
        engines_per_gpu: int = 1,
        heartbeat_ms: int | None = None,
        tls: bool = True,
        dashboard: bool = False,
        courtesy: dict | bool | None = None,
        stage: dict | list | str | None = None,
        stop_at_exit: bool = True,
        **backend_options,
    ):
        limits = settings()
        self.n = validate.count(n, "The number of engines", limits.max_engines)
        self.nodes = None
        if nodes is not None:
            self.nodes = validate.count(nodes, "The number of nodes", limits.max_engines)
            if self.nodes > self.n:
                raise LoungeError(
                    f"{self.nodes} nodes for {self.n} engines would leave nodes empty: ask for "
                    f"at most {self.n} nodes."
                )
        self.kind = engine_kind(engines)
        self.backend = make_backend(backend, **backend_options)
        if isinstance(preload, str):
            preload = [m for m in preload.split(",") if m.strip()]
        self.preload = validate.module_names([m.strip() for m in preload])
        self._auto_name = not name
        self.name = state.check_name(name) if name else self._free_name()
        self.wait, self.restart = wait, restart
        self.timeout = validate.seconds(timeout, "The timeout", limits.max_timeout)
        self.gpus = (
            None if gpus is None else [str(g) for g in gpus]
        )  # None: each node finds its own
        self.engines_per_gpu = engines_per_gpu
        self.heartbeat_ms = int(heartbeat_ms or heartbeat_for(self.n))
        self.tls = bool(tls)
        if not self.tls and self.backend.name != "local":
            raise LoungeError(
                f"--no-tls is allowed only with --backend local: on {self.backend.name} the "
                "engines talk to the controller across machines, always encrypted."
            )
        if dashboard and self.kind.name != "dask":
            raise LoungeError("--dashboard is Dask's: add --engines dask, or leave it out.")
        self.dashboard = bool(dashboard)
        self.courtesy = _courtesy_policy(courtesy)
        self.stage = _stage_option(stage)  # data set name -> its folder here
        self.stop_at_exit = stop_at_exit
        self.agents: list[dict] = []
        self.controller_pid: int | None = None
        self.controller_start: str | None = None  # tells the controller from a later pid twin
        self.socket_dir: str | None = None  # a local cluster's private folder of Unix sockets
        self.starter: list | None = None  # (pid, start) of the process starting it
        self.keeper: list | None = None  # (pid, start) of the process that stops it if the
        # process that started it dies (see keeper.py)
        self.next_rank = 0
        self.next_alloc = 0
        self.created = time.time()
        self.status = "new"
        self._client = None
        self._watchers: list = []  # callables(cluster, event): how the faces follow it

    # -- events ------------------------------------------------------------------------------
    def watch(self, callback) -> None:
        """Call ``callback(cluster, event)`` on each event: ``"placed"`` (agents were placed or
        given new ranks: a start or a scale; engines are on their way), ``"running"``
        (started), ``"waiting"`` (for its engines, before a cell runs on them), ``"stopped"``.
        The faces follow a cluster this way (the magic's launch progress); the cluster itself
        shows nothing."""
        self._watchers.append(callback)

    def _emit(self, event: str) -> None:
        for callback in list(self._watchers):
            try:
                callback(self, event)
            except Exception:  # noqa: BLE001 - a face that fails must not fail the cluster
                pass

    # -- persistence ---------------------------------------------------------------------------
    @property
    def dir(self) -> Path:
        return state.cluster_dir(self.name)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "engines": self.kind.name,
            "backend": self.backend.name,
            "backend_options": self.backend.options,
            "n": self.n,
            "nodes": self.nodes,
            "preload": self.preload,
            "status": self.status,
            "agents": self.agents,
            "controller_pid": self.controller_pid,
            "controller_start": self.controller_start,
            "socket_dir": self.socket_dir,
            "starter": self.starter,
            "keeper": self.keeper,
            "next_rank": self.next_rank,
            "next_alloc": self.next_alloc,
            "created": self.created,
            "gpus": self.gpus,
            "engines_per_gpu": self.engines_per_gpu,
            "restart": self.restart,
            "heartbeat_ms": self.heartbeat_ms,
            "timeout": self.timeout,
            "tls": self.tls,
            "dashboard": self.dashboard,
            "courtesy": self.courtesy,
            "stage": self.stage,
        }

    def save(self) -> None:
        state.save_state(self.name, self.to_dict())

    @classmethod
    def attach(cls, name: str) -> Cluster:
        """The running cluster called ``name``, started by this or any other process."""
        data = state.load_state(state.check_name(name))  # a corrupt file says so
        if data is None:
            known = ", ".join(d["name"] for d in state.list_states()) or "none"
            raise NoSuchCluster(f"No cluster named {name!r} (running: {known}); see `lounge list`.")
        self = cls.from_state(data)
        global _current
        _current = self
        return self

    @classmethod
    def from_state(cls, data: dict) -> Cluster:
        """A handle on the cluster a state file describes (no client is connected yet)."""
        self = cls(
            data["n"],
            name=data["name"],
            engines=data["engines"],
            backend=data["backend"],
            preload=data["preload"],
            nodes=data["nodes"],
            gpus=data["gpus"],
            engines_per_gpu=data["engines_per_gpu"],
            restart=data["restart"],
            heartbeat_ms=data["heartbeat_ms"],
            timeout=data["timeout"],
            tls=data["tls"],
            dashboard=data.get("dashboard", False),
            courtesy=data.get("courtesy"),
            stage=data.get("stage"),
            stop_at_exit=False,
            **data.get("backend_options", {}),
        )
        self.created = data["created"]
        self.reload(data)
        return self

    def reload(self, data: dict | None = None) -> None:
        """Take on what the state file says now (another process may have scaled it)."""
        data = data or state.load_state(self.name)
        if data is None or data["created"] != self.created:
            return  # gone, or another cluster of the same name: nothing of ours to read
        self.n, self.status = data["n"], data["status"]
        self.agents, self.controller_pid = data["agents"], data["controller_pid"]
        self.controller_start = data.get("controller_start")
        self.socket_dir = data.get("socket_dir")
        self.starter, self.keeper = data.get("starter"), data.get("keeper")
        self.next_rank, self.next_alloc = data["next_rank"], data.get("next_alloc", 1)

    @staticmethod
    def _free_name() -> str:
        taken = {d["name"] for d in state.list_states()}
        taken |= {d["name"] for d in state.corrupt_states()}
        i = 1
        while f"lounge-{i}" in taken:
            i += 1
        return f"lounge-{i}"

    # -- start ---------------------------------------------------------------------------------
    async def start(self) -> Cluster:
        self._claim_name()
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise
        global _current
        _current = self
        if self.stop_at_exit:
            atexit.register(self._stop_at_exit)
        return self

    def _claim_name(self) -> None:
        """Check the name is free and write the first state, under the lounge's lock: of two
        starts of one name at once, one wins and the other is told the name is in use."""
        with state.names_locked():
            if self._auto_name:
                self.name = self._free_name()
            elif ensure_name_free(self.name) is not None:
                # a stale file from a cluster that died; its runs stay readable
                state.remove_state(self.name, keep_runs=True)
            self.status = "starting"
            self.starter = [os.getpid(), started(os.getpid())]
            self.save()

    async def _start(self) -> None:
        cdir = self.dir
        log = cdir / "controller.log"
        listen = await asyncio.to_thread(self.backend.listen_address)  # may ask sinfo or DNS
        if self.kind.local_sockets and self.tls and self.backend.name == "local":
            from .engines import unix_comm

            if unix_comm.available():  # else loopback TCP with TLS, as on other machines
                self.socket_dir = make_socket_dir()
        cmd = self.kind.controller_command(
            cdir,
            listen,
            {
                "heartbeat_ms": self.heartbeat_ms,
                "tls": self.tls,
                "dashboard": self.dashboard,
                "socket_dir": self.socket_dir,
            },
        )
        self.controller_pid = spawn(cmd, log).pid
        self.controller_start = started(self.controller_pid)
        self.save()
        if self.stop_at_exit:
            self._spawn_keeper()
        runner.ensure(self.name)  # the run driver: it waits for the first map
        await self._place(self.n, self.nodes)
        self._emit("placed")
        files = self.kind.connection_files(cdir)  # engines' and client's (may be one file)
        await self._wait_for(
            lambda: all(protocol.read_json(f) for f in files),
            30,
            "the controller to write its connection files",
            check=self._check_controller,
        )
        for f in files:
            f.chmod(0o600)
        self._client = await asyncio.to_thread(self.kind.connect, cdir, 30)
        await self.wait_for_engines(None if self.wait else 1, self.timeout)
        self.status = "running"
        self.save()
        self._emit("running")

    def _spawn_keeper(self) -> None:
        """A small process that stops this cluster if the process starting it (a kernel) dies,
        even by SIGKILL: a cluster started in a notebook leaves no orphans."""
        import sys

        me = self.starter or [os.getpid(), started(os.getpid())]
        cmd = [
            sys.executable,
            "-m",
            "jupyter_lounge.keeper",
            str(self.dir),
            str(me[0]),
            str(me[1]),
            repr(self.created),
        ]
        proc = spawn(cmd, self.dir / "keeper.log")
        self.keeper = [proc.pid, started(proc.pid)]
        self.save()

    async def _place(self, count: int, nodes: int | None) -> None:
        """Place the agents for ``count`` more engines (one allocation) and start them."""
        cdir = self.dir
        alloc, agents = self.next_alloc, []
        self.next_alloc += 1
        planned = self.backend.plan(count, nodes)
        staged = {}  # what the agents' specs say of the data sets (each backend its way)
        if self.stage:
            names = sorted({node for node, _ in planned if node})
            staged = await self.backend.stage_data(self.stage, names, cdir)
        for task, (node, k) in enumerate(planned):
            ranks = list(range(self.next_rank, self.next_rank + k))
            self.next_rank += k
            key = f"{alloc}.{task}"
            files = {
                f: str(cdir / f"agent-{key}.{f}") for f in ("spec", "control", "report", "log")
            }
            protocol.write_control(files["control"], protocol.Control(ranks=ranks, size=self.n))
            protocol.write_spec(files["spec"], self._agent_spec(key, node, files, staged))
            agents.append(
                {
                    "key": key,
                    "alloc": alloc,
                    "task": task,
                    "node": node,
                    "ranks": ranks,
                    "files": files,
                }
            )
        self.agents += agents
        self.save()
        await self.backend.place(agents, cdir, self.name)
        self.save()

    def _agent_spec(
        self, key: str, node: str | None, files: dict, staged: dict | None = None
    ) -> protocol.Spec:
        cdir = self.dir
        return protocol.Spec(
            cluster=self.name,
            key=key,
            node=node,
            engine_kind=self.kind.name,
            preload=self.preload,
            connection_file=str(self.kind.connection_files(cdir)[0]),
            control_file=files["control"],
            report_file=files["report"],
            gpus=self.gpus,
            engines_per_gpu=self.engines_per_gpu,
            restart=self.restart,
            connect_timeout=max(60, self.timeout),
            courtesy=self.courtesy or self.backend.courtesy_for(node),
            engine_options={
                "profile_dir": str(cdir / "profile"),
                "local_directory": str(cdir / "dask-worker-space"),
                "tls_dir": str(cdir) if self.tls else None,
                "dashboard": self.dashboard,
            },
            **self.backend.spec_for(node),
            **(staged or {}),
        )

    # -- waiting -------------------------------------------------------------------------------
    def _controller_alive(self) -> bool:
        return ours(self.controller_pid, self.controller_start)

    def _check_controller(self) -> None:
        if not self._controller_alive():
            raise LoungeError(
                f"The {self.kind.name} controller of {self.name!r} exited: "
                f"{tail(self.dir / 'controller.log', 3) or 'no output'}"
            )

    def _check_agents(self) -> None:
        for a in self.agents:
            report = _report(a)
            if report is not None and report.status == "failed":
                raise LoungeError(report.error or f"node agent {a['key']} failed")
            how, why = self.backend.agent_state(a)
            if how == "lost":
                log = tail(a["files"]["log"], 3)
                where = self._node_label(a, report)
                if report is None and self.status == "starting" and self.backend.may_skip_nodes:
                    self._skip(a, f"{why}" + (f" ({log})" if log else ""))
                    continue
                raise LoungeError(
                    (
                        f"The node agent on {where} is gone: {why}."
                        if report is not None
                        else f"The node agent {where} of {self.name!r} never started: {why}."
                    )
                    + (f" Its log ends: {log}" if log else "")
                )

    def _skip(self, agent: dict, why: str) -> None:
        """Start without a node that could not be reached (the lounge, unless --strict)."""
        import warnings

        self.agents.remove(agent)
        self.n -= len(agent["ranks"])
        if not self.agents:
            raise LoungeError(
                f"No lounge node could be reached; the last: {agent['node']} ({why})."
            )
        warnings.warn(f"Lounge node {agent['node']!r} skipped: {why}.", stacklevel=2)
        self.save()

    @staticmethod
    def _node_label(agent: dict, report: protocol.Report | None) -> str:
        return agent.get("node") or (report and report.node) or f"agent {agent['key']}"

    async def _wait_for(self, ready, timeout: float, what: str, check=None) -> None:
        def look() -> bool:
            if ready():
                return True
            if check:
                check()
            self._check_agents()
            return False

        deadline = time.monotonic() + timeout
        # Each look asks the controller or the backend (squeue): in a thread, so the loop
        # that awaits this (a kernel's, or the Jupyter server's) stays free meanwhile.
        while not await asyncio.to_thread(look):
            if time.monotonic() > deadline:
                raise LoungeTimeout(
                    f"Timed out after {timeout:g} s waiting for {what} of "
                    f"cluster {self.name!r} ({self.where_engines_are()}); raise "
                    f"--timeout or read the logs in {self.dir}."
                )
            await asyncio.sleep(0.05)

    def where_engines_are(self) -> str:
        """``3/4 ready; pc1: running 2/2, pc2: pending (why) 1/2``: engines ready per node
        agent and each agent's status, for a timeout's sentence and the faces."""
        try:
            rows = self.nodes_status()
        except Exception:  # noqa: BLE001 - the sentence must not fail
            return "status unknown"
        ready = sum(r["ready"] for r in rows)
        per_node = ", ".join(
            f"{r['node']}: {r['status']}{f' ({why})' if (why := r['why']) else ''} "
            f"{r['ready']}/{r['target']}"
            for r in rows
        )
        return f"{ready}/{self.n} ready; {per_node}"

    async def wait_for_engines(self, n: int | None = None, timeout: float | None = None) -> None:
        """Return once ``n`` engines (default: all wanted, however many that is by then: a
        node skipped meanwhile lowers it) are registered."""
        await self._wait_for(
            lambda: len(self.registered()) >= (self.n if n is None else n),
            timeout or self.timeout,
            f"{self.n if n is None else n} engine{'s' if (n or self.n) != 1 else ''} to register",
            check=self._check_controller,
        )

    # -- observing -----------------------------------------------------------------------------
    @property
    def client(self) -> Any:
        """The stock ``ipyparallel.Client`` or ``distributed.Client`` of this cluster."""
        if self._client is None:
            if not self._controller_alive():
                raise LoungeError(
                    f"Cluster {self.name!r} has no running controller; start it again."
                )
            self._client = self.kind.connect(self.dir, 30)
        return self._client

    def disconnect(self) -> None:
        """Close this process's client (blocking); the cluster itself keeps running."""
        client, self._client = self._client, None
        if client is not None:
            try:
                self.kind.close(client)
            except Exception:  # noqa: BLE001 - a client to a controller that is gone
                pass

    def registered(self) -> list[tuple[str, int]]:
        """(node, rank) of every engine the controller has registered now; none before the
        controller is connected or after it is gone."""
        if not self._controller_alive() or (self._client is None and self.status != "running"):
            return []
        return self.kind.registered(self.client)

    def nodes_status(self) -> list[dict]:
        """Per node agent: its node, status (and ``why``: a pending job's reason, what made a
        PC in use), engines ready and wanted, the agent's ``pid`` or Slurm ``job``, ``error``,
        the node's ``cpu``/``mem`` percent, ``gpus`` and ``users``, the agent's own memory
        (``agent_mib``), and ``launch``: seconds per launch phase. Data only: the faces render
        it."""
        ranks = {rank for _, rank in self.registered()}  # ranks are unique in a cluster
        rows = []
        self.absorb_retired()
        for a in self.agents:
            report = _report(a) or protocol.Report()
            node = self._node_label(a, report)
            status, error = report.status, report.error
            why = (report.courtesy or {}).get("reason") if status == "in use" else None
            seen = report.telemetry or {}
            how, said = self.backend.agent_state(a)
            if how == "pending":
                status, why = "pending", said
            elif how == "lost" and status != "failed":  # "stopped" by anyone but us is lost too
                status, error = "lost", error or said
            rows.append(
                {
                    "node": node,
                    "status": status,
                    "why": why or None,
                    "ready": len(ranks.intersection(a["ranks"])),
                    "target": len(a["ranks"]),
                    "pid": a.get("pid"),
                    "job": a.get("job"),
                    "error": error,
                    "cpu": seen.get("cpu_percent"),
                    "mem": seen.get("memory_percent"),
                    "users": list(seen.get("users", [])),
                    "gpus": list(seen.get("gpus", [])),
                    "agent_mib": seen.get("agent_mib"),  # small while it rests (in use)
                    "launch": [list(t) for t in report.timings],
                }
            )
        return rows

    def absorb_retired(self) -> None:
        """Lower the target by every engine shut down on purpose (``rc.shutdown``, ``%px
        exit``): its agent reports it "retired" and does not replace it."""
        if self.status != "running":
            return
        retired = 0
        for a in self.agents:
            engines = (_report(a) or protocol.Report()).engines
            gone = [r for r in a["ranks"] if engines.get(str(r), {}).get("state") == "retired"]
            for rank in gone:
                a["ranks"].remove(rank)
            retired += len(gone)
        if retired:
            self.n -= retired
            _best_effort(self.save)

    def engines(self) -> list[dict]:
        """Per engine, as its node agent reports it: rank, node, pid, state, restarts, and
        whether the controller has it registered now."""
        registered = {rank for _, rank in self.registered()}
        rows = []
        for a in self.agents:
            report = _report(a) or protocol.Report()
            node = self._node_label(a, report)
            lost = self.backend.agent_state(a)[0] == "lost"
            for rank, e in sorted(report.engines.items(), key=lambda kv: int(kv[0])):
                rows.append(
                    {
                        "rank": int(rank),
                        "node": node,
                        "pid": e.get("pid"),
                        "state": "lost" if lost and e.get("state") == "running" else e.get("state"),
                        "restarts": e.get("restarts", 0),
                        "registered": int(rank) in registered,
                    }
                )
        return rows

    def __repr__(self) -> str:
        return f"<Lounge {self.name!r} {self.kind.name} on {self.backend.name}: {self.status}>"

    # -- scale and stop ------------------------------------------------------------------------
    async def scale(self, n: int) -> None:
        """Want ``n`` engines: fork the missing ones or stop the extra ones (idempotent)."""
        n = validate.count(n, "The number of engines", settings().max_engines)
        self._refresh()
        self.absorb_retired()
        self.n = n
        have = sorted((r, i) for i, a in enumerate(self.agents) for r in a["ranks"])
        for rank, i in have[n:]:
            self.agents[i]["ranks"].remove(rank)
        missing = n - len(have)
        if missing > 0 and self.backend.grows_in_place:
            usable = [a for a in self.agents if self.backend.agent_state(a)[0] != "lost"]
            if not usable:
                raise LoungeError(
                    f"Every node agent of {self.name!r} is lost, so no engine can be added: "
                    f"see `lounge status {self.name}`, then stop it and start another."
                )
            for _ in range(missing):  # to the live agents with the fewest engines
                smallest = min(usable, key=lambda a: len(a["ranks"]))
                smallest["ranks"].append(self.next_rank)
                self.next_rank += 1
        for a in self.agents:
            protocol.write_control(a["files"]["control"], protocol.Control(a["ranks"], n))
            await self.backend.nudge(a)
        if missing > 0 and not self.backend.grows_in_place:
            await self._place(missing, None)  # a further allocation, never one per engine
        await self._release_empty()
        self.save()
        self._emit("placed")

    async def interrupt(self) -> int:
        """Interrupt the running work on every engine; the cluster keeps running. Returns
        how many engines were running (and so were interrupted)."""
        self._refresh()
        self.absorb_retired()
        token = uuid.uuid4().hex  # each interrupt is new to every agent, whatever came before
        for a in self.agents:
            control = protocol.Control(a["ranks"], self.n, interrupt=token)
            protocol.write_control(a["files"]["control"], control)
            await self.backend.nudge(a)
        return sum(1 for e in self.engines() if e["state"] == "running")

    def _refresh(self) -> None:
        """Before changing a running cluster: take on what its state file says now (another
        process may have scaled it), or say it is not running."""
        try:
            data = state.load_state(self.name)
        except state.CorruptState:
            data = None
        if data is None or data["created"] != self.created:
            if self.status == "running":
                self.status = "stopped"  # stopped (or replaced) by another process
        else:
            self.reload(data)
        if self.status != "running":
            raise LoungeError(f"Cluster {self.name!r} is {self.status}, not running.")

    async def _release_empty(self) -> None:
        """Release every allocation whose agents have no engine left to run."""
        allocs: dict[int, list[dict]] = {}
        for a in self.agents:
            allocs.setdefault(a.get("alloc", 0), []).append(a)
        empty = [
            a for group in allocs.values() if not any(x["ranks"] for x in group) for a in group
        ]
        if empty and not self.backend.grows_in_place:
            await self.backend.release(empty, 5.0)
            self.agents = [a for a in self.agents if a not in empty]

    async def stop(self, forget: bool = False) -> None:
        """Stop every engine, agent and the controller; leave nothing of this cluster behind.

        Nothing here depends on writing a file: on a full disk every process still stops. With
        ``forget``, the cluster's record goes even if a part could not be stopped (the error
        still says which).
        """
        if self.status == "stopped":
            return  # stopping twice (or after a failed start, which stopped) is harmless
        self.status = "stopping"
        # the record is removed when it is ours or gone; never one that a later cluster of
        # this name wrote, nor one that cannot be read (`--forget` is for that)
        try:
            recorded = state.load_state(self.name)
            ours_to_remove = recorded is None or recorded.get("created") == self.created
        except state.CorruptState:
            recorded, ours_to_remove = None, False
        if recorded is not None and ours_to_remove:
            _best_effort(self.save)
        for a in self.agents:
            _best_effort(protocol.write_control, a["files"]["control"], protocol.Control(stop=True))
        await runner.stop(self.name)
        why = "its cluster was stopped before it finished"
        _best_effort(runstore.fail_unfinished, self.name, why)
        try:
            await self.backend.release(self.agents, 5.0)
            released = None
        except LoungeError as e:  # e.g. Slurm not answering: stop the rest, keep the record
            released = e
        if self._client is not None:
            try:
                await asyncio.wait_for(asyncio.to_thread(self.kind.close, self._client), 10)
            except Exception:  # noqa: BLE001 - the controller goes next anyway
                pass
            self._client = None
        # agents left behind stop too once their controller is gone
        await kill_group(self.controller_pid, self.controller_start, grace=3.0)
        if self.keeper and self.keeper[0] != os.getpid():
            await kill_group(*self.keeper, grace=1.0)
        if self.socket_dir:
            remove_socket_dir(self.socket_dir)
        if released is not None and not forget:
            raise LoungeError(
                f"Cluster {self.name!r} is only partly stopped: {released} Its controller is "
                f"stopped; run `lounge stop {self.name}` again once that is fixed."
            )
        if ours_to_remove:
            state.remove_state(self.name, keep_runs=not forget)
        self.status = "stopped"
        self._emit("stopped")
        global _current
        if _current is self:
            _current = None
        if released is not None:
            raise LoungeError(
                f"Cluster {self.name!r} is forgotten, but not all of it stopped: {released}"
            )

    def _stop_at_exit(self) -> None:
        if self.status == "running" and self.keeper and _best(runstore.active, self.name):
            return  # a run goes on: the keeper stops the cluster once it ends
        if self.status in ("running", "starting"):
            try:
                run_sync(asyncio.wait_for(self.stop(), 30))
            except Exception:  # noqa: BLE001 - nothing left to tell at exit
                pass

    # -- work ----------------------------------------------------------------------------------
    def map(
        self,
        fn,
        items,
        *,
        name: str | None = None,
        pool: str | None = None,
        retries: int = 1,
        timeout: float | None = None,
        progress: bool = True,
    ):
        """Run ``fn`` on every item (a dict item: as keyword arguments) as the run ``name``
        (made when not given), on the engines of ``pool``'s nodes only when one is named;
        the DataFrame once it is done. The run goes on if this process dies: read it with
        ``run(name)``. ``timeout`` ends the wait, not the run."""
        from .mapping import map_items

        return map_items(
            self,
            fn,
            items,
            retries=retries,
            timeout=timeout,
            progress=progress,
            name=name,
            pool=pool,
        )

    def runs(self) -> list[dict]:
        """Each run of this cluster: name, status, done, total, errors, started, ... (a run
        whose driver is gone restarts it, so listing also resumes)."""
        return runner.runs(self.name)

    def run(self, name: str) -> runstore.Run:
        """The run called ``name``: ``.result()``, ``.wait()``, ``.cancel()``, ``.delete()``."""
        return runstore.Run(self.name, name)

    def execute(self, code: str, timeout: float | None = None) -> dict:
        """Run ``code`` on every engine of the cluster (``%%lounge``), printing what each
        printed. Waits first for all the engines wanted (a cell right after a start must not
        run on the first one alone), up to the start timeout; if some never come it runs on
        those that did. Returns ``ran``, ``target`` and ``missing``: the nodes_status rows of
        the agents short of engines."""
        self._emit("waiting")
        try:
            self.wait_for_engines_sync(self.n, self.timeout)
        except LoungeTimeout:
            pass  # run where it can; the answer says where it could not
        rows = self.nodes_status()
        ran = sum(r["ready"] for r in rows)
        self.kind.execute(self.client, code, timeout)
        return {
            "ran": ran,
            "target": self.n,
            "missing": [r for r in rows if r["ready"] < r["target"]],
        }

    def job_script(self) -> str:
        """The batch script ``start`` (or the next scale-up) submits, for backends that
        submit one (Slurm): read it before anything is submitted."""
        if not hasattr(self.backend, "job_script"):
            raise LoungeError(f"The {self.backend.name} backend submits no job script.")
        return self.backend.job_script(self.name, self.n, self.dir, self.next_alloc, self.nodes)

    # -- sync twins ----------------------------------------------------------------------------
    def start_sync(self) -> Cluster:
        return run_sync(self.start())

    def scale_sync(self, n: int) -> None:
        run_sync(self.scale(n))

    def interrupt_sync(self) -> int:
        return run_sync(self.interrupt())

    def stop_sync(self, forget: bool = False) -> None:
        run_sync(self.stop(forget=forget))

    def wait_for_engines_sync(self, n: int | None = None, timeout: float | None = None) -> None:
        run_sync(self.wait_for_engines(n, timeout))


def _report(agent: dict) -> protocol.Report | None:
    """The last report of this agent (None before its first)."""
    return protocol.read_report(agent["files"]["report"])


def _best(read, *args):
    """What ``read`` says, or None when it cannot say (a folder already gone)."""
    try:
        return read(*args)
    except Exception:  # noqa: BLE001
        return None


def _best_effort(write, *args) -> None:
    """A write that stopping must not depend on (a full disk, a folder already gone)."""
    try:
        write(*args)
    except OSError:
        pass


def name_in_use(name: str) -> LoungeError:
    return LoungeError(
        f"A cluster named {name!r} is already in use: choose "
        f"another --name, or stop it with `lounge stop {name}`."
    )


def controller_alive(data: dict) -> bool:
    """Whether the controller a state records still runs (that very process, not a later
    one that was given the same pid)."""
    return ours(data.get("controller_pid"), data.get("controller_start"))


def in_use(data: dict) -> bool:
    """A cluster whose controller runs, or whose start is under way in a live process."""
    starter = data.get("starter") or [None, None]
    return controller_alive(data) or (data.get("status") == "starting" and ours(*starter))


def ensure_name_free(name: str) -> dict | None:
    """Raise if a live cluster is called ``name``; return the state a dead one left."""
    old = state.load_state(name)  # a corrupt file: CorruptState says how to remove it
    if old is not None and in_use(old):
        raise name_in_use(name)
    return old


def _stage_option(stage) -> dict[str, str]:
    """``--stage NAME=DIR`` (repeated, or a list of them, or {NAME: DIR}): data set name ->
    the folder's absolute path here; each checked."""
    from .stage import check_name, source_folder

    if not stage:
        return {}
    if isinstance(stage, str):
        stage = [stage]
    if isinstance(stage, (list, tuple)):
        pairs = {}
        for item in stage:
            name, eq, folder = str(item).partition("=")
            if not eq or not folder:
                raise LoungeError(
                    f"--stage {item!r} is not NAME=DIR: say which folder is which data set, "
                    "e.g. --stage tissue=/shared/tissue"
                )
            pairs[name] = folder
        stage = pairs
    return {check_name(name): str(source_folder(folder)) for name, folder in stage.items()}


def _courtesy_policy(courtesy) -> dict | None:
    """The idle policy the node agents follow (see telemetry.Courtesy), or None: no yielding."""
    from dataclasses import asdict

    from .telemetry import IDLE_KEYS, IdlePolicy

    if courtesy is None or courtesy is False:
        return None
    if courtesy is True:
        return asdict(IdlePolicy())
    if isinstance(courtesy, IdlePolicy):
        return asdict(courtesy)
    unknown = sorted(set(courtesy) - IDLE_KEYS)
    if unknown:
        raise LoungeError(
            f"Unknown courtesy setting {unknown[0]!r}: use {', '.join(sorted(IDLE_KEYS))}."
        )
    return asdict(IdlePolicy(**courtesy))
