"""What runs inside an engine for ``map`` and ``%%lounge``: importable, so it pickles by name."""

from __future__ import annotations

import os
import socket
import time
import traceback

_namespace: dict = {"__name__": "__lounge__"}


def run_item(payload: bytes) -> dict:
    """Run ``fn(*args, **kwargs)`` from a cloudpickled payload; report where and how long.

    A user error is returned as text (not raised), so a retry only ever repeats an item
    whose engine died, never one that failed on its own.
    """
    import cloudpickle

    fn, args, kwargs = cloudpickle.loads(payload)
    start = time.perf_counter()
    result, error = None, None
    try:
        result = fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - the item's failure becomes its row
        error = f"{type(e).__name__}: {e}"
        tb = traceback.format_exc(limit=-3)
        error = f"{error}\n{tb}" if tb else error
    return {
        "result": result,
        "error": error,
        "engine": int(os.environ.get("LOUNGE_RANK", "-1")),
        "node": os.environ.get("LOUNGE_NODE", ""),
        "host": socket.gethostname(),
        "seconds": time.perf_counter() - start,
    }


def exec_cell(code: str) -> str:
    """Execute a cell in this worker's persistent namespace; return what it printed."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            exec(compile(code, "<lounge cell>", "exec"), _namespace)
        except Exception:  # noqa: BLE001 - shown to the user like a cell error
            traceback.print_exc()
    return out.getvalue()
