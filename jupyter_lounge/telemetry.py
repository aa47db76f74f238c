"""What a node agent sees of its machine: load, memory, GPUs, who is logged in, and how much
CPU processes that are not ours use; and the courtesy rule that turns it into idle / in use.

The rule is HTCondor's in spirit: a PC is in use while a person is logged in at it, or while
foreign processes use more than a threshold of CPU or GPU for a while; it is idle again only
after it has stayed quiet for a while. Engines run only on idle PCs.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class IdlePolicy:
    """When a PC counts as in use (the inventory's ``[idle]`` tables, ``--courtesy``)."""

    cpu_percent: float = 20.0
    gpu_percent: float = 10.0
    for_seconds: float = 30.0
    idle_after_seconds: float = 300.0
    probe: str = ""  # a command whose exit code 0 means "in use"
    games: tuple[str, ...] | None = None  # Windows PCs: programs that mean a person plays
    # (image names as tasklist shows them; None: windows.DEFAULT_GAMES)


IDLE_KEYS = {f.name for f in fields(IdlePolicy)}


class Telemetry:
    """Samples this machine; keeps psutil handles so per-process CPU is measured between
    samples (the first sample of a process reads 0)."""

    def __init__(self, own_pid: int | None = None, roots=None, presence: str = "linux"):
        """``roots``: a callable giving more pids whose process trees are ours too (the
        Jupyter server passes the controllers and agents of this machine's clusters);
        ``presence`` "windows": this is a Windows PC's WSL2 distro, where the people, games and
        GPU use that matter are seen from the Windows side (windows.py)."""
        import psutil

        self.psutil = psutil
        self.presence = presence
        self.own_pid = own_pid or os.getpid()
        self.roots = roots
        self._procs: dict[int, object] = {}
        psutil.cpu_percent(None)

    def _ours(self) -> set[int]:
        ours = set()
        for pid in {self.own_pid, *(self.roots() if self.roots else ())}:
            try:
                ours |= {pid, *(p.pid for p in self.psutil.Process(pid).children(recursive=True))}
            except (self.psutil.NoSuchProcess, self.psutil.AccessDenied, ValueError):
                ours.add(pid)
        return ours

    def foreign_cpu_percent(self) -> float:
        ours, seen, total = self._ours(), set(), 0.0
        for proc in self.psutil.process_iter(["pid"]):
            pid = proc.info["pid"]
            seen.add(pid)
            if pid in ours or pid == os.getppid():
                continue
            cached = self._procs.setdefault(pid, proc)
            try:
                total += cached.cpu_percent(None)
            except (self.psutil.NoSuchProcess, self.psutil.AccessDenied):
                continue
        for pid in set(self._procs) - seen:
            del self._procs[pid]
        return total

    def sample(self) -> dict:
        psutil = self.psutil
        mem = psutil.virtual_memory()
        return {
            "time": time.time(),
            "cpu_percent": psutil.cpu_percent(None),
            "cpus": psutil.cpu_count(),
            "load": [round(x, 2) for x in os.getloadavg()],
            "memory_percent": mem.percent,
            "memory_total_mib": mem.total // 2**20,
            "users": sorted({u.name for u in psutil.users()}),
            "foreign_cpu_percent": round(self.foreign_cpu_percent(), 1),
            "gpus": gpu_sample(),
        } | (windows_presence() if self.presence == "windows" else {})


def windows_presence() -> dict:
    """What a Windows PC's own programs say, seen from its WSL2 distro: the people at it
    (``users``), the programs in their sessions (``windows_apps``), its GPUs with the use of
    programs that are not WSL's (``gpus``: ours run inside WSL's VM) and what could not be
    asked (``windows_problems``)."""
    from . import windows

    seen = windows.sample(games=())  # the games are the idle policy's: see ``playing``
    return {
        "users": seen["users"],
        "console_idle_seconds": seen["console_idle_seconds"],
        "windows_apps": seen["apps"],
        "gpus": seen["gpus"],  # a GPU's use counts only while a program not ours holds it
        "windows_problems": seen["problems"],
    }


def gpu_sample() -> list[dict]:
    """Per GPU: utilisation and memory, through NVML (nvidia-ml-py) where a GPU exists."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver, no GPU: nothing to report
        return []
    out = []
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            util = pynvml.nvmlDeviceGetUtilizationRates(handle)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            out.append(
                {
                    "index": i,
                    "util_percent": util.gpu,
                    "memory_used_mib": mem.used // 2**20,
                    "memory_total_mib": mem.total // 2**20,
                }
            )
    finally:
        pynvml.nvmlShutdown()
    return out


class Courtesy:
    """Idle / in use from successive samples (pure: the clock and the sample are given)."""

    def __init__(self, policy: IdlePolicy, now: float):
        self.policy = policy
        self.state = "idle"
        self.reason = ""
        self._busy_since: float | None = None
        self._quiet_since: float | None = now

    def carry(self) -> list:
        """Where it stands, for an agent that executes itself anew (``take_over``)."""
        return [self.state, self.reason, self._busy_since, self._quiet_since]

    def take_over(self, carried: list) -> None:
        self.state, self.reason, self._busy_since, self._quiet_since = carried

    def update(self, sample: dict, now: float, probe_in_use: bool = False) -> str:
        p = self.policy
        gpu = max((g.get("util_percent", 0) for g in sample.get("gpus", [])), default=0)
        busy = sample.get("foreign_cpu_percent", 0) > p.cpu_percent or gpu > p.gpu_percent
        self._busy_since = (self._busy_since or now) if busy else None
        reason = ""
        games = playing(sample.get("windows_apps", ()), p.games)
        if sample.get("users"):
            reason = f"{', '.join(sample['users'])} logged in"
        elif games:
            reason = f"{', '.join(games)} running"
        elif probe_in_use:
            reason = "the idle probe says in use"
        elif self._busy_since is not None and now - self._busy_since >= p.for_seconds:
            reason = f"other processes use {sample.get('foreign_cpu_percent', 0):.0f}% CPU" + (
                f" and {gpu}% GPU" if gpu else ""
            )
        if reason:
            self.state, self.reason, self._quiet_since = "in use", reason, None
        elif self.state == "in use":
            self._quiet_since = self._quiet_since or now
            if now - self._quiet_since >= p.idle_after_seconds:
                self.state, self.reason = "idle", ""
        return self.state


def playing(apps, games) -> list[str]:
    """The programs among ``apps`` (a Windows PC's, in its users' sessions) that mean a
    person plays: those in ``games`` (None: windows.DEFAULT_GAMES), as the PC names them."""
    if not apps:
        return []
    from .windows import DEFAULT_GAMES, running_games

    return running_games(
        [{"image": a, "session": 1} for a in apps], DEFAULT_GAMES if games is None else games
    )


def snapshot(policy: IdlePolicy, sample: dict) -> tuple[str, str]:
    """Idle or in use from one sample alone (a survey, not a watch): load above the
    thresholds counts as it stands, without waiting ``for_seconds``."""
    court = Courtesy(replace(policy, for_seconds=0), now=0)
    return court.update(sample, now=0), court.reason


def probe_in_use(command: str) -> bool:
    """A custom probe: exit code 0 means a person uses this machine."""
    if not command:
        return False
    try:
        return subprocess.run(command, shell=True, timeout=10, capture_output=True).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def main() -> None:
    """``python -m jupyter_lounge.telemetry [--windows]``: one sample of this machine as a
    JSON line (two looks a second apart, so the CPU of other processes is measured);
    ``--windows``: a Windows PC's WSL2 distro, its presence seen from Windows."""
    import json
    import sys

    presence = "windows" if sys.argv[1:] == ["--windows"] else "linux"
    tel = Telemetry(own_pid=os.getpid(), presence=presence)
    tel.sample()
    time.sleep(1.0)
    print(json.dumps(tel.sample()), flush=True)


if __name__ == "__main__":
    main()
