"""What runs inside an engine for ``map`` and ``%%lounge``: importable, so it pickles by name."""

from __future__ import annotations

import os
import socket
import time
import traceback

_namespace: dict = {"__name__": "__lounge__"}


#: The functions of the maps this engine ran, by the hash of their pickle: each is shipped
#: and unpickled once per engine, not once per item (a closure may hold a 40 MB array).
_functions: dict[str, object] = {}
KEEP_FUNCTIONS = 4
#: How many times a map's function was unpickled here (what tests count).
loads: dict[str, int] = {}


def run_batch(key: str, batch: bytes, function: bytes | None = None) -> dict:
    """Run one batch of a map: ``fn(**item)`` for each dict item of the cloudpickled list
    ``batch``, ``fn(item)`` for any other, where ``fn`` is the map's function (``function``:
    its pickle, sent with the first batch to each engine; later batches name it by ``key``
    alone).

    Returns each item's result and seconds, the errors by position (an item's failure is
    its row, never the batch's: only an engine that died loses a batch), and where it ran.
    ``{"missing": key}`` when the function is not here (the driver sends it again).
    """
    import cloudpickle

    fn = _functions.get(key)
    if fn is None:
        if function is None:
            return {"missing": key}
        fn = _functions[key] = cloudpickle.loads(function)
        loads[key] = loads.get(key, 0) + 1
        while len(_functions) > KEEP_FUNCTIONS:
            _functions.pop(next(iter(_functions)))
    items = cloudpickle.loads(batch)
    results, seconds, errors = [], [], {}
    clock = time.perf_counter
    for i, item in enumerate(items):
        start = clock()
        try:
            results.append(fn(**item) if isinstance(item, dict) else fn(item))
        except Exception as e:  # noqa: BLE001 - the item's failure becomes its row
            results.append(None)
            tb = traceback.format_exc(limit=-3)
            errors[i] = f"{type(e).__name__}: {e}" + (f"\n{tb}" if tb else "")
        seconds.append(clock() - start)
    return {
        "results": results,
        "seconds": seconds,
        "errors": errors,
        "engine": int(os.environ.get("LOUNGE_RANK", "-1")),
        "node": os.environ.get("LOUNGE_NODE", ""),
        "host": socket.gethostname(),
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
