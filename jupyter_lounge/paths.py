"""Where this machine keeps the lounge's files: clusters' state, and what was synced where."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import LoungeError
from .trust import UntrustedPath, private_dir


def lounge_dir() -> Path:
    """The root of all state: ``$JUPYTER_LOUNGE_DIR`` or ``<jupyter runtime dir>/lounge``;
    made 0700 when missing, refused when someone else could change it."""
    root = os.environ.get("JUPYTER_LOUNGE_DIR")
    if not root:
        from jupyter_core.paths import jupyter_runtime_dir

        root = os.path.join(jupyter_runtime_dir(), "lounge")
    root = os.path.abspath(os.path.expanduser(root))
    if any(ord(c) < 32 or ord(c) == 127 for c in root):
        raise LoungeError(
            f"The lounge folder {root!r} has a control character in its path: set "
            "JUPYTER_LOUNGE_DIR to a plain path."
        )
    try:
        private_dir(root, "lounge folder")
    except UntrustedPath as e:
        raise LoungeError(str(e)) from None
    return Path(root)


#: Linux keeps a Unix socket's path to 107 bytes; a cluster folder's path can be longer (it
#: holds the user's lounge folder and the cluster's name), so its sockets get a folder of
#: their own with a short path, leaving this much room for a socket's name.
SOCKET_PATH_MAX = 107
SOCKET_NAME_ROOM = 48


def make_socket_dir() -> str:
    """A new folder for a local cluster's Unix sockets: a random name, 0700 (no other user
    can reach a socket in it), in ``$XDG_RUNTIME_DIR`` (the user's own) where that is
    short enough, else in the temporary folder."""
    import tempfile

    for base in (os.environ.get("XDG_RUNTIME_DIR"), tempfile.gettempdir()):
        if base and os.path.isdir(base) and len(base) + 16 + SOCKET_NAME_ROOM <= SOCKET_PATH_MAX:
            return tempfile.mkdtemp(prefix="lounge-", dir=base)
    raise LoungeError(
        f"No folder with a path short enough for Unix sockets: set TMPDIR to a short path "
        f"(at most {SOCKET_PATH_MAX - 16 - SOCKET_NAME_ROOM} characters)."
    )


def remove_socket_dir(path: str) -> None:
    """Remove a folder make_socket_dir made (never a link, nor a folder of someone else)."""
    import shutil
    import stat

    try:
        info = os.lstat(path)
    except OSError:
        return
    if (
        stat.S_ISDIR(info.st_mode)
        and info.st_uid == os.getuid()
        and os.path.basename(path).startswith("lounge-")
    ):
        shutil.rmtree(path, ignore_errors=True)
