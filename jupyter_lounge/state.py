"""Cluster state files: JSON in the Jupyter runtime dir, written atomically, mode 0600.

Every process (a kernel, the CLI, later the Jupyter server) finds clusters here, so a cluster
started in one place is visible and controllable from all the others.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path

from .errors import LoungeError
from .paths import lounge_dir
from .protocol import read_json, write_json  # noqa: F401 - the core's JSON files are atomic too
from .trust import UntrustedPath, private_dir

#: Cluster names: anchored with \Z, since ``$`` would also accept a trailing newline.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")


class CorruptState(LoungeError):
    """A state file that cannot be read or parsed; ``lounge stop NAME --forget`` removes it."""


def check_name(name: str, what: str = "Cluster") -> str:
    """``name`` if it is a valid cluster (or, ``what``, run) name, else the sentence why."""
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise LoungeError(
            f"{what} name {name!r} is not valid: use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit."
        )
    return name


def cluster_dir(name: str) -> Path:
    """Private folder of one cluster: connection files, keys, agent specs, reports and logs."""
    path = str(lounge_dir() / check_name(name))
    try:
        private_dir(path, "cluster folder")
    except UntrustedPath as e:
        raise LoungeError(str(e)) from None
    return Path(path)


def state_path(name: str) -> Path:
    return lounge_dir() / f"{check_name(name)}.json"


def save_state(name: str, data: dict) -> None:
    write_json(state_path(name), data)


def load_state(name: str) -> dict | None:
    """The state of cluster ``name``, None when there is none, CorruptState when its file
    cannot be read or is not a state file."""
    path = state_path(name)
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise CorruptState(_corrupt(name, path, f"{type(e).__name__}: {e}")) from None
    if not isinstance(data, dict) or data.get("name") != name or "created" not in data:
        raise CorruptState(_corrupt(name, path, "it is not a cluster state file"))
    return data


def _corrupt(name: str, path: Path, why: str) -> str:
    return (
        f"The state file of cluster {name!r} ({path}) cannot be used ({why}): remove it with "
        f"`lounge stop {name} --forget`."
    )


def remove_state(name: str, keep_runs: bool = False) -> None:
    """Remove a cluster's state file and folder; with ``keep_runs``, all of the folder but
    its runs (``runs/``: a stopped cluster's runs stay readable until ``--forget``)."""
    import shutil

    try:
        state_path(name).unlink()
    except FileNotFoundError:
        pass
    folder = lounge_dir() / check_name(name)
    if folder.is_symlink():  # never follow it: remove the link, not what it points to
        folder.unlink()
    elif keep_runs and (folder / "runs").is_dir() and not (folder / "runs").is_symlink():
        for part in folder.iterdir():
            if part.name == "runs":
                continue
            if part.is_dir() and not part.is_symlink():
                shutil.rmtree(part, ignore_errors=True)
            else:
                try:
                    part.unlink()
                except OSError:
                    pass
    else:
        shutil.rmtree(folder, ignore_errors=True)


def _names() -> list[str]:
    return sorted(p.stem for p in lounge_dir().glob("*.json") if NAME_RE.match(p.stem))


def list_states() -> list[dict]:
    """Every readable cluster state, in name order (see ``corrupt_states`` for the rest)."""
    out = []
    for name in _names():
        try:
            data = load_state(name)
        except CorruptState:
            continue
        if data is not None:
            out.append(data)
    return out


def corrupt_states() -> list[dict]:
    """name, path and the sentence saying why, for each state file that cannot be used."""
    out = []
    for name in _names():
        try:
            load_state(name)
        except CorruptState as e:
            out.append({"name": name, "path": str(state_path(name)), "error": str(e)})
    return out


@contextlib.contextmanager
def names_locked():
    """Hold the lounge folder's lock: one process at a time checks a name and claims it, so
    of two starts of one name, one wins and the other is told it is in use."""
    import fcntl

    fd = os.open(lounge_dir() / ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
