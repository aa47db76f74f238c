"""Cluster state files: JSON in the Jupyter runtime dir, written atomically, mode 0600.

Every process (a kernel, the CLI, later the Jupyter server) finds clusters here, so a cluster
started in one place is visible and controllable from all the others.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from .errors import LoungeError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def lounge_dir() -> Path:
    """The root of all state: ``$JUPYTER_LOUNGE_DIR`` or ``<jupyter runtime dir>/lounge``."""
    root = os.environ.get("JUPYTER_LOUNGE_DIR")
    if not root:
        from jupyter_core.paths import jupyter_runtime_dir

        root = os.path.join(jupyter_runtime_dir(), "lounge")
    path = Path(root)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise LoungeError(
            f"Cluster name {name!r} is not valid: use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit."
        )
    return name


def cluster_dir(name: str) -> Path:
    """Private folder of one cluster: connection files, agent specs, reports and logs."""
    path = lounge_dir() / check_name(name)
    path.mkdir(mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def state_path(name: str) -> Path:
    return lounge_dir() / f"{check_name(name)}.json"


def write_json(path: Path | str, data: Any) -> None:
    """Write JSON atomically with mode 0600: readers see the old or the new file, never half."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def read_json(path: Path | str) -> dict | None:
    """The parsed file, or None when it is missing or caught mid-creation."""
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def save_state(name: str, data: dict) -> None:
    write_json(state_path(name), data)


def load_state(name: str) -> dict | None:
    return read_json(state_path(name))


def remove_state(name: str) -> None:
    import shutil

    try:
        state_path(name).unlink()
    except FileNotFoundError:
        pass
    shutil.rmtree(lounge_dir() / check_name(name), ignore_errors=True)


def list_states() -> list[dict]:
    out = []
    for path in sorted(lounge_dir().glob("*.json")):
        data = read_json(path)
        if data and data.get("name") == path.stem:
            out.append(data)
    return out
