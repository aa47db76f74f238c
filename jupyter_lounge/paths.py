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
