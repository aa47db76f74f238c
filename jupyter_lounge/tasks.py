"""What runs inside an engine for ``map`` and ``%%lounge``: importable, so it pickles by name.

A map's function travels as one *image*: its pickle (protocol 5) with the large buffers of
what it closes over (a NumPy array) kept out of band, each after the pickle's header, aligned
(``frame``). The image goes from the kernel to the run's folder, from the run driver to one
engine per node (one frame, no copy), and from that engine to its siblings as a file, which
each maps (copy-on-write: an array of the closure is read from the page cache where it lies,
and is writable as an unpickled one is); ``pickle.loads(header, buffers=...)`` copies none.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import socket
import struct
import time
import traceback

_namespace: dict = {"__name__": "__lounge__"}


#: The functions of the maps this engine ran, by the hash of their pickle: each is shipped
#: and unpickled once per engine, not once per item (a closure may hold a 40 MB array).
_functions: dict[str, object] = {}
KEEP_FUNCTIONS = 4
#: How many times a map's function was unpickled here (what tests count).
loads: dict[str, int] = {}


MAGIC = b"LNGFN01\n"
ALIGN = 64  # each part starts at a multiple of this (a mapped array is aligned)


# -- the function's image ----------------------------------------------------------------------
def pack(fn) -> list:
    """``fn`` pickled (protocol 5): the header, then each large buffer, out of band."""
    import cloudpickle

    buffers: list = []
    header = cloudpickle.dumps(fn, protocol=5, buffer_callback=buffers.append)
    return [header, *(b.raw() for b in buffers)]


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def frame(parts: list) -> list:
    """The pieces of the image of ``parts`` (header and buffers), padding included, to write
    or join: the magic, the number and sizes of the parts, then each part, aligned."""
    sizes = [memoryview(p).nbytes for p in parts]
    head = MAGIC + struct.pack(f"<Q{len(sizes)}Q", len(sizes), *sizes)
    pieces, at = [head], len(head)
    for part, size in zip(parts, sizes):
        pad = _align(at) - at
        pieces += [b"\0" * pad, part]
        at += pad + size
    return pieces


def unframe(image) -> list[memoryview]:
    """The parts of an image (views into it, no copy); a ValueError if it is not one."""
    view = memoryview(image).cast("B")
    if bytes(view[:8]) != MAGIC:
        raise ValueError("not a map function's image")
    (n,) = struct.unpack_from("<Q", view, 8)
    sizes = struct.unpack_from(f"<{n}Q", view, 16)
    parts, at = [], 16 + 8 * n
    for size in sizes:
        at = _align(at)
        parts.append(view[at : at + size])
        at += size
    if at > len(view):
        raise ValueError("a map function's image cut short")
    return parts


def key_of(pieces) -> str:
    """The function's key: the hash of its image (the engines keep it by that)."""
    h = hashlib.sha256()
    for piece in pieces:
        h.update(piece)
    return h.hexdigest()[:16]


def write_image(path: str, pieces: list, sync: bool) -> None:
    """Write an image (``frame``'s pieces) to ``path``, owner-only: to a temporary name, then
    renamed (a reader sees all of it or nothing); ``sync``: on disk before it is renamed."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            for piece in pieces:
                f.write(piece)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def map_image(path: str, writable: bool = False):
    """The image in ``path``, mapped (no copy); ``writable``: copy-on-write, private."""
    import mmap

    with open(path, "rb") as f:
        access = mmap.ACCESS_COPY if writable else mmap.ACCESS_READ
        return memoryview(mmap.mmap(f.fileno(), 0, access=access))


def load(image):
    """The function of an image; its buffers are views into it (keep it writable)."""
    parts = unframe(image)
    return pickle.loads(parts[0], buffers=parts[1:])


def run_batch(key: str, batch: bytes, function=None, wait_s: float = 0.0) -> dict:
    """Run one batch of a map: ``fn(**item)`` for each dict item of the cloudpickled list
    ``batch``, ``fn(item)`` for any other, where ``fn`` is the map's function.

    The function travels once per node: ``function`` (its image) comes with the first batch
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
        elif function is not None:  # mapped from the node's copy, else a writable copy
            function = (
                map_image(path, writable=True)
                if path is not None and _leave(path, function)
                else bytearray(function)
            )
        if function is None:
            return {"missing": key}
        fn = _functions[key] = load(function)
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
    return shared_path(folder, key) if folder else None


def shared_path(folder: str, key: str) -> str:
    """Where the engines of an agent whose private folder is ``folder`` look for the copy of
    a map's function (their ``LOUNGE_SHARE_DIR``)."""
    return os.path.join(folder, f"map-{key}.pkl")


def prune(folder: str) -> None:
    """Keep the last few maps' copies in ``folder`` (one removed stays readable to an engine
    that mapped it)."""
    old = sorted(
        (p for p in os.listdir(folder) if p.startswith("map-") and p.endswith(".pkl")),
        key=lambda p: os.stat(os.path.join(folder, p)).st_mtime,
    )
    for name in old[:-KEEP_FUNCTIONS]:
        try:
            os.unlink(os.path.join(folder, name))
        except FileNotFoundError:
            pass


def _leave(path: str, image) -> bool:
    """A copy for the siblings (written whole, then renamed: a reader sees all or nothing);
    whether it is there. Only the last few maps' copies are kept (``prune``)."""
    if os.path.exists(path):
        return True
    try:
        write_image(path, [image], sync=False)
        prune(os.path.dirname(path))
    except OSError:  # a full disk: the siblings get it over the network instead
        return os.path.exists(path)
    return True


def _wait_for(path: str, wait_s: float):
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return map_image(path, writable=True)
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
