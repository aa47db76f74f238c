"""Trees of files on a node's own disk, stored by content: the node's side of ``lounge sync``
(environments) and ``lounge stage`` (data sets).

Every file is kept once per node as an object named by its sha256 and mode
(``<local_dir>/store/objects/ab/abcd....644``); an environment or a data set is a folder of
hard links to those objects, described by its manifest: one entry per path, ``[path, kind,
mode, size, ref, mtime]`` with kind ``d`` (folder), ``f`` (file; ref = its sha256) or ``l``
(symbolic link; ref = the target). A tree's id is the sha256 of its manifest, so a node that
has a tree has all of it, and a second sync ships only the objects a node lacks. The manifest
of each tree a node holds is kept (``store/trees/<id>.z``), so a sender that remembers it
sends only the entries that changed.

An object is written to a temporary file, its hash checked (by the node when it reads the
file itself, by the sender as it reads what it sends), and only then renamed into place;
a tree is linked together in a temporary folder and renamed into place whole. So an
interrupted sync leaves objects that the next one does not send again, and never a half tree.
Objects no tree links to any more (link count 1) are removed when a tree is.

Standard library only, no import of this package: sent as source with trust.py, like
envstore.py, to nodes that have nothing but a base Python; the Slurm node agent imports it to
copy data sets from the shared file system.
"""

from __future__ import annotations

import bisect
import marshal
import os
import time
import zlib

try:
    from .trust import private_dir
except ImportError:  # sent as source after trust.py's: its names are already here
    pass

STORE_LOCK_WAIT_S = 600.0
#: A file arrives in writes of at most this many bytes. Whole 1 MiB chunks made the kernel copy
#: into large page-cache folios, which on this VM cost a fifth of the machine's time during a
#: first data sync (perf: copy_folio_from_iter_atomic, 21% against tar's 0.6%); in 16 KiB writes
#: the 500 MB set's first sync to 3 nodes went from 5.8 s to 4.3 s (bench/sync.py, medians of 5).
WRITE_PIECE = 16384
#: room left free on a node's disk after a sync, on top of what it writes
SPARE_MIB = 256
#: a folder the tree's owner alone may read (data sets); environments are readable
PRIVATE, SHARED = 0o700, 0o755


#: what a node says of a file that arrived other than hashed (ship.py watches for it)
CHANGED = "it changed while the sync read it, or on the way"


class StoreError(Exception):
    """What went wrong on the node, in one sentence for the researcher."""


def rmtree(path: str, ignore_errors: bool = False) -> None:
    """shutil.rmtree, imported when needed (with bz2 and lzma: 3 ms of a node's start)."""
    import shutil

    shutil.rmtree(path, ignore_errors=ignore_errors)


def free_mib(path: str) -> int:
    """The MiB free for this user in the file system of ``path`` (as shutil.disk_usage)."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize // 2**20


def marker_tree(text: str) -> str:
    """The tree id in an environment's marker (``{"fingerprint": .., "tree": "HEX", ..}``, as
    the node program writes it); json, imported only for a marker of another shape."""
    tree = text.partition('"tree": "')[2].partition('"')[0]
    if tree and all(c in "0123456789abcdef" for c in tree):
        return tree
    import json

    return json.loads(text).get("tree", "")


# -- manifests ----------------------------------------------------------------------------------
def tree_id(entries: list) -> str:
    """The id of the tree these entries describe (order-independent)."""
    text = "".join(
        f"{e[0]}\0{e[1]}\0{e[2]}\0{e[3]}\0{e[4]}\0{e[5]}\n"
        for e in sorted(entries, key=lambda e: e[0])
    )
    import hashlib  # (not at the start: OpenSSL's set-up, ~3 ms of a node's, see envstore.put)

    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def object_key(entry: list) -> str:
    """An entry's object: its content hash and mode (hard links share one mode)."""
    return f"{entry[4]}.{entry[2]:o}"


# A manifest, packed: marshal's data format (version 4, the same in every Python 3 since 3.4:
# a node's may differ from ours), behind a first byte JSON text never has. The node program
# imports no json: json's import, with re and enum, was a third of a node's CPU in a re-sync.
# Read only where it was written by us (the sender, or this node's own store), never a blob
# a node sent: those are JSON lines.
PACKED = b"\x00"


def pack(data) -> bytes:
    return zlib.compress(PACKED + marshal.dumps(data, 4), 1)


def unpack(blob: bytes):
    raw = zlib.decompress(blob)
    if raw[:1] == PACKED:
        return marshal.loads(raw[1:])
    import json  # a manifest an earlier version saved as JSON

    return json.loads(raw.decode("utf-8", "surrogateescape"))


def delta(base: list, new: list) -> dict:
    """What turns the manifest ``base`` into ``new``: entries set and paths removed."""
    old = {e[0]: e for e in base}
    paths = {e[0] for e in new}
    return {
        "set": [e for e in new if old.get(e[0]) != e],
        "del": sorted(p for p in old if p not in paths),
    }


def apply_delta(base: list, change: dict) -> list:
    entries = {e[0]: e for e in base}
    for path in change["del"]:
        entries.pop(path, None)
    for e in change["set"]:
        entries[e[0]] = e
    return list(entries.values())


def safe_path(name: str) -> str:
    parts = name.split("/")
    if not name or name.startswith("/") or ".." in parts or "" in parts or "." in parts:
        raise StoreError(f"refusing a path outside the tree: {name!r}")
    return name


# -- the store ----------------------------------------------------------------------------------
class Store:
    """The objects and manifests under ``root`` (a folder of ours alone), and the trees made
    of them. Use it as a context manager: it holds the store's lock while open."""

    def __init__(self, root: str, what: str = "local_dir"):
        self.root = root
        private_dir(root, what)
        self.store = private_dir(os.path.join(root, "store"), "object store")
        self.objects = private_dir(os.path.join(self.store, "objects"), "object store")
        self.trees = private_dir(os.path.join(self.store, "trees"), "object store")
        self.tmp = private_dir(os.path.join(self.store, "tmp"), "object store")
        self._lock = None
        self._folders: set[str] = set()  # objects/xx made already
        self._umask = os.umask(0o077)  # (read, and put back at once: one thread here)
        os.umask(self._umask)

    def __enter__(self) -> Store:
        import fcntl

        fd = os.open(os.path.join(self.store, ".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW,
                     0o600)  # fmt: skip
        deadline, pause = time.monotonic() + STORE_LOCK_WAIT_S, 0.002
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise StoreError(
                        f"another sync held {self.store} for {STORE_LOCK_WAIT_S:g} s; try again"
                    ) from None
                time.sleep(pause)  # (the last sync's tidying, most often: a few ms)
                pause = min(pause * 2, 0.2)
        self._lock = fd
        for name in os.listdir(self.tmp):  # what an interrupted sync left: we hold the lock
            try:
                os.unlink(os.path.join(self.tmp, name))
            except IsADirectoryError:
                rmtree(os.path.join(self.tmp, name), ignore_errors=True)
        return self

    def __exit__(self, *exc) -> None:
        os.close(self._lock)
        self._lock = None

    # objects
    def path(self, key: str) -> str:
        return f"{self.objects}/{key[:2]}/{key}"

    def has(self, key: str) -> bool:
        return os.path.isfile(self.path(key))

    def missing(self, entries: list) -> dict[str, int]:
        """The objects of these entries the store lacks: key -> size."""
        out = {}
        for e in entries:
            if e[1] == "f" and e[4] not in out:
                key = object_key(e)
                if key not in out and not self.has(key):
                    out[key] = e[3]
        return out

    def free_mib(self) -> int:
        return free_mib(self.store)

    def check_room(self, need_bytes: int, where: str) -> None:
        free = self.free_mib()
        need = need_bytes // 2**20 + 1
        if need + SPARE_MIB > free:
            raise StoreError(
                f"{where} has {free} MiB free in {self.root} and this needs {need} MiB more "
                f"(plus {SPARE_MIB} MiB to spare): free space there, or give the node a "
                "local_dir on a bigger disk"
            )

    def put_object(self, key: str, chunks, mtime: float | None = None) -> int:
        """Write an object from ``chunks`` (bytes), checking its hash; return its size."""
        size = self.receive_object(key, chunks, mtime, check=True)
        self.commit_object(key)
        return size

    def receive_object(self, key: str, chunks, mtime: float | None = None,
                       check: bool = False) -> int:  # fmt: skip
        """Write an object from ``chunks`` into the store's tmp folder (emptied under the
        lock), with its final mode; return its size. It is in the store once
        ``commit_object`` renames it into place. ``check``: its sha256 is checked here (a
        shipment's sender checks what it sent as it reads it: the SSH channel keeps it so)."""
        sha, mode = key.rsplit(".", 1)
        tmp, bits = f"{self.tmp}/{key}", int(mode, 8) & 0o7777
        h, size = None, 0
        if check:
            import hashlib

            h = hashlib.sha256()
        fd = -1
        try:  # a few system calls per file: a sync makes tens of thousands
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, bits)
            if bits & self._umask:  # the umask took some of it
                os.fchmod(fd, bits)
            for chunk in chunks:
                if h is not None:
                    h.update(chunk)
                size += len(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view[:WRITE_PIECE]) :]
            if h is not None and h.hexdigest() != sha:
                raise StoreError(
                    f"a file arrived other than it was hashed (its sha256 is not {sha[:12]}...):"
                    f" {CHANGED}; run the sync again"
                )
            if mtime is not None:
                os.utime(fd, (mtime, mtime))
            os.close(fd)
            return size
        except BaseException as e:
            if fd >= 0:
                os.close(fd)
            _unlink(tmp)
            if isinstance(e, OSError) and e.errno == 28:  # ENOSPC
                raise StoreError(
                    f"the disk of {self.root} filled up ({self.free_mib()} MiB free): free space "
                    "there, or give the node a local_dir on a bigger disk"
                ) from None
            raise

    def commit_object(self, key: str) -> None:
        folder = f"{self.objects}/{key[:2]}"
        if folder not in self._folders:
            os.makedirs(folder, 0o700, exist_ok=True)
            self._folders.add(folder)
        os.replace(f"{self.tmp}/{key}", f"{folder}/{key}")

    def discard_object(self, key: str) -> None:
        _unlink(f"{self.tmp}/{key}")

    # manifests
    def save_manifest(self, tid: str, entries: list) -> None:
        fd, tmp = _temp(self.tmp)
        with os.fdopen(fd, "wb") as f:
            f.write(pack(entries))
        os.replace(tmp, os.path.join(self.trees, tid + ".z"))

    def manifest(self, tid: str) -> list | None:
        try:
            with open(os.path.join(self.trees, tid + ".z"), "rb") as f:
                return unpack(f.read())
        except (OSError, ValueError, zlib.error):
            return None

    # trees
    def link_tree(self, entries: list, into: str, folder_mode: int, extra=None) -> None:
        """Make the tree of ``entries`` at ``into`` (which must not exist): hard links to the
        objects, made in a temporary folder beside it (with the files ``extra``: name ->
        bytes) and renamed into place."""
        tmp = into + f".part-{os.getpid()}"
        rmtree(tmp, ignore_errors=True)
        os.mkdir(tmp, 0o700)
        try:
            folders, made = [], {""}
            link, symlink, mkdir, path = os.link, os.symlink, os.mkdir, self.path
            # sorted by path, every folder comes before what is in it: one call per entry,
            # and an entry whose folder the manifest did not make here (one inside a
            # symbolic link) is refused
            for e in sorted(entries, key=lambda e: e[0]):
                name = safe_path(e[0])
                if name.rpartition("/")[0] not in made:
                    raise StoreError(f"refusing {name!r}: its folder is not in the tree")
                dest = f"{tmp}/{name}"
                if e[1] == "f":
                    link(path(f"{e[4]}.{e[2]:o}"), dest)
                elif e[1] == "d":
                    mkdir(dest, 0o700)
                    folders.append((dest, e))
                    made.add(name)
                else:
                    symlink(e[4], dest)
            for dest, e in reversed(folders):  # the deepest first: parents stay writable
                os.chmod(dest, e[2] & folder_mode)
                os.utime(dest, (e[5], e[5]))
            for name, data in (extra or {}).items():
                with open(os.path.join(tmp, name), "wb") as f:
                    f.write(data)
            os.chmod(tmp, folder_mode)
            os.rename(tmp, into)
        except BaseException:
            rmtree(tmp, ignore_errors=True)
            raise

    def evolve_tree(self, old: str, old_entries: list, change: dict, into: str,
                    folder_mode: int, extra: dict) -> None:  # fmt: skip
        """Make the tree at ``into`` from the tree at ``old`` (the tree of ``old_entries``,
        given up: an environment about to be removed anyway) by the ``change`` that turns
        those entries into the new ones (``set``, ``del``: see ``delta``): the work is the
        change's, not the tree's, so a one-file change is a one-file job. The change is
        checked first (no entry under what is not a folder in the new tree, none left behind
        under a folder it removes); then ``old`` is renamed out of view and changed; the
        caller holds what keeps agents from starting on it."""
        before = {e[0]: e for e in old_entries}
        setd = {safe_path(e[0]): e for e in change["set"]}
        dels = {safe_path(n) for n in change["del"]}

        def kind(name: str) -> str | None:  # what ``name`` is in the new tree
            if name in setd:
                return setd[name][1]
            return None if name in dels or name not in before else before[name][1]

        for name in setd:
            parent = name.rpartition("/")[0]
            while parent:
                if kind(parent) != "d":
                    raise StoreError(f"refusing {name!r}: its folder is not in the tree")
                parent = parent.rpartition("/")[0]
        names = None
        for name in dels | setd.keys():
            if before.get(name, ("", ""))[1] == "d" and kind(name) != "d":
                if names is None:
                    names = sorted(before)
                i = bisect.bisect_right(names, name + "/")
                while i < len(names) and names[i].startswith(name + "/"):
                    if names[i] not in dels:
                        raise StoreError(f"refusing the change: it keeps {names[i]!r}, whose "
                                         "folder it removes")  # fmt: skip
                    i += 1
        gone = dels | {n for n, e in setd.items() if n in before and before[n] != e
                       and (e[1] != "d" or before[n][1] != "d")}  # fmt: skip
        tmp = into + f".part-{os.getpid()}"
        os.rename(old, tmp)
        try:
            for name in extra:
                _unlink(os.path.join(tmp, name))
            touched = set()  # folders whose entries change: their mode and mtime are set again
            for name in sorted(gone, reverse=True):  # the deepest first
                touched.add(name.rpartition("/")[0])
                path = f"{tmp}/{name}"
                if before.get(name, ["", ""])[1] == "d" and not os.path.islink(path):
                    remove_tree(path)
                elif os.path.lexists(path):
                    os.unlink(path)
            for name in sorted(setd):
                e, was = setd[name], before.get(name)
                if was == e:
                    continue
                touched.add(name.rpartition("/")[0])
                dest = f"{tmp}/{name}"
                if e[1] == "d":
                    if name in gone or was is None:
                        os.mkdir(dest, 0o700)  # (folders are always their owner's to write)
                    touched.add(name)
                elif e[1] == "f":
                    os.link(self.path(object_key(e)), dest)
                else:
                    os.symlink(e[4], dest)
            for name in sorted(touched, reverse=True):  # the deepest first
                e = setd.get(name) or before.get(name)
                if name and e is not None and kind(name) == "d":
                    os.chmod(f"{tmp}/{name}", e[2] & folder_mode)
                    os.utime(f"{tmp}/{name}", (e[5], e[5]))
            for name, data in extra.items():
                with open(os.path.join(tmp, name), "wb") as f:
                    f.write(data)
            os.chmod(tmp, folder_mode)
            os.rename(tmp, into)
        except BaseException:
            remove_tree(tmp)
            raise

    def collect(self, keep_trees: set[str], candidates=None) -> int:
        """Remove manifests not in ``keep_trees`` and objects no tree links to; the count.
        ``candidates``: only these object keys can have lost their last link (a tree changed
        in place): look at them alone, not at every object."""
        for name in os.listdir(self.trees):
            if name.endswith(".z") and name[:-2] not in keep_trees:
                _unlink(os.path.join(self.trees, name))
        if candidates is None:
            candidates = (
                os.path.join(self.objects, sub, name)
                for sub in os.listdir(self.objects)
                for name in os.listdir(os.path.join(self.objects, sub))
            )
        else:
            candidates = [self.path(key) for key in candidates]
        removed = 0
        for path in candidates:
            try:
                if os.lstat(path).st_nlink == 1:
                    os.unlink(path)
                    removed += 1
            except FileNotFoundError:
                pass
        return removed


def remove_tree(path: str) -> None:
    """Remove a tree folder, whatever modes its folders have."""
    for root, dirs, _ in os.walk(path):
        for d in dirs:
            full = os.path.join(root, d)
            if not os.path.islink(full):
                os.chmod(full, 0o700)
    if os.path.isdir(path) and not os.path.islink(path):
        os.chmod(path, 0o700)
    rmtree(path, ignore_errors=True)


def _temp(folder: str) -> tuple[int, str]:
    import tempfile

    return tempfile.mkstemp(dir=folder, prefix="obj-")


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def read_chunks(path: str, size: int = 1 << 20):
    with open(path, "rb") as f:
        while chunk := f.read(size):
            yield chunk


# -- data sets ----------------------------------------------------------------------------------
def is_data_name(name: str) -> bool:
    """Whether ``name`` can name a data set: a letter, then letters, digits or _, at most 64
    (no re: the node program does without it)."""
    return (
        isinstance(name, str) and 0 < len(name) <= 64 and name.isascii()
        and name[0].isalpha() and name.replace("_", "a").isalnum()
    )  # fmt: skip


DATA_KEEP = 2  # versions of a data set kept: the current one and the one before
SPARE = "~spare"  # ``.{name}~spare.{tree}``: a copy of a data set's version (see keep_spare)


def data_dir(root: str) -> str:
    return os.path.join(root, "data")


def data_current(root: str, name: str) -> str | None:
    """The tree id of data set ``name`` under ``root`` now, or None."""
    try:
        target = os.readlink(os.path.join(data_dir(root), name))
    except OSError:
        return None
    return target.rsplit(".", 1)[-1] if target.startswith(f".{name}.") else None


def data_versions(root: str, name: str | None) -> list[str]:
    """The tree ids of the versions of data set ``name`` (of every data set: None) under
    ``root``, the current ones first, then the newest."""
    folder, found = data_dir(root), []
    try:
        listing = os.listdir(folder)
    except OSError:
        return []
    current = set()
    for entry in listing:
        if not entry.startswith(".") and (name is None or entry == name):
            current.add(data_current(root, entry))
    for entry in listing:
        set_name, _, tid = entry[1:].rpartition(".")
        if (entry.startswith(".") and set_name and (name is None or set_name == name)
                and ".part-" not in entry and SPARE not in set_name):  # fmt: skip
            found.append((tid in current, os.lstat(os.path.join(folder, entry)).st_mtime, tid))
    return [tid for _, _, tid in sorted(found, reverse=True)]


def data_sets(root: str) -> list[dict]:
    """Every data set under ``root``: name, tree, path, files, bytes, time."""
    folder = data_dir(root)
    out = []
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return out
    for name in names:
        link = os.path.join(folder, name)
        if name.startswith(".") or not os.path.islink(link):
            continue
        tid = data_current(root, name)
        files = size = 0
        for r, _, fs in os.walk(os.path.realpath(link)):
            for f in fs:
                files += 1
                size += os.lstat(os.path.join(r, f)).st_size
        out.append({"name": name, "tree": tid, "path": os.path.realpath(link), "files": files,
                    "bytes": size, "time": os.lstat(link).st_mtime})  # fmt: skip
    return out


def switch_data(store: Store, name: str, tid: str, entries: list, prune: bool = True):
    """Make tree ``tid`` data set ``name``, keep the version before, remove older ones
    (``prune``: now; else see ``prune_data``). A new version is made from the one the switch
    would remove, changed in place by the difference (a one-file change is a one-file job, not
    a link for every file and a removal of every file of the old one); else linked whole. The
    data set's folder, and the object keys that may have lost their last link (for
    ``Store.collect``; collected here when ``prune``)."""
    folder = private_dir(data_dir(store.root), "data folder")
    versioned = os.path.join(folder, f".{name}.{tid}")
    freed = set()
    if not os.path.isdir(versioned):
        spare = _spare_version(store, name, tid)
        if spare is not None:
            path, old = spare
            change = delta(old, entries)
            was = {e[0]: e for e in old}
            for gone in (*change["del"], *(e[0] for e in change["set"])):
                if was.get(gone, "  ")[1] == "f":  # its object may have lost its last link
                    freed.add(object_key(was[gone]))
            try:
                store.evolve_tree(path, old, change, versioned, PRIVATE, {})
            except (OSError, StoreError):  # not as its manifest says: it is gone; link anew
                spare = None
        if spare is None:
            store.link_tree(entries, versioned, PRIVATE)
    os.utime(versioned)  # when it became current: prune_data keeps the newest
    link = os.path.join(folder, name)
    tmp = link + f".new-{os.getpid()}"
    _unlink(tmp)
    os.symlink(f".{name}.{tid}", tmp)
    os.replace(tmp, link)  # readers see the old version or the new one, never neither
    if prune:
        prune_data(store, name)
        if freed:
            store.collect(trees_in_use(store.root), freed)
    return versioned, freed


def _spare_version(store: Store, name: str, tid: str) -> tuple[str, list] | None:
    """A version of data set ``name`` that switching to ``tid`` would remove (the newest of
    them), with its entries: never the current one, which stays as the one before."""
    current = data_current(store.root, name)
    others = [t for t in data_versions(store.root, name) if t not in (current, tid)]
    for other in others[max(DATA_KEEP - 2, 0) :]:
        entries = store.manifest(other)
        if entries is not None:
            return os.path.join(data_dir(store.root), f".{name}.{other}"), entries
    for path, other in _spares(store.root, name):  # none: the copy keep_spare made
        entries = store.manifest(other)
        if entries is not None:
            return path, entries
    return None


def _spares(root: str, name: str) -> list[tuple[str, str]]:
    """(path, tree id) of each spare copy of data set ``name`` (``keep_spare``)."""
    folder, prefix = data_dir(root), f".{name}{SPARE}."
    try:
        listing = os.listdir(folder)
    except OSError:
        return []
    return [(os.path.join(folder, entry), entry[len(prefix) :]) for entry in sorted(listing)
            if entry.startswith(prefix) and ".part-" not in entry]  # fmt: skip


def keep_spare(store: Store, name: str, tid: str, entries: list) -> None:
    """When data set ``name``, now tree ``tid`` of these ``entries``, has no other version
    (its first sync, or one after a removal), a copy of it, made of hard links (a folder
    entry per file, no data): the next switch changes it in place (``switch_data``), so the
    first one-file re-sync is a one-file job on the node as every later one is, not a link
    for each of the set's files (~40 ms per 2,000 files, while the sender waits). Made by
    the tidy after the answer, when nobody waits; none is kept beside a version before
    (``prune_data``)."""
    if data_current(store.root, name) != tid or _spares(store.root, name):
        return
    if any(other != tid for other in data_versions(store.root, name)):
        return
    store.link_tree(entries, os.path.join(data_dir(store.root), f".{name}{SPARE}.{tid}"), PRIVATE)


def prune_data(store: Store, name: str) -> None:
    """Remove versions of data set ``name`` beyond DATA_KEEP, and what no tree links."""
    folder = data_dir(store.root)
    current = data_current(store.root, name)
    versions = []
    for entry in os.listdir(folder):
        if entry.startswith(f".{name}{SPARE}.") and ".part-" in entry:
            remove_tree(os.path.join(folder, entry))  # an interrupted spare copy
        elif entry.startswith(f".{name}.") and not entry.startswith(f".{name}.new-"):
            tid = entry[len(name) + 2 :]
            if ".part-" in tid:
                remove_tree(os.path.join(folder, entry))  # an interrupted link
                continue
            versions.append((tid == current, os.lstat(os.path.join(folder, entry)).st_mtime, tid))
    versions.sort(reverse=True)
    gone = False
    for _, _, tid in versions[DATA_KEEP:]:
        remove_tree(os.path.join(folder, f".{name}.{tid}"))
        gone = True
    if len(versions) > 1:  # a version before: the next switch changes that one, not a spare
        for path, _ in _spares(store.root, name):
            remove_tree(path)
            gone = True
    if gone:
        store.collect(trees_in_use(store.root))


def stage_copy(root: str, name: str, tid: str, entries: list, source: str) -> str:
    """Data set ``name`` as tree ``tid`` under ``root`` (a node's scratch), its files copied
    from ``source`` (a shared file system) unless the store has them; its folder. Once per
    node and content: an agent that finds it there already (an earlier allocation, or a
    sibling agent that held the lock first) only uses it."""
    if tree_id(entries) != tid:
        raise StoreError(f"the manifest of data set {name!r} does not match its id")
    with Store(root, "scratch folder") as store:
        if data_current(root, name) == tid:
            return os.path.realpath(os.path.join(data_dir(root), name))
        missing = store.missing(entries)
        store.check_room(sum(missing.values()), "this node")
        first = {}
        for e in entries:
            if e[1] == "f":
                first.setdefault(object_key(e), e)
        for key in missing:
            e = first[key]
            path = os.path.join(source, safe_path(e[0]))
            try:
                store.put_object(key, read_chunks(path), e[5])
            except StoreError as err:
                if "damaged" not in str(err):
                    raise
                raise StoreError(
                    f"{path} changed after the start hashed it: start again to stage the new "
                    "content"
                ) from None
        store.save_manifest(tid, entries)
        return switch_data(store, name, tid, entries)[0]


def scratch_root(scratch: str | None) -> str:
    """Where a Slurm node keeps its data sets: ``scratch`` (else $TMPDIR, else /tmp), in a
    folder of this user's own."""
    base = scratch or os.environ.get("TMPDIR") or "/tmp"
    return os.path.join(base, f"jupyter_lounge-{os.geteuid()}")


def data_links(root: str) -> dict[str, str]:
    """Each data set under ``root`` -> its folder now (the version it points to)."""
    folder = data_dir(root)
    try:
        names = os.listdir(folder)
    except OSError:
        return {}
    return {
        name: os.path.realpath(os.path.join(folder, name))
        for name in names
        if not name.startswith(".") and os.path.islink(os.path.join(folder, name))
    }


def remove_data(root: str, name: str) -> bool:
    """Remove data set ``name`` and every version of it; whether there was one."""
    folder = data_dir(root)
    if not os.path.isdir(folder):
        return False
    with Store(root) as store:
        found = False
        for entry in os.listdir(folder):
            if entry == name or entry.startswith((f".{name}.", f".{name}{SPARE}.")):
                path = os.path.join(folder, entry)
                if os.path.islink(path):
                    os.unlink(path)
                else:
                    remove_tree(path)
                found = True
        store.collect(trees_in_use(root))
    return found


def trees_in_use(root: str) -> set[str]:
    """The ids of every tree under ``root`` (environments and data sets)."""
    ids = set()
    folder = data_dir(root)
    if os.path.isdir(folder):
        for entry in os.listdir(folder):
            if entry.startswith(".") and ".part-" not in entry and ".new-" not in entry:
                ids.add(entry.rsplit(".", 1)[-1])
    envs = os.path.join(root, "envs")
    if os.path.isdir(envs):
        for entry in os.listdir(envs):
            try:
                with open(os.path.join(envs, entry, ".lounge-env")) as f:
                    ids.add(marker_tree(f.read()))
            except (OSError, ValueError):
                pass
    return ids
