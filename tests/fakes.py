"""A fake backend and a fake engine kind, for testing the cluster's reconcile logic (start,
scale, placement, lost agents, releasing allocations) in milliseconds, the way distributed
tests SpecCluster with toy ProcessInterfaces.

FakeBackend places no process: at the protocol level it plays each node agent itself,
reading the agent's control file and writing its report file on ``place`` and ``nudge``.
FakeKind's controller is a tiny real subprocess that writes two connection files and
sleeps, so ``Cluster.start`` and ``Cluster.stop`` run their real code (spawn, wait for the
files, connect, kill the process group). Its client's ``registered`` is what the fake
agents report running.

``agent_io`` is the only code here that reads or writes the agent's files (through
``protocol``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from jupyter_lounge import protocol
from jupyter_lounge.backends.base import Backend
from jupyter_lounge.engines.base import EngineKind
from jupyter_lounge.errors import LoungeError


def agent_io(agent: dict, report: dict | None = None) -> tuple[dict, dict | None]:
    """Write ``report`` (when given) as the agent's report, then read its control and report
    back through the agent protocol: (control, report) in a form independent of it.

    control: ``{"ranks": list | None, "size": int | None, "interrupt": str | None,
    "stop": bool}``; report (None when the agent wrote none): ``{"status": str,
    "error": str | None, "engines": {rank (int): state (str)}}``.
    """
    files = agent["files"]
    if report is not None:
        protocol.write_report(
            files["report"],
            protocol.Report(
                node=agent["node"],
                host="fake",
                status=report["status"],
                error=report.get("error"),
                engines={
                    str(rank): {"pid": 100000 + rank, "state": how, "restarts": 0}
                    for rank, how in report.get("engines", {}).items()
                },
                time=time.time(),
            ),
        )
    control = protocol.read_control(files["control"])
    read = protocol.read_report(files["report"])
    return (
        {"ranks": None, "size": None, "interrupt": None, "stop": False}
        if control is None
        else {
            "ranks": control.ranks,
            "size": control.size,
            "interrupt": control.interrupt,
            "stop": control.stop,
        },
        None
        if read is None
        else {
            "status": read.status,
            "error": read.error,
            "engines": {int(r): e.get("state") for r, e in read.engines.items()},
        },
    )


class FakeBackend(Backend):
    """In memory: records every call, and plays every node agent it placed.

    ``nodes`` are named nodes with ``slots`` engines each; ``plan`` fills them in order
    (or spreads evenly over the first ``nodes`` when the cluster names a count).
    ``unreachable``: node -> reason; agents placed there never report and are lost.
    ``failing``: node -> error; agents placed there report "failed" with that error.
    """

    name = "fake"

    def __init__(
        self,
        nodes: tuple[str, ...] = ("n0", "n1", "n2", "n3"),
        slots: int = 4,
        *,
        grows_in_place: bool = True,
        may_skip_nodes: bool = False,
        unreachable: dict[str, str] | None = None,
        failing: dict[str, str] | None = None,
    ):
        super().__init__()
        self.node_names = list(nodes)
        self.slots = slots
        self.grows_in_place = grows_in_place
        self.may_skip_nodes = may_skip_nodes
        self.unreachable = dict(unreachable or {})
        self.failing = dict(failing or {})
        #: ("place", [(key, node, ranks)]), ("nudge", key, control),
        #: ("release", [key], {key: control}), in call order
        self.calls: list[tuple] = []
        self.live: dict[str, dict] = {}  # key -> agent: placed, not released
        self.states: dict[str, tuple[str, str]] = {}  # key -> (how, why); absent: alive
        self.retired: dict[str, set[int]] = {}  # key -> ranks shut down on purpose

    # -- the contract ----------------------------------------------------------------------
    def plan(self, n: int, nodes: int | None) -> list[tuple[str | None, int]]:
        if nodes:
            if nodes > len(self.node_names):
                raise LoungeError(f"The fake backend has only {len(self.node_names)} nodes.")
            names = self.node_names[:nodes]
            return [(name, len(range(i, n, nodes))) for i, name in enumerate(names)]
        counts = [self.slots] * (n // self.slots) + ([n % self.slots] if n % self.slots else [])
        if len(counts) > len(self.node_names):
            raise LoungeError(f"The fake backend has only {len(self.node_names)} nodes.")
        return list(zip(self.node_names, counts))

    def listen_address(self) -> str:
        return "127.0.0.1"

    async def place(self, agents: list[dict], cdir: Path, cluster: str) -> None:
        self.calls.append(("place", [(a["key"], a["node"], list(a["ranks"])) for a in agents]))
        # what no backend can do right: an agent placed twice, a rank run by two agents
        twice = [a["key"] for a in agents if a["key"] in self.live]
        assert not twice, f"agent(s) {twice} placed again while the first still runs"
        held = [r for a in self.live.values() for r in agent_io(a)[0]["ranks"] or ()]
        both = sorted(set(held) & {r for a in agents for r in agent_io(a)[0]["ranks"] or ()})
        assert not both, f"rank(s) {both} given to a new agent while another runs them"
        for a in agents:
            a["job"] = f"fake-{a['alloc']}"  # what a backend records to find the agent again
            self.live[a["key"]] = a
            if a["node"] in self.unreachable:
                self.states[a["key"]] = ("lost", self.unreachable[a["node"]])
            else:
                self._act(a)

    async def nudge(self, agent: dict) -> None:
        control = self._act(agent) if self._alive(agent) else agent_io(agent)[0]
        self.calls.append(("nudge", agent["key"], control))

    async def release(self, agents: list[dict], grace: float) -> None:
        controls = {}
        for a in agents:
            controls[a["key"]] = self._act(a) if self._alive(a) else agent_io(a)[0]
            self.live.pop(a["key"], None)
            self.states[a["key"]] = ("lost", "released")
        self.calls.append(("release", [a["key"] for a in agents], controls))

    def agent_state(self, agent: dict) -> tuple[str, str]:
        return self.states.get(agent["key"], ("alive", ""))

    # -- what a test drives ----------------------------------------------------------------
    def set_state(self, key: str, how: str, why: str = "") -> None:
        """The agent ``key`` is now "alive", "pending" or "lost" (``why``)."""
        self.states[key] = (how, why)

    def retire(self, agent: dict, rank: int) -> None:
        """The engine ``rank`` was shut down on purpose: its agent reports it retired."""
        self.retired.setdefault(agent["key"], set()).add(rank)
        self._act(agent)

    def up(self) -> list[tuple[str, int]]:
        """(node, rank) of every engine a live agent reports running."""
        out = []
        for a in self.live.values():
            report = agent_io(a)[1]
            if self._alive(a) and report:
                out += [(a["node"], r) for r, how in report["engines"].items() if how == "running"]
        return sorted(out)

    def placed(self) -> list[list[tuple]]:
        return [c[1] for c in self.calls if c[0] == "place"]

    def nudged(self) -> list[tuple[str, dict]]:
        return [(c[1], c[2]) for c in self.calls if c[0] == "nudge"]

    def released(self) -> list[list[str]]:
        return [c[1] for c in self.calls if c[0] == "release"]

    # -- the fake agents -------------------------------------------------------------------
    def _alive(self, agent: dict) -> bool:
        return self.agent_state(agent)[0] == "alive"

    def _act(self, agent: dict) -> dict:
        """What a node agent does on reading its control file: run exactly its ranks (minus
        the retired ones), or stop. Returns the control it read."""
        control, _ = agent_io(agent)
        retired = self.retired.get(agent["key"], set())
        if agent["node"] in self.failing:
            report = {"status": "failed", "error": self.failing[agent["node"]], "engines": {}}
        elif control["stop"]:
            report = {"status": "stopped", "engines": {}}
        else:
            engines = {r: "running" for r in control["ranks"] or () if r not in retired}
            report = {"status": "running", "engines": engines | dict.fromkeys(retired, "retired")}
        agent_io(agent, report)
        return control


CONTROLLER = """\
import json, os, sys, time
cdir, gate = sys.argv[1], sys.argv[2]
while gate and not os.path.exists(gate):
    time.sleep(0.01)
for name in ("fake-engines.json", "fake-client.json"):
    tmp = os.path.join(cdir, "." + name + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"controller": os.getpid()}, f)
    os.replace(tmp, os.path.join(cdir, name))
while True:
    time.sleep(60)
"""


class FakeClient:
    def __init__(self, backend: FakeBackend, cdir: Path):
        self.backend, self.cdir, self.closed = backend, cdir, False


class FakeKind(EngineKind):
    """A controller that is a real (tiny) process; engines are whatever the backend's fake
    agents report running. With ``gate``, the controller writes its connection files only
    once that file exists."""

    name = "fake"

    def __init__(self, backend: FakeBackend, gate: Path | None = None):
        self.backend, self.gate = backend, gate
        self.clients: list[FakeClient] = []

    def controller_command(self, cdir: Path, listen_ip: str, options: dict) -> list[str]:
        return [sys.executable, "-c", CONTROLLER, str(cdir), str(self.gate or "")]

    def connection_files(self, cdir: Path) -> tuple[Path, Path]:
        return cdir / "fake-engines.json", cdir / "fake-client.json"

    def _connect(self, cdir: Path, timeout: float) -> FakeClient:
        if protocol.read_json(self.connection_files(cdir)[1]) is None:
            raise OSError("no client connection file")
        client = FakeClient(self.backend, cdir)
        self.clients.append(client)
        return client

    def close(self, client: FakeClient) -> None:
        client.closed = True

    def registered(self, client: FakeClient) -> list[tuple[str, int]]:
        assert not client.closed, "registered() asked of a closed client"
        return client.backend.up()
