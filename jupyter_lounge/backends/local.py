"""This machine: node agents are local subprocesses, each the leader of its process group,
so stopping one group takes down the agent and every engine it forked."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from pathlib import Path

from ..procs import kill_group, ours, spawn, started
from .base import Backend


class LocalBackend(Backend):
    name = "local"
    grows_in_place = True

    def plan(self, n: int, nodes: int | None) -> list[tuple[str | None, int]]:
        nodes = nodes or 1
        host = socket.gethostname().split(".")[0] or "localhost"
        names = [host] if nodes == 1 else [f"{host}-{i}" for i in range(nodes)]
        return [(name, len(range(i, n, nodes))) for i, name in enumerate(names)]

    def listen_address(self) -> str:
        return "127.0.0.1"

    async def place(self, agents: list[dict], cdir: Path, cluster: str) -> None:
        env = dict(os.environ)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        for agent in agents:
            proc = spawn(
                self.agent_command(agent["files"]["spec"]), Path(agent["files"]["log"]), env=env
            )
            agent.update(pid=proc.pid, start=started(proc.pid), host=socket.gethostname())

    async def nudge(self, agent: dict) -> None:
        if ours(agent.get("pid"), agent.get("start")):
            try:
                os.kill(agent["pid"], signal.SIGHUP)
            except ProcessLookupError:
                pass

    async def release(self, agents: list[dict], grace: float) -> None:
        await asyncio.gather(
            *(kill_group(a.get("pid"), a.get("start"), grace=grace) for a in agents)
        )

    def agent_state(self, agent: dict) -> tuple[str, str]:
        if ours(agent.get("pid"), agent.get("start")):
            return "alive", ""
        return "lost", f"node agent process {agent.get('pid')} is gone"
