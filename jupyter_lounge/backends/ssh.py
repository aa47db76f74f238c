"""The lounge over SSH: one OpenSSH session per node from the inventory, all opened at once,
each running that node's agent, which forks the node's engines.

This first version needs the lounge dir on a file system the nodes share (the agent reads its
spec and the connection file there and writes its report there), as the testbed has; shipping
them over the SSH session for machines that share nothing is the next step. Host keys are
checked against known_hosts (``BatchMode``, ``StrictHostKeyChecking=yes``).
"""

from __future__ import annotations

import asyncio
import json
import shlex
import socket
from pathlib import Path

from ..errors import LoungeError
from ..procs import alive, kill_group, spawn
from .base import Backend

OPTIONS = ("inventory", "pool", "known_hosts", "ssh_config", "strict")


class SSHBackend(Backend):
    name = "ssh"
    grows_in_place = True

    def __init__(self, **options):
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise LoungeError(
                f"Unknown ssh option {unknown[0]!r}: use one of {', '.join(OPTIONS)}."
            )
        super().__init__(**options)
        self.may_skip_nodes = not options.get("strict", False)
        from .. import inventory

        self.inventory = inventory.load(options.get("inventory"))
        self.nodes = {n.name: n for n in self.inventory.select(options.get("pool"))}

    def plan(self, n: int, nodes: int | None) -> list[tuple[str | None, int]]:
        chosen = list(self.nodes.values())[: nodes or None]
        slots = sum(node.engines for node in chosen)
        if n > slots:
            raise LoungeError(
                f"{n} engines do not fit on {len(chosen)} lounge node(s) with {slots} engine "
                f"slots ({self.inventory.path}); ask for fewer or raise their 'engines'."
            )
        plan, left = [], n
        for node in chosen:  # spread evenly, within each node's slots
            share = min(node.engines, -(-left // (len(chosen) - len(plan))))
            if share:
                plan.append((node.name, share))
            left -= share
        return plan

    def courtesy_for(self, node: str | None) -> dict | None:
        """Lounge PCs belong to people first: their inventory idle policy always applies."""
        from dataclasses import asdict

        return asdict(self.nodes[node].idle) if node in self.nodes else None

    def listen_address(self) -> str:
        first = next(iter(self.nodes.values()))
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((socket.gethostbyname(first.host), 9))  # no packet is sent
                return s.getsockname()[0]
        except OSError as e:
            raise LoungeError(
                f"No route to lounge node {first.name!r} ({first.host}): {e}."
            ) from None

    def ssh_command(self, node_name: str) -> list[str]:
        node = self.nodes[node_name]
        cmd = [
            "ssh",
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "ConnectTimeout=10",
            "-o",
            "ServerAliveInterval=5",
            "-o",
            "ServerAliveCountMax=2",
            "-p",
            str(node.port),
        ]
        if self.options.get("ssh_config"):
            cmd += ["-F", self.options["ssh_config"]]
        known_hosts = self.options.get("known_hosts") or node.known_hosts
        if known_hosts:
            cmd += ["-o", f"UserKnownHostsFile={known_hosts}"]
        if node.key:
            cmd += ["-i", node.key, "-o", "IdentitiesOnly=yes"]
        if node.user:
            cmd += ["-l", node.user]
        return [*cmd, node.host]

    async def place(self, agents: list[dict], cdir: Path, cluster: str) -> None:
        for agent in agents:
            node = self.nodes[agent["node"]]
            remote = [node.python, "-m", "jupyter_lounge.node", agent["files"]["spec"]]
            proc = spawn(
                [*self.ssh_command(node.name), "--", shlex.join(remote)],
                Path(agent["files"]["log"]),
            )
            agent.update(pid=proc.pid, host=node.host)

    async def release(self, agents: list[dict], grace: float) -> None:
        # The control files already say stop; give the agents a moment, then end sessions.
        deadline = asyncio.get_running_loop().time() + grace
        while any(alive(a.get("pid")) for a in agents):
            if asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.1)
        await asyncio.gather(*(kill_group(a.get("pid"), grace=1.0) for a in agents))

    def agent_state(self, agent: dict) -> tuple[str, str]:
        if alive(agent.get("pid")):
            return "alive", ""
        return "lost", f"the SSH session to {agent.get('host')} ended"

    async def survey(self, timeout: float = 20.0) -> list[dict]:
        """Every node's live state, asked over SSH at once: idle, in use (why), or offline."""
        from ..procs import call

        async def one(node) -> dict:
            row = {"name": node.name, "host": node.host, "pools": ",".join(node.pools)}
            remote = shlex.join([node.python, "-m", "jupyter_lounge.telemetry"])
            try:
                out = await call([*self.ssh_command(node.name), "--", remote], timeout=timeout)
                sample = json.loads(out.strip().splitlines()[-1])
            except (LoungeError, ValueError, IndexError) as e:
                return {**row, "state": "offline", "why": str(e).rsplit("`", 1)[-1].strip()[:200]}
            from dataclasses import asdict  # noqa: F401 - policy is the node's own

            from ..telemetry import snapshot

            state, why = snapshot(node.idle, sample)
            return {
                **row,
                "state": f"{state} ({why})" if why else state,
                "cpu": sample["cpu_percent"],
                "mem": sample["memory_percent"],
                "gpu": ",".join(f"{g['util_percent']}%" for g in sample["gpus"]),
                "users": ",".join(sample["users"]),
                "why": "",
                "telemetry": sample,
            }

        return list(await asyncio.gather(*(one(n) for n in self.nodes.values())))
