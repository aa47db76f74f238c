"""This machine: node agents are local subprocesses, each the leader of its process group,
so stopping one group takes down the agent and every engine it forked."""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path

from ..procs import alive, kill_group, spawn
from .base import Backend


class LocalBackend(Backend):
    name = "local"

    def node_names(self, count: int) -> list[str]:
        host = socket.gethostname().split(".")[0] or "localhost"
        return [host] if count == 1 else [f"{host}-{i}" for i in range(count)]

    def listen_ip(self) -> str:
        return "127.0.0.1"

    async def start_agent(self, node: str, spec: Path, log: Path) -> dict:
        env = dict(os.environ)
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        proc = spawn([sys.executable, "-m", "jupyter_lounge.node", str(spec)], log, env=env)
        return {"node": node, "pid": proc.pid, "host": socket.gethostname()}

    async def nudge_agent(self, handle: dict) -> None:
        try:
            os.kill(handle["pid"], signal.SIGHUP)
        except ProcessLookupError:
            pass

    async def stop_agent(self, handle: dict, grace: float) -> None:
        await kill_group(handle["pid"], grace=grace)

    def agent_alive(self, handle: dict) -> bool:
        return alive(handle["pid"])
