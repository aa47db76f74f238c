"""Every survey of the machines, in one place: this one's telemetry, the lounge inventory's
nodes asked over SSH (``ask_lounge``, for ``lounge nodes --live`` and the sidebar), the
engines running per node, and which backends can be used here. One row shape for a node,
whoever asks.

``MachineSurvey`` is the server's: answers are cached for a few seconds and never block the
caller's event loop (sampling and commands run in threads, the SSH survey as subprocesses in
the background). A request gets the last survey while the next one is under way; only the
first one waits for it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import threading
import time

from . import state
from .cluster import controller_alive
from .errors import LoungeError
from .protocol import read_report

log = logging.getLogger(__name__)
THIS_MACHINE = "this machine"


class MachineSurvey:
    local_ttl = 2.0  # seconds a sample of this machine is reused
    lounge_ttl = 5.0  # seconds before the lounge's nodes are asked again
    slurm_ttl = 10.0  # seconds before sinfo is asked again
    survey_timeout = 15.0  # seconds each node has to answer

    def __init__(self) -> None:
        self._telemetry = None
        self._sampling = threading.Lock()
        self._here: tuple[float, dict] | None = None
        self._lounge: tuple[float, list[dict]] | None = None  # (when, rows)
        self._lounge_key: tuple[str, float] | None = None  # the inventory (path, mtime) asked
        self._asking: asyncio.Task | None = None
        self._slurm: tuple[float, tuple[bool, str]] | None = None

    async def nodes(self) -> list[dict]:
        here = await self._this_machine()
        lounge = await self._lounge_nodes()
        engines = await asyncio.to_thread(engines_by_node, state.list_states())
        return [{**row, "engines": engines.get(row["name"], 0)} for row in (here, *lounge)]

    async def backends(self) -> dict:
        from . import inventory
        from .backends.options import rest_names
        from .engines import KINDS

        now = time.monotonic()
        if self._slurm is None or now - self._slurm[0] > self.slurm_ttl:
            self._slurm = (now, await asyncio.to_thread(probe_slurm))
        slurm_ok, slurm_why = self._slurm[1]
        try:
            ssh_ok, ssh_why, pools = True, "", inventory.load().pools
        except LoungeError as e:
            ssh_ok, ssh_why, pools = False, str(e), []
        return {
            "engines": list(KINDS),
            "backends": [
                {"name": "local", "available": True, "why": "", "options": rest_names("local")},
                {
                    "name": "slurm",
                    "available": slurm_ok,
                    "why": slurm_why,
                    "options": rest_names("slurm"),
                },
                {
                    "name": "ssh",
                    "available": ssh_ok,
                    "why": ssh_why,
                    "options": rest_names("ssh"),
                    "pools": pools,
                },
            ],
        }

    async def close(self) -> None:
        """Let a survey under way finish (its ssh commands end by their own timeout)."""
        if self._asking is not None and not self._asking.done():
            await asyncio.wait([self._asking], timeout=self.survey_timeout + 5)

    # -- this machine --------------------------------------------------------------------------
    async def _this_machine(self) -> dict:
        now = time.monotonic()
        if self._here is None or now - self._here[0] > self.local_ttl:
            self._here = (now, await asyncio.to_thread(self._sample_here))
        return dict(self._here[1])

    def _sample_here(self) -> dict:
        from .telemetry import IdlePolicy, Telemetry, snapshot

        with self._sampling:
            if self._telemetry is None:  # CPU is measured between two looks
                self._telemetry = Telemetry(own_pid=os.getpid(), roots=_cluster_pids)
                self._telemetry.sample()
                time.sleep(0.5)
            sample = self._telemetry.sample()
        # The person logged in here is the one using Jupyter: that alone is not "in use".
        how, why = snapshot(IdlePolicy(), {**sample, "users": []})
        return {
            "name": THIS_MACHINE,
            "host": "localhost",
            "backend": "local",
            "state": how,
            "why": why,
            "cpu": sample["cpu_percent"],
            "mem": sample["memory_percent"],
            "gpus": _gpus(sample),
            "users": sample["users"],
            "pools": ["local"],
        }

    # -- the lounge ----------------------------------------------------------------------------
    async def _lounge_nodes(self) -> list[dict]:
        from . import inventory

        path = inventory.default_path()
        try:
            key = (str(path), path.stat().st_mtime)
        except OSError:
            return []  # no inventory: no lounge to show
        if key != self._lounge_key:
            self._lounge_key, self._lounge = key, None
        fresh = self._lounge is not None and time.monotonic() - self._lounge[0] < self.lounge_ttl
        if not fresh and (self._asking is None or self._asking.done()):
            self._asking = asyncio.create_task(self._ask_lounge(key))
        if self._lounge is None:  # nothing to show yet: wait for the first answers
            await asyncio.wait([self._asking], timeout=self.survey_timeout + 5)
        return [dict(row) for row in self._lounge[1]] if self._lounge else []

    async def _ask_lounge(self, key: tuple[str, float]) -> None:
        from .backends.ssh import SSHBackend

        try:
            rows = await ask_lounge(SSHBackend(inventory=key[0]), timeout=self.survey_timeout)
            for row in rows:
                del row["telemetry"]
        except LoungeError as e:  # a broken inventory: GET backends says why
            log.warning("jupyter_lounge: no lounge nodes: %s", e)
            rows = []
        except Exception:  # noqa: BLE001 - a background task must not die unseen
            log.exception("jupyter_lounge: surveying the lounge failed")
            rows = []
        if key == self._lounge_key:
            self._lounge = (time.monotonic(), rows)


def _gpus(sample: dict) -> list[dict]:
    return [
        {
            "util_percent": g.get("util_percent"),
            "mem_percent": round(100 * g["memory_used_mib"] / g["memory_total_mib"], 1)
            if g.get("memory_total_mib")
            else None,
        }
        for g in sample.get("gpus") or []
    ]


async def ask_lounge(backend, timeout: float = 20.0) -> list[dict]:
    """Every node of the ssh backend, asked over SSH at once: one row each, idle or in use
    (by its own idle policy, and why) from one telemetry sample, or offline and why."""
    import json
    import shlex

    from .procs import call
    from .sync import wsl_command

    async def one(node) -> dict:
        try:
            if node.windows:  # presence is asked of Windows, from the PC's WSL2 distro
                remote = wsl_command(
                    node, node.python, "-m", "jupyter_lounge.telemetry", "--windows"
                )
            else:
                remote = shlex.join([node.python, "-m", "jupyter_lounge.telemetry"])
            out = await call([*backend.reusing_ssh_command(node.name), remote], timeout=timeout)
            sample = json.loads(out.strip().splitlines()[-1])
        except (LoungeError, ValueError, IndexError) as e:
            sample, error = None, str(e).rsplit("`", 1)[-1].strip()[:200]
        return _lounge_row(node, sample, error if sample is None else "")

    return list(await asyncio.gather(*(one(n) for n in backend.nodes.values())))


def _lounge_row(node, sample: dict | None, error: str) -> dict:
    """A lounge node as every face shows it (``telemetry``: the sample it sent, if any)."""
    out = {
        "name": node.name,
        "host": node.host,
        "backend": "ssh",
        "state": "offline",
        "why": _last_words(error) or "it did not answer",
        "cpu": None,
        "mem": None,
        "gpus": [],
        "users": [],
        "pools": list(node.pools),
        "telemetry": sample,
    }
    if sample:
        from .telemetry import snapshot

        how, why = snapshot(node.idle, sample)
        out.update(
            state=how,
            why=why,
            cpu=sample.get("cpu_percent"),
            mem=sample.get("memory_percent"),
            gpus=_gpus(sample),
            users=sample.get("users", []),
        )
    return out


def _last_words(text: str | None) -> str:
    """The line of an error that says what happened (ssh's own, not our wrapping)."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    wrapped = re.search(r"failed with exit code -?\d+: (.+)", last)
    return wrapped.group(1) if wrapped else last


def engines_by_node(states: list[dict]) -> dict[str, int]:
    """(blocking) Engines running now per node row, as the node agents report them: local
    clusters' on this machine, ssh clusters' on their lounge node."""
    counts: dict[str, int] = {}
    for data in states:
        if data["backend"] not in ("local", "ssh") or not controller_alive(data):
            continue
        for agent in data.get("agents") or []:
            report = read_report(agent["files"]["report"])
            running = report.running() if report is not None else 0
            node = THIS_MACHINE if data["backend"] == "local" else agent.get("node")
            counts[node] = counts.get(node, 0) + running
    return counts


def probe_slurm(timeout: float = 10.0) -> tuple[bool, str]:
    """(blocking) Whether Slurm answers here, and if not, why in a few words."""
    from .procs import run

    if shutil.which("sinfo") is None:
        return False, "sinfo was not found"
    try:
        run(["sinfo", "-h", "-o", "%P"], timeout=timeout)
    except LoungeError as e:
        return False, f"sinfo does not answer ({_last_words(str(e))})"
    return True, ""


def _cluster_pids() -> list[int]:
    """Controllers and agents (or relays) of every cluster this machine runs: their process
    trees are our engines, not a person's load."""
    from . import state
    from .procs import ours

    pids = []
    for d in state.list_states():
        pids.append((d.get("controller_pid"), d.get("controller_start")))
        pids += [(a.get("pid"), a.get("start")) for a in d.get("agents", [])]
    return [pid for pid, start in pids if isinstance(pid, int) and ours(pid, start)]
