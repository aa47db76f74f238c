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
        said = output_text(err).strip() or output_text(out).strip()  # wsl.exe says it on stdout
        raise LoungeError(
            f"`{shlex.join(cmd)}` failed with exit code {proc.returncode}: {said or '(no output)'}"
        )
    return out.decode(errors="replace")


def output_text(data: bytes) -> str:
    """Output as text; Windows' wsl.exe writes UTF-16LE (a NUL after every ASCII letter)."""
    if data.count(0) > len(data) // 4:
        if data[:1] == b"\x00":  # a line cut after "\n", before its NUL
            data = data[1:]
        return data.decode("utf-16-le", errors="replace")
    return data.decode(errors="replace")


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


def alive(pid: int | None, start: str | None = None) -> bool:
    """True when ``pid`` runs and is not a zombie; with ``start`` (see ``started``), only when
    it is still the very process recorded then, not a stranger that got its pid later."""
    if not pid:
        return False
    fields = _stat(pid)
    if fields is None or fields[0] == "Z":
        return False
    return start is None or _identity(fields) == start


def ours(pid: int | None, start: str | None) -> bool:
    """True when the process recorded as (``pid``, ``start``) still runs; a record without a
    start time is trusted with nothing."""
    return bool(start) and alive(pid, start)


def started(pid: int) -> str | None:
    """What tells this process apart from any later one with the same pid: the boot it runs
    in and its start time (clock ticks since boot). None when it is gone."""
    fields = _stat(pid)
    return None if fields is None else _identity(fields)


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None."""
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return None


_boot_id: str | None = None


def _identity(fields: list[str]) -> str:
    global _boot_id
    if _boot_id is None:
        try:
            with open("/proc/sys/kernel/random/boot_id") as f:
                _boot_id = f.read().strip()
        except OSError:
            _boot_id = "?"
    return f"{_boot_id}:{fields[19]}"  # field 22 of stat: starttime


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


async def kill_group(pid: int | None, start: str | None, *, grace: float = 5.0) -> None:
    """SIGTERM the process group led by ``pid``, then SIGKILL whatever is left after ``grace``.

    ``start`` is what ``started(pid)`` said when the leader was spawned: if a process with
    that pid runs now but is another one (the pid was reused, e.g. after a reboot), nothing
    is signalled. A group whose leader has exited keeps its members: while any is left,
    Linux gives that pid to no new process, so the group is still the one we started.
    """
    if not pid or start is None:
        return
    now = started(pid)
    if now is not None and now != start:
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
