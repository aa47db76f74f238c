"""What runs inside an engine for ``map`` and ``%%lounge``: importable, so it pickles by name."""

from __future__ import annotations

import os
import pickle
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


def run_batch(key: str, batch: bytes, function: bytes | None = None, wait_s: float = 0.0) -> dict:
    """Run one batch of a map: ``fn(**item)`` for each dict item of the cloudpickled list
    ``batch``, ``fn(item)`` for any other, where ``fn`` is the map's function.

    The function travels once per node: ``function`` (its pickle) comes with the first batch
    to one engine of each node, which keeps it in memory and leaves a copy in the agent's
    private folder (``LOUNGE_SHARE_DIR``); its siblings' first batches say ``wait_s``: read
    that copy, waiting for it as long. Later batches name the function by ``key`` alone.

    Returns each item's result (pickled, and the list of them pickled once more) and
    seconds, the errors by position (an item's failure is its row, never the batch's: only an
    engine that died loses a batch), and where it ran;
    ``{"missing": key}`` when the function is not here (the driver sends it then).
    """
    import cloudpickle

    if not (isinstance(key, str) and len(key) == 16 and set(key) <= set("0123456789abcdef")):
        raise ValueError(f"not a map's function key: {key!r}")  # it names a file here
    fn = _functions.get(key)
    if fn is None:
        path = _shared(key)
        if function is None and path is not None:  # a sibling's copy (wait_s: for it)
            function = _wait_for(path, wait_s)
        elif function is not None and path is not None:
            _leave(path, function)
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
            result = fn(**item) if isinstance(item, dict) else fn(item)
        except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 - the item's own row
            # (an interrupt, `%lounge interrupt` or a cancelled run's, stops this item only:
            # the engine is fine, and the batch must not be taken for lost and rerun)
            results.append(None)
            tb = traceback.format_exc(limit=-3)
            errors[i] = f"{type(e).__name__}: {e}" + (f"\n{tb}" if tb else "")
        else:
            try:
                results.append(_pack(result))
            except Exception as e:  # noqa: BLE001 - a lock, a generator: say so in its row
                results.append(None)
                errors[i] = f"its result could not be pickled: {type(e).__name__}: {e}"
        seconds.append(clock() - start)
    return {
        # one blob: Dask would send a list of 20,000 small pickles as 20,000 frames
        "results": pickle.dumps(results, protocol=5),
        "seconds": seconds,
        "errors": errors,
        "engine": int(os.environ.get("LOUNGE_RANK", "-1")),
        "node": os.environ.get("LOUNGE_NODE", ""),
        "host": socket.gethostname(),
    }


def _pack(result) -> bytes:
    """A result as the run's store keeps it: pickled here, once, so the driver between this
    engine and the store never has to import what the result is made of."""
    try:
        return pickle.dumps(result, protocol=5)
    except Exception:  # noqa: BLE001 - a class made in the notebook: by value
        import cloudpickle

        return cloudpickle.dumps(result, protocol=5)


def _shared(key: str) -> str | None:
    folder = os.environ.get("LOUNGE_SHARE_DIR")
    return os.path.join(folder, f"map-{key}.pkl") if folder else None


def _leave(path: str, data) -> None:
    """A copy for the siblings: written whole, then renamed (a reader sees all or nothing);
    only the last few maps' copies are kept."""
    if os.path.exists(path):
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        folder = os.path.dirname(path)
        old = sorted(
            (p for p in os.listdir(folder) if p.startswith("map-") and p.endswith(".pkl")),
            key=lambda p: os.stat(os.path.join(folder, p)).st_mtime,
        )
        for name in old[:-KEEP_FUNCTIONS]:
            os.unlink(os.path.join(folder, name))
    except OSError:  # a full disk: the siblings get it over the network instead
        try:
            os.unlink(tmp)
        except OSError:
            pass


def _wait_for(path: str, wait_s: float) -> bytes | None:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.01)


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
