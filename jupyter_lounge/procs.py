"""Processes: the one helper that runs commands, and the ways to find and end processes.

Every command failure becomes a LoungeError that quotes the command, its exit code and its
stderr, so a user reads what really went wrong.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from .errors import LoungeError, LoungeTimeout


async def call(cmd: Sequence[str], *, timeout: float = 30, input: bytes | None = None) -> str:
    """Run a command to completion; return stdout, or raise an error quoting it."""
    proc = await asyncio.create_subprocess_exec(
        *cmd,
        stdin=subprocess.PIPE if input else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(input), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise LoungeTimeout(f"`{shlex.join(cmd)}` did not finish within {timeout:g} s.") from None
    if proc.returncode != 0:
        raise LoungeError(
            f"`{shlex.join(cmd)}` failed with exit code {proc.returncode}: "
            f"{err.decode(errors='replace').strip() or '(no stderr)'}"
        )
    return out.decode(errors="replace")


def run(cmd: Sequence[str], *, timeout: float = 30) -> str:
    """The synchronous twin of ``call``: stdout, or a LoungeError quoting the command."""
    try:
        done = subprocess.run(
            list(cmd), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except FileNotFoundError:
        raise LoungeError(f"`{cmd[0]}` was not found: is it installed on this machine?") from None
    except subprocess.TimeoutExpired:
        raise LoungeTimeout(f"`{shlex.join(cmd)}` did not finish within {timeout:g} s.") from None
    if done.returncode != 0:
        raise LoungeError(
            f"`{shlex.join(cmd)}` failed with exit code {done.returncode}: "
            f"{done.stderr.strip() or '(no stderr)'}"
        )
    return done.stdout


def spawn(cmd: Sequence[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    """Start a long-lived process in its own session (it outlives the caller, and its whole
    process group can be signalled at once), with output appended to ``log``."""
    with open(log, "ab") as out:
        os.chmod(log, 0o600)
        return subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            close_fds=True,
        )


def alive(pid: int | None) -> bool:
    """True when ``pid`` runs and is not a zombie."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


async def kill_group(pid: int | None, *, grace: float = 5.0) -> None:
    """SIGTERM the process group led by ``pid``, then SIGKILL whatever is left after ``grace``."""
    if not pid:
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 2.0)
        while time.monotonic() < deadline:
            _reap(pid)
            if not alive(pid) and not group_members(pid):
                return
            await asyncio.sleep(0.05)


def group_members(pgid: int) -> list[int]:
    """Live processes in process group ``pgid``."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(entry))
    return out


def tail(path: Path | str, lines: int = 5) -> str:
    try:
        text = Path(path).read_text(errors="replace").strip().splitlines()
    except FileNotFoundError:
        return ""
    return "\n".join(text[-lines:])
