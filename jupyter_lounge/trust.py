"""Folders we trust: ours, not writable by anyone else, not a symbolic link.

Engines run whatever their cluster sends them, and the files in these folders (connection
files and keys, specs, synced environments) decide what that is. So a folder another user made
first (``/var/tmp/lounge`` on a shared PC), a symlink pointing elsewhere, or a folder inside a
folder someone else can rename things in, is refused with a sentence naming the path and the
fix, never used. The rules follow OpenSSH's StrictModes.

Standard library only, and no import of this package: the node side of ``lounge sync`` sends
this file's source to nodes that have nothing but a base Python.
"""

from __future__ import annotations

import os
import stat


class UntrustedPath(Exception):
    """A folder we will not use; the message names it and what to do."""


def _owner(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def check_private_dir(path: str, what: str) -> None:
    """Raise UntrustedPath unless ``path`` is a real folder of ours that nobody else can change,
    inside folders that only we or root can rename things in."""
    me = os.geteuid()
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise UntrustedPath(f"The {what} {path} does not exist.") from None
    if stat.S_ISLNK(st.st_mode):
        raise UntrustedPath(
            f"The {what} {path} is a symbolic link, which is not trusted: remove the link and "
            "let it be made again, or point the setting at the real folder."
        )
    if not stat.S_ISDIR(st.st_mode):
        raise UntrustedPath(f"The {what} {path} is not a folder: remove it or choose another path.")
    if st.st_uid != me:
        raise UntrustedPath(
            f"The {what} {path} belongs to {_owner(st.st_uid)}, not to you ({_owner(me)}): "
            "another user made it first, so it is not used; remove it (as its owner or root) or "
            "choose another path."
        )
    if st.st_mode & 0o022:
        raise UntrustedPath(
            f"The {what} {path} can be changed by other users (mode {st.st_mode & 0o7777:04o}): "
            f"run `chmod go-w {path}`."
        )
    parent = os.path.dirname(os.path.realpath(path))
    while True:
        st = os.stat(parent)
        if st.st_uid not in (0, me):
            raise UntrustedPath(
                f"The {what} {path} is inside {parent}, which belongs to {_owner(st.st_uid)}: "
                "they could swap the folder for their own; choose a path inside folders owned "
                "by you or root."
            )
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise UntrustedPath(
                f"The {what} {path} is inside {parent}, which other users can change "
                f"(mode {st.st_mode & 0o7777:04o}, no sticky bit): choose a path elsewhere, "
                f"or run `chmod go-w {parent}`."
            )
        if parent == os.path.dirname(parent):
            return
        parent = os.path.dirname(parent)


def private_dir(path: str, what: str) -> str:
    """Make ``path`` (mode 0700, parents as needed) unless it exists, then check it as
    ``check_private_dir`` does. Made first by someone else in between: refused, not used."""
    parent = os.path.dirname(path.rstrip("/")) or "."
    os.makedirs(parent, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    check_private_dir(path, what)
    return path
