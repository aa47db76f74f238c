"""The node's side of ``lounge sync``, and of starting an agent from a synced environment.

Environments live on a node's own disk at ``<local_dir>/envs/<fingerprint>/``. Before any
exists there, the node has only its base Python, so this module (with ``trust.py`` and
``treestore.py``) uses the
standard library alone and travels as source: the command ssh runs is a short fixed bootstrap
(``BOOT``) that reads exactly that many bytes of program from stdin and runs it; whatever
follows on stdin (the shipment's frames, or the agent's spec) is left for the program. No
shell syntax, no path and no secret is in the command; the paths are its arguments, quoted
once.

* ``check LOCAL_DIR FP``: is that environment there, and are the folders ours alone?
* ``put LOCAL_DIR KIND NAME [force]``: receive the environment (``env``, NAME its
  fingerprint) or data set (``data``) NAME by content, as ship.py sends it: every file is
  kept once in the node's object store (treestore.py), so only files the node lacks travel;
  the tree is linked in a temporary folder and renamed into place whole. Older environments
  beyond the sender's ``keep`` are removed unless an agent uses one (agents hold a shared lock
  on its marker file while they run).
* ``data-list LOCAL_DIR``, ``data-remove LOCAL_DIR NAME``: the data sets there (stage.py).
* ``launch LOCAL_DIR FP``: check the folders, take that shared lock, and become the node
  agent run by that environment's Python (``os.execv``, keeping stdin as it is).
* ``doctor LOCAL_DIR FP HOST PORT``: what ``lounge doctor`` asks of the node (see doctor).
"""

from __future__ import annotations

import os
import struct
import sys
import time

try:
    from .treestore import (
        CHANGED,
        SHARED,
        Store,
        StoreError,
        apply_delta,
        data_current,
        data_sets,
        data_versions,
        free_mib,
        is_data_name,
        keep_spare,
        marker_tree,
        object_key,
        prune_data,
        remove_data,
        rmtree,
        safe_path,
        switch_data,
        tree_id,
        trees_in_use,
        unpack,
    )
    from .trust import UntrustedPath, check_private_dir, private_dir
except ImportError:  # sent as source after trust.py's and treestore.py's: names are here
    pass

MARKER = ".lounge-env"
KEEP = 2  # environments kept on a node at most: the new one and the one before it (sync.KEEP)
PROGRAM_NAME = "<jupyter_lounge node program>"  # its file name in a node's tracebacks
#: The command-line program ssh runs (with ``-I -S -c``: no site, so no .pth imports): it reads
#: N bytes of program from stdin (see ``program``) and runs the compiled code in it when the
#: node's Python is the very version that compiled it, else compiles the source in it.
BOOT = (
    "import os,sys\n"
    "n=int(sys.argv[1]);b=b''\n"
    "while len(b)<n:\n"
    " c=os.read(0,n-len(b))\n"
    " if not c:raise SystemExit('jupyter_lounge: the node program did not arrive')\n"
    " b+=c\n"
    "del sys.argv[1]\n"
    "t,k,b=b.split(b'\\n',2);k=int(k)\n"
    "if t==('%s %x'%(sys.implementation.cache_tag,sys.hexversion)).encode():\n"
    " import marshal;c=marshal.loads(b[:k])\n"
    f"else:c=compile(b[k:],{PROGRAM_NAME!r},'exec')\n"
    "exec(c)\n"
)


def source() -> bytes:
    """This module's source after trust.py's and treestore.py's, as one program calling
    ``main``."""
    here = os.path.dirname(os.path.abspath(__file__))
    parts = ["from __future__ import annotations"]  # once, first: annotations stay unevaluated
    for name in ("trust.py", "treestore.py", "envstore.py"):
        with open(os.path.join(here, name)) as f:
            parts += [ln for ln in f.read().splitlines() if not ln.startswith("from __future__")]
    parts.append("main(sys.argv[1:])")
    return ("\n".join(parts) + "\n").encode()


def pack_program(src: bytes, tag: str, code: bytes) -> bytes:
    """What BOOT reads (``program``): the tag of the Python that compiled ``code`` (marshalled), its
    length, the code, then the source. Compiling the program takes a node's Python 10 to 15
    ms of CPU, the code 0.2 ms to load; a node on another Python compiles the source."""
    return f"{tag}\n{len(code)}\n".encode() + code + src


_PROGRAM: list[bytes] = []  # compiled once per process


def program() -> bytes:
    """The program the node's BOOT reads (``pack_program``), compiled by this Python once."""
    if not _PROGRAM:
        import marshal

        src = source()
        tag = f"{sys.implementation.cache_tag} {sys.hexversion:x}"
        _PROGRAM.append(pack_program(src, tag, marshal.dumps(compile(src, PROGRAM_NAME, "exec"))))
    return _PROGRAM[0]


def command(python: str, action: str, *args: str) -> list[str]:
    """argv for the node: its ``python`` runs BOOT, which reads ``program()`` from stdin."""
    return [python, "-I", "-S", "-c", BOOT, str(len(program())), action, *args]


def frame(kind: bytes, payload: bytes) -> bytes:
    """One frame of the stream after the program: its kind (one byte), its length, itself.
    A shipment's (see ship.py): ``M`` the manifest; per object ``O`` its head, ``D`` its
    bytes, then ``K`` (it is what was hashed) or ``X`` (it is not: its path); ``E`` the end."""
    return frame_head(kind, len(payload)) + payload


def frame_head(kind: bytes, size: int) -> bytes:
    return kind + struct.pack(">I", size)


_HEAD = struct.Struct(">QqB")  # an object's size, mtime and whether it has one; its key follows


def object_frame(key: str, size: int, mtime: int | None) -> bytes:
    return frame(b"O", _HEAD.pack(size, mtime or 0, mtime is not None) + key.encode())


def object_head(payload: bytes) -> tuple[str, int, int | None]:
    size, mtime, has_mtime = _HEAD.unpack_from(payload)
    return payload[_HEAD.size :].decode(), size, mtime if has_mtime else None


# -- the actions --------------------------------------------------------------------------------
def _dirs(local_dir: str, fp: str) -> tuple[str, str, str]:
    base = os.path.expanduser(local_dir).rstrip("/") or "/"
    envs = os.path.join(base, "envs")
    return base, envs, os.path.join(envs, fp)


def check(local_dir: str, fp: str) -> dict:
    """present / absent, or refused with the sentence saying why."""
    base, envs, env = _dirs(local_dir, fp)
    try:
        for path, what in ((base, "local_dir"), (envs, "environment store"), (env, "environment")):
            if not os.path.lexists(path):
                return {"state": "absent"}
            check_private_dir(path, what)
    except UntrustedPath as e:
        return {"state": "refused", "problem": str(e)}
    return {"state": "present" if os.path.isfile(os.path.join(env, MARKER)) else "absent"}


def _claim(env: str) -> int | None:
    """The environment's marker, locked so that no agent starts on it (launch takes a shared
    lock, then checks the marker is still in place), or None when an agent runs it (holds a
    shared lock) or it has no marker. The caller closes the descriptor when done."""
    import fcntl

    try:
        fd = os.open(os.path.join(env, MARKER), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return fd
    except BlockingIOError:
        os.close(fd)
        return None


def _envs(envs: str) -> list[tuple[float, str, str]]:
    """The environments in ``envs``, newest first: (marker's mtime, name, tree id)."""
    found = []
    for name in os.listdir(envs):
        marker = os.path.join(envs, name, MARKER)
        if name.startswith(".") or not os.path.isfile(marker):
            continue
        try:
            with open(marker) as f:
                tree = marker_tree(f.read())
        except (OSError, ValueError):
            continue
        found.append((os.stat(marker).st_mtime, name, tree))
    return sorted(found, reverse=True)


def _spare_order(envs: str) -> list[tuple[str, str]]:
    """The environments a sync may make the new one from, the best first: (name, tree). The
    oldest first, the newest last (a sync keeps the one before the new one while it can), and
    none an agent runs."""
    found = []
    for _, name, tree in reversed(_envs(envs)):
        fd = _claim(os.path.join(envs, name))
        if fd is not None:
            os.close(fd)
            found.append((name, tree))
    return found


def _spare_env(envs: str, tree: str | None) -> tuple[str, int] | None:
    """An environment of tree ``tree`` no agent runs, to be made into the new one in place
    (see ``_spare_order``): its folder, and its marker's descriptor holding the lock that keeps
    an agent from starting on it (launch waits for it, then finds it gone). None when there is
    none."""
    for name, found in _spare_order(envs):
        if found == tree and (fd := _claim(os.path.join(envs, name))) is not None:
            return os.path.join(envs, name), fd
    return None


def _prune(envs: str, newest: str, keep: int) -> tuple[list[str], list[str]]:
    """Remove environments beyond the ``keep`` most recent, never one an agent runs."""
    found = sorted(((name == newest, at, name) for at, name, _ in _envs(envs)), reverse=True)
    removed, in_use = [], []
    for _, _, name in found[keep:]:
        fd = _claim(os.path.join(envs, name))
        if fd is None:
            in_use.append(name)
            continue
        try:  # held across the rename: an agent starting now finds the marker gone
            _discard(envs, name)  # gone from view now; its files go after the answer
        finally:
            os.close(fd)
        removed.append(name)
    return removed, in_use


# -- put: one tree shipped by content (see ship.py for the sender) ------------------------------
INTERRUPTED = ("the stream ended early (the sync was interrupted; run it again: the files that "
               "arrived are kept)")  # fmt: skip


def widen_pipe(fd: int) -> None:
    """Give this pipe a MiB (64 KiB by default): a shipment is written a MiB at a time, and
    each time a pipe fills, its writer waits for its reader to be woken."""
    import fcntl

    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 1 << 20)
    except (OSError, AttributeError):  # not a pipe, a lower limit, or not Linux
        pass


def _frames(fd: int = 0):
    """The frames on stdin: (kind, payload) until the stream ends. Read through a buffer:
    a shipment is tens of thousands of small frames."""
    widen_pipe(fd)
    stream = open(fd, "rb", buffering=1 << 20, closefd=False)
    read, unpack_head = stream.read, struct.Struct(">I").unpack
    while True:
        head = read(5)
        if not head:
            return
        if len(head) < 5:
            raise EOFError(INTERRUPTED)
        size = unpack_head(head[1:])[0]
        payload = read(size)
        if len(payload) < size:
            raise EOFError(INTERRUPTED)
        yield head[:1], payload


def _say(answer) -> None:
    print(to_json(answer), flush=True)


_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\b": "\\b",
    "\f": "\\f",
}


def _escaped(c: str) -> str:
    if c in _ESCAPES or " " <= c < "\x7f":
        return _ESCAPES.get(c, c)
    n = ord(c)
    if n > 0xFFFF:  # as a surrogate pair, as json.dumps writes it
        n -= 0x10000
        return f"\\u{0xD800 + (n >> 10):04x}\\u{0xDC00 + (n & 0x3FF):04x}"
    return f"\\u{n:04x}"


def to_json(value) -> str:
    """``json.dumps(value)`` for what the node answers (dicts, lists, strings, numbers, None):
    the node program does without the json module (its import, with re and enum, was a third
    of a node's CPU in a re-sync). The same text as json.dumps gives."""
    if isinstance(value, str):
        if value.isascii() and value.isprintable() and '"' not in value and "\\" not in value:
            return f'"{value}"'  # the common case, at C speed: hashes, plain paths
        return '"' + "".join(map(_escaped, value)) + '"'
    if value is None or value is True or value is False:
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        return repr(value) if value - value == 0 else "null"  # (inf and nan: no JSON has them)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{to_json(str(k))}: {to_json(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(to_json, value)) + "]"
    raise TypeError(f"no JSON for {type(value).__name__}")


def _next(frames, want: bytes) -> bytes:
    kind, payload = next(frames, (b"", b""))
    if kind != want:
        raise EOFError(INTERRUPTED)
    return payload


def _manifest(store, frames) -> tuple[dict, list, list]:
    """Read the manifest frame (a delta from a tree this node has, or whole), asking for the
    whole one when the delta does not add up to the tree it names; it, the tree's entries
    and those of its base."""
    for attempt in (1, 2):
        change = unpack(_next(frames, b"M"))
        base = store.manifest(change["base"]) if change.get("base") else []
        if base is not None:
            entries = apply_delta(base, change)
            if tree_id(entries) == change["tree"]:
                return change, entries, base
        if attempt == 2:
            raise ValueError("the manifest that arrived does not match its tree id")
        _say({"state": "resend"})
    raise AssertionError


def _check_entries(entries: list, kind: str) -> None:
    allowed = 0o700 if kind == "data" else 0o755
    for e in entries:
        safe_path(e[0])
        if e[1] not in ("d", "f", "l") or e[2] & ~allowed:
            raise ValueError(f"refusing entry {e[0]!r}: kind {e[1]!r}, mode {e[2]:o}")


def put(local_dir: str, kind: str, name: str, force: str = "") -> None:
    """Receive one tree (an environment ``name`` = its fingerprint, or a data set) as the
    sender in ship.py talks: answer whether it is here; read its manifest; answer the
    objects missing; read them, each checked; link the tree and put it in place."""
    base, envs, env = _dirs(local_dir, name)
    frames = _frames()
    if kind == "env":
        state = check(local_dir, name)
        if state["state"] == "refused":
            raise UntrustedPath(state["problem"])
        if state["state"] == "present" and not force:
            _say({"state": "present"})
            return
    elif kind != "data":
        raise ValueError(f"unknown kind {kind!r}")
    elif not is_data_name(name):
        raise ValueError(f"{name!r} cannot name a data set: use letters, digits and _")
    with Store(base) as store:
        have = sorted(n[:-2] for n in os.listdir(store.trees) if n.endswith(".z"))
        if kind == "env" and os.path.isdir(envs):  # the best base first (see _spare_order)
            spare = [t for _, t in _spare_order(envs)]
            have = [t for t in spare if t in have] + [t for t in have if t not in spare]
        elif kind == "data":  # this data set's versions first, the current one first
            mine = data_versions(base, name)
            have = [t for t in mine if t in have] + [t for t in have if t not in mine]
        _say({"state": "absent", "have": have, "free_mib": store.free_mib()})
        import hashlib  # noqa: F401 - OpenSSL's set-up (~3 ms), while the manifest comes

        change, entries, before = _manifest(store, frames)
        # The rest is a manifest this node checked and saved: an environment's, or a data
        # set's (checked as data: an environment's base could give a data set wider modes)
        trusted = kind == "env" or change.get("base") in data_versions(base, None)
        _check_entries(change["set"] if trusted else entries, kind)
        tid, keep = change["tree"], int(change.get("keep", KEEP))
        if kind == "data" and not force and data_current(base, name) == tid:
            _say({"state": "present"})
            return
        if change.get("base") in trees_in_use(base):  # its files are all here: look only
            missing = store.missing(change["set"])  # for those of the entries that changed
        else:
            missing = store.missing(entries)
        if force:
            missing = {object_key(e): e[3] for e in entries if e[1] == "f"}
        store.check_room(sum(missing.values()), "this node")
        _say({"state": "missing", "missing": missing})
        received = files = 0
        for frame_kind, payload in frames:
            if frame_kind == b"E":
                break
            if frame_kind != b"O":
                raise ValueError(f"unexpected frame {frame_kind!r}")
            key, size, mtime = object_head(payload)
            if key not in missing:
                raise ValueError(f"an object this node did not ask for arrived: {key[:80]!r}")
            received += store.receive_object(key, _object_chunks(frames, size), mtime)
            verdict, said = next(frames, (b"", b""))
            if verdict != b"K":  # the sender did not read what it hashed, or stopped
                store.discard_object(key)
                if verdict == b"X":
                    path = said.decode(errors="replace")
                    raise StoreError(
                        f"{path} was not what was hashed when it was sent: {CHANGED}; run the "
                        "sync again"
                    )
                raise EOFError(INTERRUPTED)
            store.commit_object(key)
            files += 1
        else:
            raise EOFError(INTERRUPTED)
        lacking = [k for k in missing if not store.has(k)]
        if lacking:
            raise ValueError(f"{len(lacking)} files did not arrive; run the sync again")
        if kind == "env":
            private_dir(envs, "environment store")
            if os.path.isdir(env):
                _discard(envs, name)  # a broken one (no marker), or forced
            marker = {MARKER: to_json({"fingerprint": name, "tree": tid, "time": time.time()})
                      .encode()}  # fmt: skip
            spare = None if force else _spare_env(envs, change.get("base"))
            if spare is None:
                store.link_tree(entries, env, SHARED, marker)
            else:  # only what changed: the work of the change, not of the whole tree
                try:
                    store.evolve_tree(spare[0], before, change, env, SHARED, marker)
                finally:
                    os.close(spare[1])
            removed, in_use = _prune(envs, name, keep)
        else:
            freed = switch_data(store, name, tid, entries, prune=False)[1]
            removed, in_use = [], []
        _say({"state": "shipped", "files": files, "bytes": received, "tree": tid,
              "removed": removed, "in_use": in_use})  # fmt: skip

        def tidy() -> None:
            store.save_manifest(tid, entries)
            if kind == "env":
                if _empty_trash(envs):  # (also those an earlier tidy left)
                    store.collect(trees_in_use(base))
                elif spare is not None:  # the objects of the entries the change replaced
                    kept = {object_key(e) for e in entries if e[1] == "f"}
                    candidates = {object_key(e) for e in before if e[1] == "f"} - kept
                    store.collect(trees_in_use(base), candidates)
                else:
                    store.collect(trees_in_use(base), set())  # no tree left, none changed
            else:
                prune_data(store, name)  # and collects, when it removed one
                if freed:  # the objects of the entries the switch replaced
                    store.collect(trees_in_use(base), freed)
                keep_spare(store, name, tid, entries)

        _after_the_answer(tidy)


def _after_the_answer(work) -> None:
    """Run ``work()`` in a detached child that holds the store's lock (the next sync waits
    for it): the session ends at once, and the tidying (the manifest saved for the next
    delta, old trees removed, their files collected) goes on on the node."""
    sys.stdout.flush()
    sys.stderr.flush()
    if os.fork():
        return
    try:
        os.setsid()
        os.nice(10)  # housekeeping: after what a user or another sync does on this machine
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        work()
    finally:
        os._exit(0)


def _discard(envs: str, name: str) -> None:
    """Take environment ``name`` out of use at once (a rename); it is removed later."""
    os.rename(os.path.join(envs, name), os.path.join(envs, f".trash-{name}-{os.getpid()}"))


def _empty_trash(envs: str) -> int:
    """Remove the environments taken out of use; how many there were."""
    found = [entry for entry in os.listdir(envs) if entry.startswith(".trash-")]
    for entry in found:
        rmtree(os.path.join(envs, entry), ignore_errors=True)
    return len(found)


def _object_chunks(frames, size: int):
    left = size
    while left > 0:
        kind, payload = next(frames, (b"", b""))
        if kind != b"D":
            raise EOFError(INTERRUPTED)
        left -= len(payload)
        yield payload
    if left:
        raise ValueError("a file arrived longer than announced")


def launch(local_dir: str, fp: str) -> None:
    """Become the node agent of the synced environment ``fp`` (stdin stays as it is)."""
    import fcntl

    base, envs, env = _dirs(local_dir, fp)
    for path, what in ((base, "local_dir"), (envs, "environment store"), (env, "environment")):
        if not os.path.lexists(path):
            raise UntrustedPath(
                f"the synced environment {env} is not on this node (any more): run lounge sync"
            )
        check_private_dir(path, what)
    marker = os.path.join(env, MARKER)
    if not os.path.isfile(marker):  # a sync under way, or one that did not finish
        raise UntrustedPath(f"the synced environment {env} is not complete: run lounge sync")
    fd = os.open(marker, os.O_RDONLY | os.O_NOFOLLOW)
    fcntl.flock(fd, fcntl.LOCK_SH)  # held by the agent and its engines: sync keeps this env
    try:  # a sync that held it meanwhile may have removed it or made another tree of it
        still = os.stat(marker, follow_symlinks=False)
    except OSError:
        still = None
    seen = os.fstat(fd)
    if still is None or (still.st_dev, still.st_ino) != (seen.st_dev, seen.st_ino):
        raise UntrustedPath(
            f"the synced environment {env} was removed by a sync as it started: run lounge sync"
        )
    os.set_inheritable(fd, True)
    python = os.path.join(env, "bin", "python")
    os.execv(python, [python, "-m", "jupyter_lounge.node", "--stdio"])


def doctor(local_dir: str, fp: str, host: str, port: str) -> dict:
    """What ``lounge doctor`` asks of a node, with its base Python and no environment: the
    OS (and whether it is WSL), this Python, the environment, the free disk, the GPUs
    nvidia-smi sees, and whether the hub's address answers from here."""
    import platform
    import shutil
    import socket
    import subprocess

    wsl = os.environ.get("WSL_DISTRO_NAME", "")  # what WSL sets in every process it starts
    try:
        with open("/proc/version") as f:
            wsl = wsl or ("WSL" if "microsoft" in f.read().lower() else "")
    except OSError:
        pass
    folder = os.path.expanduser(local_dir)
    while not os.path.exists(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    smi = shutil.which("nvidia-smi") or shutil.which("/usr/lib/wsl/lib/nvidia-smi")
    gpus, smi_error = [], "" if smi else "no nvidia-smi on this node"
    if smi:
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
            gpus = [ln.strip() for ln in out.stdout.splitlines() if ln.startswith("GPU ")]
            smi_error = "" if out.returncode == 0 else (out.stderr or out.stdout).strip()[-200:]
        except (OSError, subprocess.TimeoutExpired) as e:
            smi_error = str(e)
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            hub = ""
    except OSError as e:
        hub = str(e)
    return {
        "os": platform.platform(),
        "wsl": wsl,
        "python": platform.python_version(),
        "env": check(local_dir, fp),
        "free_mib": free_mib(folder),
        "gpus": gpus,
        "nvidia_smi_error": smi_error,
        "hub_error": hub,
    }


def main(argv: list[str]) -> None:
    action, args = argv[0], argv[1:]
    try:
        if action == "check":
            print(to_json(check(*args)), flush=True)
        elif action == "doctor":
            print(to_json(doctor(*args)), flush=True)
        elif action == "launch":
            launch(*args)
        elif action == "put":
            put(*args)
        elif action == "data-list":
            print(to_json(data_sets(os.path.expanduser(args[0]))), flush=True)
        elif action == "data-remove":
            if not is_data_name(args[1]):
                raise ValueError(f"{args[1]!r} cannot name a data set")
            found = remove_data(os.path.expanduser(args[0]), args[1])
            print(to_json({"removed": found}), flush=True)
        else:
            raise ValueError(f"unknown action {action!r}")
    except (UntrustedPath, StoreError, OSError, ValueError, EOFError, TimeoutError) as e:
        print(f"jupyter_lounge on {os.uname().nodename}: {e}", file=sys.stderr, flush=True)
        sys.exit(3)
