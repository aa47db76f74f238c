"""The backend contract: place one node agent per node, nudge it, stop it, say if it lives.

Every method that can block is ``async``. An agent handle is a plain dict (it is saved in the
cluster's state file so another process can stop the agent): at least ``node`` and ``pid``.
"""

from __future__ import annotations

from pathlib import Path


class Backend:
    name = ""

    def __init__(self, **options):
        self.options = options

    def node_names(self, count: int) -> list[str]:
        """Names of the nodes to place ``count`` agents on."""
        raise NotImplementedError

    def listen_ip(self) -> str:
        """Where the controller listens so that every node can reach it."""
        raise NotImplementedError

    async def start_agent(self, node: str, spec: Path, log: Path) -> dict:
        """Start the node agent for ``spec`` on ``node``; return its handle."""
        raise NotImplementedError

    async def nudge_agent(self, handle: dict) -> None:
        """Tell the agent to re-read its control file now."""
        raise NotImplementedError

    async def stop_agent(self, handle: dict, grace: float) -> None:
        """Stop the agent and every engine it forked; return when none is left."""
        raise NotImplementedError

    def agent_alive(self, handle: dict) -> bool:
        raise NotImplementedError
