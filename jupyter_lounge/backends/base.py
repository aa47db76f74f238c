"""The backend contract: place node agents, nudge them, say how they are, release them.

Every method that can block is ``async``. An agent is a plain dict (saved in the cluster's
state file so another process can find and stop it): ``key``, ``node`` (None until the
agent reports where it runs), ``ranks``, ``files`` (spec, control, report, log paths), plus
whatever the backend adds to find it again (a pid, a Slurm job id).
"""

from __future__ import annotations

from pathlib import Path


class Backend:
    name = ""
    #: True: scale up by adding ranks to the agents already placed (they fork more engines).
    #: False: scale up by placing new agents (a new allocation).
    grows_in_place = True
    #: True: a node that cannot be reached at start is left out with a warning.
    may_skip_nodes = False

    def __init__(self, **options):
        self.options = options

    def plan(self, n: int, nodes: int | None) -> list[tuple[str | None, int]]:
        """(node name or None when the backend picks it, engine count) for each agent to
        place for ``n`` engines."""
        raise NotImplementedError

    def listen_address(self) -> str:
        """Where the controller listens so that every node can reach it."""
        raise NotImplementedError

    def agent_command(self, spec: str) -> list[str]:
        import sys

        return [sys.executable, "-m", "jupyter_lounge.node", spec]

    async def place(self, agents: list[dict], cdir: Path, cluster: str) -> None:
        """Start these agents (their spec files are written); record how to find them."""
        raise NotImplementedError

    async def nudge(self, agent: dict) -> None:
        """Tell the agent to re-read its control file now (it also polls it)."""

    async def release(self, agents: list[dict], grace: float) -> None:
        """Stop these agents and every engine they forked, and free what held them; return
        when none is left."""
        raise NotImplementedError

    def agent_state(self, agent: dict) -> tuple[str, str]:
        """("alive" | "pending" | "lost", a reason a person can read)."""
        raise NotImplementedError

    def spec_for(self, node: str | None) -> dict:
        """What this backend adds to the spec of an agent on ``node`` (nothing by default)."""
        return {}

    async def stage_data(self, stage: dict[str, str], nodes: list[str], cdir) -> dict:
        """Make the data sets ``stage`` (name -> folder here) reachable to the agents about to
        start on ``nodes``; what their specs say of them. Here: engines read the folders
        where they are (this machine's own disk)."""
        return {"data": dict(stage)}

    def courtesy_for(self, node: str | None) -> dict | None:
        """The idle policy a node follows when the cluster names none (None: no yielding)."""
        return None

    def pool_nodes(self, pool: str) -> list[str]:
        """The nodes of ``pool``: the lounge inventory's pools (this backend has none)."""
        from ..errors import LoungeError

        raise LoungeError(
            f"Pools are the lounge's: map(pool={pool!r}) needs a cluster on --backend ssh; "
            f"this one runs on {self.name}."
        )

    def describe(self) -> dict:
        """The options this backend runs with, for status displays."""
        return dict(self.options)
