"""Shipping a tree of files to nodes by content: the sender's side of ``lounge sync`` and
``lounge stage`` (treestore.py and ``envstore.put`` are the node's).

One SSH session per node runs the node program's ``put``; the conversation on it:

1. the node says whether it has the tree already (an environment, by fingerprint) and which
   trees it keeps manifests of;
2. we send the manifest, to each node as soon as it has answered (the others may still be
   starting): only what changed since one of those trees when we remember its manifest
   (``<lounge dir>/cache/trees``), else all of it; the node checks the result adds up to the
   tree's id. The change from the tree we shipped last, the likely base, is made while the
   nodes start;
3. the node says which objects (files, by content) it lacks, and whether its disk has room;
4. we send them: a node that lacks a few (``AT_ONCE``: a MiB) gets them as soon as it says so,
   while the others may still be starting; otherwise, once every node has said, nodes that
   lack the same objects get one stream, written to all their sessions at once, with a
   progress bar per stream (bytes and files); each file is hashed
   again as it is read and sent, and followed by a word saying it is what was hashed (the
   node keeps it) or not (the node drops it and the sync fails, saying which file): checked
   once here for all the nodes, and SSH keeps it intact on the way;
5. the node links the tree in place and says so.

Files are hashed once: ``<lounge dir>/cache/hashes-<what>.json`` remembers each path's sha256
by its size, mtime and inode; an installed file as pip left it takes its hash from its
RECORD (``record_hashes``). The stream is written in writes of about a MiB and read through a
buffer on the node: a virtualenv is some 50,000 files, mostly small.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import select
import stat
import subprocess
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from . import envstore, treestore
from .errors import LoungeError
from .protocol import read_json, write_json

HELLO_S = 60.0  # the node program to start and look (ssh, python, the store's lock)
MANIFEST_S = 300.0  # the node to check a manifest's objects against its store
FINISH_S = 600.0  # the node to link the tree and remove old ones
CHUNK = 1 << 20
WRITE_AHEAD = 16  # frames queued per node (at most CHUNK each)
TREES_KEPT = 16  # manifests remembered here, the newest
AT_ONCE = CHUNK  # a node lacking at most these bytes gets them as soon as it says so
UNREADABLE = "could not be read here"


@dataclass
class Tree:
    """What to ship: the manifest's entries, its id, and where each object's bytes are."""

    entries: list
    id: str
    sources: dict[str, str] = field(default_factory=dict)  # object key -> a local path
    sizes: dict[str, int] = field(default_factory=dict)  # object key -> bytes
    mtimes: dict[str, int] = field(default_factory=dict)
    #: object key -> (path, its stat's stamp) for files hashed by this scan, unchanged since
    #: long enough before it: sent without a second hash while they stay so (``unchanged``)
    read: dict[str, tuple[str, tuple]] = field(default_factory=dict)

    @property
    def files(self) -> int:
        return sum(1 for e in self.entries if e[1] == "f")

    @property
    def bytes(self) -> int:
        return sum(e[3] for e in self.entries if e[1] == "f")


def _cache_dir() -> Path:
    from .paths import lounge_dir

    path = lounge_dir() / "cache"
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


RACY_NS = 2 * 10**9  # a file changed this close before it was hashed may change unseen


def _stamp(st: os.stat_result) -> tuple:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def unchanged(tree: Tree, key: str, path: str, st: os.stat_result) -> bool:
    """Whether ``path``, as ``st`` says now, is what this tree's scan hashed as ``key``: the
    same file, its size and times (its change time is set by the kernel on every write and
    cannot be set back) as then, when they were already older than the scan by ``RACY_NS``
    (a write right after the scan's stat could leave equal times on a coarse clock: such a
    file is hashed again as it is sent, as git's index does with a "racy" file)."""
    read = tree.read.get(key)
    return read is not None and read[0] == path and read[1] == _stamp(st)


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def scan(pairs, private: bool, what: str, trusted: dict | None = None) -> Tree:
    """The tree of ``pairs`` ((name in the tree, local path), folders before what is in them):
    files hashed unless their size, mtime and inode are as when last hashed, or ``trusted``
    (path -> (size, sha256, mtime_ns): what a RECORD says, see ``record_hashes``) gives
    their hash and they have its size and were not changed since. Every file sent is checked
    against its hash as it is read (``_send_objects``), but one hashed here and unchanged
    since (``unchanged``). ``private``: the owner alone may read
    it on the node (data sets); else others may read, not change it. Every file is
    read-only on the node (its object is shared by every tree that has it)."""
    cache_path = _cache_dir() / f"hashes-{what}.json"
    cache = read_json(cache_path) or {}
    hits = 0  # files whose hash the cache gave: when every file's did, it is rewritten only
    # if some of its files are gone
    file_mask, dir_mask = (0o500, 0o700) if private else (0o555, 0o755)
    entries, tree = [], Tree([], "")
    unknown = []  # (entry, path, stamp) of files whose hash is not known yet
    stamps = {}  # path -> its stat's stamp, of files old enough to be trusted while it holds
    settled = time.time_ns() - RACY_NS
    sources, sizes, mtimes = tree.sources, tree.sizes, tree.mtimes
    lstat, get, S_IFMT, S_IFREG, S_IFDIR = (
        os.lstat,
        cache.get,
        stat.S_IFMT,
        stat.S_IFREG,
        stat.S_IFDIR,
    )
    fresh = {}
    for name, path in pairs:  # (a loop run for every file: kept to what each one needs)
        st = lstat(path)
        mode = st.st_mode
        kind = S_IFMT(mode)
        if kind == S_IFREG:
            path = str(path)
            size, mtime_ns, ino = st.st_size, st.st_mtime_ns, st.st_ino
            entry = [name, "f", (mode & file_mask) | 0o400, size, "", int(st.st_mtime)]
            entries.append(entry)
            known = get(path)
            if known and known[0] == size and known[1] == mtime_ns and known[2] == ino:
                sha = entry[4] = known[3]
                hits += 1
            elif (
                (said := trusted and trusted.get(path))
                and said[0] == size
                and (mtime_ns <= said[2])
            ):
                sha = entry[4] = said[1]
            else:
                unknown.append((entry, path, [size, mtime_ns, ino]))
                if st.st_ctime_ns < settled and mtime_ns < settled:
                    stamps[path] = _stamp(st)
                continue
            fresh[path] = [size, mtime_ns, ino, sha]
            key = f"{sha}.{entry[2]:o}"  # treestore.object_key
            if key not in sources:
                sources[key], mtimes[key] = path, entry[5]
            sizes[key] = size
        elif kind == S_IFDIR:
            entries.append([name, "d", (mode & dir_mask) | 0o700, 0, "", int(st.st_mtime)])
        elif kind == stat.S_IFLNK:
            entries.append([name, "l", 0, 0, os.readlink(path), int(st.st_mtime)])
    if unknown:  # hashlib lets go of the GIL: one thread per core, each with its share
        from concurrent.futures import ThreadPoolExecutor

        n = min(os.cpu_count() or 1, len(unknown))
        with ThreadPoolExecutor(n) as pool:
            for i, shas in enumerate(pool.map(_hash_all, [unknown[i::n] for i in range(n)])):
                for (entry, _, _), sha in zip(unknown[i::n], shas):
                    entry[4] = sha
        for entry, path, stamp in unknown:  # (in the scan's order: the first path of a
            fresh[path] = [*stamp, entry[4]]  # content is its source, as above)
            key = treestore.object_key(entry)
            if key not in sources:
                sources[key], mtimes[key] = path, entry[5]
            sizes[key] = entry[3]
    tree.read = {key: (path, stamps[path]) for key, path in sources.items() if path in stamps}
    if unknown or hits != len(cache):
        write_json(cache_path, fresh, compact=True)
    tree.entries, tree.id = entries, treestore.tree_id(entries)
    return tree


def _hash_all(files: list) -> list[str]:
    return [sha256_file(path) for _, path, _ in files]


def record_hashes(site: str) -> dict[str, tuple[int, str, int]]:
    """What the RECORDs of the distributions installed in ``site`` say of their files: path ->
    (size, sha256 in hex, the RECORD's mtime). pip writes a RECORD after the files it lists,
    so a file with that size and no later mtime is as installed (rsync trusts size and mtime
    the same way); ``lounge sync --force`` reads every file instead."""
    import base64
    import csv

    said = {}
    for record in Path(site).glob("*.dist-info/RECORD"):
        try:
            written = record.stat().st_mtime_ns
            with open(record, newline="", encoding="utf-8") as f:
                rows = list(csv.reader(f))
        except (OSError, UnicodeDecodeError, csv.Error):
            continue
        for row in rows:
            if len(row) != 3 or not row[1].startswith("sha256=") or not row[2].isdigit():
                continue
            try:
                sha = base64.urlsafe_b64decode(row[1][7:] + "=" * (-len(row[1][7:]) % 4)).hex()
            except ValueError:
                continue
            if len(sha) == 64:
                said[os.path.normpath(os.path.join(site, row[0]))] = (int(row[2]), sha, written)
    return said


def folder_pairs(root: Path):
    """(name, path) of everything under ``root``, sorted, folders before their contents."""
    from .sync import _walk

    yield from _walk(str(root), "", set())


_TREES: dict = {}  # the last two trees remembered, in memory: id -> entries


def remember(tree: Tree) -> None:
    """Keep the manifest of ``tree`` (a node that has it gets the next one as a delta)."""
    _TREES.pop(tree.id, None)  # (then last: the newest)
    _TREES[tree.id] = tree.entries
    while len(_TREES) > 2:
        _TREES.pop(next(iter(_TREES)), None)
    folder = _cache_dir() / "trees"
    folder.mkdir(mode=0o700, exist_ok=True)
    path = folder / f"{tree.id}.z"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(treestore.pack(tree.entries))
        os.replace(tmp, path)
    os.utime(path)
    kept = sorted(folder.glob("*.z"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in kept[TREES_KEPT:]:
        old.unlink(missing_ok=True)


def newest_remembered() -> str | None:
    """The id of the tree remembered last: the likely base of the next sync's delta."""
    if _TREES:
        return next(reversed(_TREES))
    try:
        with os.scandir(_cache_dir() / "trees") as found:
            times = {e.name[:-2]: e.stat().st_mtime for e in found if e.name.endswith(".z")}
    except OSError:
        return None
    return max(times, key=times.get, default=None)


def recalled(tid: str) -> list | None:
    if (entries := _TREES.get(tid)) is not None:
        return entries
    path = _cache_dir() / "trees" / f"{tid}.z"
    try:
        return treestore.unpack(path.read_bytes())
    except (OSError, ValueError, zlib.error):
        return None


def joined(*parts: Tree) -> Tree:
    """One tree of the entries of these (whose names do not meet)."""
    first, rest = parts[0], parts[1:]
    tree = Tree([e for part in parts for e in part.entries], "", dict(first.sources),
                dict(first.sizes), dict(first.mtimes), dict(first.read))  # fmt: skip
    for part in rest:
        for key, path in part.sources.items():
            tree.sources.setdefault(key, path)
        tree.sizes.update(part.sizes)
        for key, read in part.read.items():
            tree.read.setdefault(key, read)
        for key, mtime in part.mtimes.items():
            tree.mtimes.setdefault(key, mtime)
    tree.id = treestore.tree_id(tree.entries)
    return tree


# A part of a tree as last scanned (the installed part of the environment), kept here by a key
# that says what it was made from: one kept, the newest; and in memory, for the next sync
# from the same process (a notebook's).
_PART: dict = {}


def _parts_dir() -> Path:
    folder = _cache_dir() / "parts"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


def remember_part(key: str, where: str, part: Tree) -> None:
    """Keep ``part``, a scan of the folder ``where`` (its entries' names are paths below it)."""
    folder = _parts_dir()
    tmp = folder / f"{key}.tmp"
    tmp.write_bytes(treestore.pack({"where": where, "entries": part.entries}))
    os.replace(tmp, folder / f"{key}.z")
    forget_parts(but=f"{key}.z")
    _PART.update(key=key, where=where, part=part)


def recalled_part(key: str, where: str) -> Tree | None:
    """The part remembered under ``key`` for the folder ``where``, or None."""
    if _PART.get("key") == key and _PART.get("where") == where:
        return _PART["part"]
    try:
        data = treestore.unpack((_parts_dir() / f"{key}.z").read_bytes())
    except (OSError, ValueError, zlib.error):
        return None
    if not isinstance(data, dict) or data.get("where") != where:
        return None
    part = Tree(data["entries"], "")
    for e in part.entries:  # what scan() keeps beside the entries, made again from them
        if e[1] == "f":
            key_ = treestore.object_key(e)
            if key_ not in part.sources:
                part.sources[key_], part.mtimes[key_] = f"{where}/{e[0]}", e[5]
            part.sizes[key_] = e[3]
    _PART.update(key=key, where=where, part=part)
    return part


def forget_parts(but: str = "") -> None:
    """Forget the remembered parts (a file in one changed after all: ``ship`` calls it): the
    next build walks."""
    if not but:
        _PART.clear()
    for path in _parts_dir().iterdir():
        if path.name != but:
            path.unlink(missing_ok=True)


class Session:
    """One node's SSH session running the node program's ``put``."""

    def __init__(self, name: str, command: list[str], first: bytes):
        self.name = name
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        envstore.widen_pipe(self.proc.stdin.fileno())
        self.buf = b""
        self.failed: str | None = None
        self.sent = 0
        self.send(first + envstore.program())
        self.flush()  # all of it now: the node starts while the others are still answering
        self.program = self.sent

    def flush(self) -> None:
        try:
            self.proc.stdin.flush()
        except (OSError, ValueError):
            pass

    def send(self, data: bytes) -> None:
        if self.failed:
            return
        try:
            self.proc.stdin.write(data)
            self.sent += len(data)
        except (OSError, ValueError):  # a broken pipe, or closed meanwhile
            self.fail(self._said() or "the SSH session ended")

    def frame(self, kind: bytes, payload: bytes) -> None:
        self.send(envstore.frame(kind, payload))

    def answer(self, timeout: float, doing: str, deadline: float = 0.0) -> dict | None:
        """The node's next line, parsed; None (and ``failed`` says why) when there is none
        within ``timeout`` s (or by ``deadline``, when given: a wait that began earlier)."""
        if self.failed:
            return None
        self.flush()
        deadline = deadline or time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.fail(f"no answer within {timeout:g} s while {doing}")
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                self.fail(self._said() or "the SSH session ended")
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            self.fail(f"the node answered {line[-200:]!r}")
            return None

    def _said(self) -> str:
        try:
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        try:
            exited(self.proc, 10)
            err = self.proc.stderr.read().decode(errors="replace").strip()
        except subprocess.TimeoutExpired:
            self.proc.kill()
            err = ""
        if self.proc.returncode == 127:
            return "exit code 127"
        return err.splitlines()[-1] if err else ""

    def fail(self, why: str) -> None:
        if not self.failed:
            self.failed = why
            self.close()

    def end(self) -> None:
        """Close the node's input: it ends (``close`` waits for it)."""
        try:
            self.proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass

    def close(self) -> None:
        self.end()
        try:
            exited(self.proc, 10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def exited(proc: subprocess.Popen, timeout: float) -> int:
    """``proc.wait(timeout)`` told by the kernel the moment it exits (a pidfd), where
    Popen.wait polls with sleeps that grow to 50 ms: the end of a sync waited on each node's
    ssh in turn, up to tens of ms after the last had gone."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # reaped already, or no pidfd here
        return proc.wait(timeout)
    try:
        if not select.select([fd], [], [], timeout)[0]:
            raise subprocess.TimeoutExpired(proc.args, timeout)
        return proc.wait()
    finally:
        os.close(fd)


class Waiting(dict):
    """The sessions whose next answer is awaited: name -> (session, timeout, what it is
    doing, deadline); ``ask`` puts one in (again)."""

    def ask(self, name: str, session: Session, timeout: float, doing: str) -> None:
        session.flush()
        self[name] = (session, timeout, doing, time.monotonic() + timeout)


def _in_turn(waiting: Waiting):
    """(name, its next answer, or None) for each session in ``waiting``, as the answers
    arrive, until none is awaited: the caller may ``ask`` one again as it handles an answer
    (a node that answers first is not held up by a slow one; each waits its own time)."""
    while waiting:
        names = [n for n, w in waiting.items() if w[0].failed or b"\n" in w[0].buf]
        if not names:
            fds = {w[0].proc.stdout.fileno(): n for n, w in waiting.items()}
            left = max(min(w[3] for w in waiting.values()) - time.monotonic(), 0)
            names = [fds[fd] for fd in select.select(list(fds), [], [], left)[0]]
            now = time.monotonic()
            names = names or [n for n, w in waiting.items() if w[3] <= now]  # each says so
        for name in names:
            s, timeout, doing, deadline = waiting.pop(name)
            yield name, s.answer(timeout, doing, deadline)


def ship(
    sessions: dict[str, Session],
    build,
    *,
    force: bool = False,
    keep: int = 2,
    progress: bool = True,
) -> dict[str, dict]:
    """Hold the conversation with every node at once (see the module's doc); ``build()``
    gives the Tree, called only when a node lacks it. node -> {status, files, bytes}."""
    rows = {name: {"status": "", "files": 0, "bytes": 0} for name in sessions}
    made: dict = {}
    known: dict = {}  # tree id -> its entries (manifests read once)
    packed: dict = {}  # base -> the manifest frame's payload: made once for every node
    packing = threading.Lock()

    def recall(tid: str) -> list | None:
        if tid not in known:
            known[tid] = recalled(tid)
        return known[tid]

    def manifest(base: str | None) -> bytes:
        tree = made["tree"]
        with packing:
            if base not in packed:
                change = {"tree": tree.id, "keep": keep, "base": base}
                if base is not None:
                    change |= treestore.delta(recall(base), tree.entries)
                else:
                    change |= {"set": tree.entries, "del": []}
                packed[base] = treestore.pack(change)
            return packed[base]

    def make() -> None:
        try:
            made["tree"] = build()
        except BaseException as e:  # noqa: BLE001 - raised below, in the caller's thread
            made["error"] = e
            ready.set()
            return
        # The delta from the tree shipped last, the likely base, is made while the nodes
        # start, not after they answer (a node that has another gets its own).
        guess = newest_remembered()
        ready.set()
        if guess not in (None, made["tree"].id) and recall(guess) is not None:
            manifest(guess)

    # The tree is made while the nodes start and look: often they all have it, and the
    # scan, made for nothing then, does not hold anyone up (a daemon thread).
    ready = threading.Event()
    maker = threading.Thread(target=make, daemon=True, name="lounge-scan")
    maker.start()
    tree, keeper, starting = None, None, len(sessions)
    told, resent = set(), set()  # nodes sent the manifest; sent it whole, as they asked
    asked, held = [], {}  # nodes sent their objects; those whose objects wait for the others
    waiting = Waiting()
    for name, s in sessions.items():
        waiting.ask(name, s, HELLO_S, "starting")
    # Each node is answered as soon as it speaks: its manifest once it has said what it has
    # (the others may still be starting), then what it lacks
    for name, said in _in_turn(waiting):
        s = sessions[name]
        hello = name not in told
        if hello:
            starting -= 1
        if said is None:
            pass
        elif said["state"] == "present":
            rows[name]["status"] = "present"
            s.close()
        elif hello:
            if tree is None:
                ready.wait()  # the scan (a failed one sets it too)
                if "error" in made:
                    for other in sessions.values():
                        other.close()
                    raise made["error"]
                tree = made["tree"]
                known[tree.id] = tree.entries
            base = tree.id if tree.id in said["have"] else None
            base = base or next((t for t in said["have"] if recall(t) is not None), None)
            s.frame(b"M", manifest(base))
            told.add(name)
            waiting.ask(name, s, MANIFEST_S, "checking the manifest")
        elif said["state"] == "resend" and name not in resent:
            resent.add(name)
            s.frame(b"M", manifest(None))
            waiting.ask(name, s, MANIFEST_S, "checking the manifest")
        elif said["state"] == "missing":
            keys = tuple(sorted(said["missing"]))
            size = sum(tree.sizes[k] for k in keys)
            rows[name] |= {"files": len(keys), "bytes": size}
            if size <= AT_ONCE:  # a few files: now, to it alone
                _send_objects(tree, keys, [s], progress)
                asked.append(name)
            else:  # one stream to the nodes that lack the same, once all have said
                held[name] = keys
        else:
            s.fail(f"the node answered {said!r:.200}")
        if not starting and tree is not None and keeper is None:
            # the tree is kept for the next sync's delta while the nodes work (after the
            # manifests went: it takes a while for a big tree; a failed sync's is harmless)
            keeper = threading.Thread(target=remember, args=(tree,), daemon=True)
            keeper.start()
    groups: dict[tuple, list[str]] = {}
    for name, keys in held.items():
        groups.setdefault(keys, []).append(name)
    for keys, names in groups.items():
        _send_objects(tree, keys, [sessions[n] for n in names], progress)
        asked += names
    for name in asked:
        s = sessions[name]
        done = s.answer(FINISH_S, "linking the tree")
        if done is not None:
            rows[name]["status"] = "shipped"
            s.end()  # (each ends while the others finish; all are waited for below)
    if keeper is not None:
        keeper.join()
    for name, s in sessions.items():
        if s.failed:
            rows[name] |= {"status": f"failed: {s.failed}", "files": 0, "bytes": 0}
        s.close()
        rows[name]["wire"] = s.sent - s.program  # all that went to the node but the program
    if any(why in r["status"] for r in rows.values() for why in (UNREADABLE, treestore.CHANGED)):
        forget_parts()  # a file changed that a remembered part says did not: walk it again
    return rows


def _send_objects(tree: Tree, keys, sessions: list[Session], progress: bool) -> None:
    """One stream of these objects to all these sessions (the same bytes to each)."""
    total = sum(tree.sizes[k] for k in keys)
    bar = None
    if progress and keys:
        from tqdm.auto import tqdm

        names = ", ".join(s.name for s in sessions)
        bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024,
                   desc=f"{names}: {len(keys)} files")  # fmt: skip

    # One writer per session, each with a few MiB of slack: a node that is slower for a
    # moment does not hold the others up (the bytes are read here once).
    queues = [queue.Queue(WRITE_AHEAD) for _ in sessions]
    writers = [
        threading.Thread(target=_write, args=(s, q), daemon=True, name=f"lounge-ship-{s.name}")
        for s, q in zip(sessions, queues)
    ]
    for w in writers:
        w.start()

    pending = bytearray()  # small frames, written together (one write per MiB, not per file)

    def put(data: bytes) -> None:
        for s, q in zip(sessions, queues):
            if not s.failed:
                q.put(data)
        if all(s.failed for s in sessions):
            raise LoungeError("every node's SSH session ended while shipping")

    def flush() -> None:
        if pending:
            put(bytes(pending))
            pending.clear()

    def send(*parts: bytes) -> None:
        if len(parts[-1]) >= CHUNK // 4:  # a large one goes as it is, not copied
            pending.extend(b"".join(parts[:-1]))
            flush()
            put(parts[-1])
            return
        for part in parts:
            pending.extend(part)
        if len(pending) >= CHUNK:
            flush()

    unreadable = None
    try:
        for i, key in enumerate(keys):
            path, left = tree.sources[key], tree.sizes[key]
            send(envstore.object_frame(key, left, tree.mtimes.get(key)))
            with open(path, "rb") as f:
                # what is sent is checked here, once for every node: by its hash, or by its
                # stat before and after, if it was hashed by this sync's scan
                h = None if unchanged(tree, key, path, os.fstat(f.fileno())) else hashlib.sha256()
                while left and (chunk := f.read(min(CHUNK, left))):
                    if h is not None:
                        h.update(chunk)
                    send(envstore.frame_head(b"D", len(chunk)), chunk)
                    left -= len(chunk)
                    if bar is not None:
                        bar.update(len(chunk))
                if left:
                    raise OSError(f"it is {left} bytes shorter than when it was hashed")
                moved = h is None and not unchanged(tree, key, path, os.fstat(f.fileno()))
                if moved or (h is not None and h.hexdigest() != key.rsplit(".", 1)[0]):
                    send(envstore.frame(b"X", path.encode(errors="surrogateescape")))
                    if h is not None:  # what it is now (one that changed as it was sent: the
                        # next scan hashes it, its stamp being new)
                        _learn(path, h.hexdigest(), os.fstat(f.fileno()))
                    break
            send(envstore.frame(b"K", b""))
            if bar is not None:
                bar.set_postfix_str(f"{i + 1}/{len(keys)} files", refresh=False)
        else:
            send(envstore.frame(b"E", b"{}"))
        flush()
    except LoungeError:
        pass
    except OSError as e:  # a file changed under us: the nodes keep what arrived before it
        unreadable = f"{tree.sources.get(key, '?')} {UNREADABLE}: {e}"
        try:
            flush()
        except LoungeError:
            pass
    finally:
        for q in queues:
            q.put(None)
        for w in writers:
            w.join()
        for s in sessions:  # the last bytes, not left in the pipe's buffer here
            s.flush()
        if bar is not None:
            bar.close()
    if unreadable:
        for s in sessions:
            s.fail(unreadable)


def _learn(path: str, sha: str, st: os.stat_result) -> None:
    """``path`` was not what its remembered hash (or its RECORD) said: remember what it is."""
    for cache_path in _cache_dir().glob("hashes-*.json"):
        cache = read_json(cache_path) or {}
        if path in cache:
            cache[path] = [st.st_size, st.st_mtime_ns, st.st_ino, sha]
            write_json(cache_path, cache, compact=True)


def _write(session: Session, chunks: queue.Queue) -> None:
    """Write what comes in ``chunks`` to the session until None; after a failure, drain."""
    while (data := chunks.get()) is not None:
        session.send(data)  # a no-op once the session failed
