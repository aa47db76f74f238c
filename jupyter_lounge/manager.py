"""ClusterManager: every cluster on this machine, found through the state files.

No tornado here: the magics, the CLI and (later) the Jupyter server share this logic.
"""

from __future__ import annotations

import time

from . import state
from ._loop import run_sync
from .cluster import Cluster
from .errors import LoungeError
from .procs import alive


class ClusterManager:
    def names(self) -> list[str]:
        return [d["name"] for d in state.list_states()]

    def get(self, name: str) -> Cluster:
        return Cluster.attach(name)

    def list(self) -> list[dict]:
        """One summary per cluster; a cluster whose controller died is reported ``dead``."""
        out = []
        for d in state.list_states():
            status = d["status"] if alive(d.get("controller_pid")) else "dead"
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
        return out

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

    def stop(self, name: str) -> None:
        if state.load_state(state.check_name(name)) is None:
            known = ", ".join(self.names()) or "none"
            raise LoungeError(f"No cluster named {name!r} to stop (running: {known}).")
        run_sync(self.get(name).stop())

    def scale(self, name: str, n: int) -> None:
        run_sync(self.get(name).scale(n))
