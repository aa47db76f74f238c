"""The node's side of ``lounge sync``, and of starting an agent from a synced environment.

Environments live on a node's own disk at ``<local_dir>/envs/<fingerprint>/``. Before any
exists there, the node has only its base Python, so this module (with ``trust.py``) uses the
standard library alone and travels as source: the command ssh runs is a short fixed bootstrap
(``BOOT``) that reads exactly that many bytes of program from stdin and runs it; whatever
follows on stdin (a tar stream, or the agent's spec) is left for the program. No shell syntax,
no path and no secret is in the command; the paths are its arguments, quoted once.

* ``check LOCAL_DIR FP``: is that environment there, and are the folders ours alone?
* ``receive LOCAL_DIR FP KEEP``: unpack a framed tar stream into a unique temporary folder,
  under the store's lock; verify the tree hash the sender computed while writing it; only
  then rename it into place. Older environments beyond ``KEEP`` are removed unless an agent
  uses one (agents hold a shared lock on its marker file while they run).
* ``launch LOCAL_DIR FP``: check the folders, take that shared lock, and become the node
  agent run by that environment's Python (``os.execv``, keeping stdin as it is).
* ``doctor LOCAL_DIR FP HOST PORT``: what ``lounge doctor`` asks of the node (see doctor).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
import time

try:
    from .trust import UntrustedPath, check_private_dir, private_dir
except ImportError:  # sent as source after trust.py's: its names are already here
    pass

MARKER = ".lounge-env"
LOCK_WAIT_S = 600.0
#: The command-line program ssh runs (with ``-I -c``): it reads N bytes of program from stdin.
BOOT = (
    "import os,sys\n"
    "n=int(sys.argv[1]);b=b''\n"
    "while len(b)<n:\n"
    " c=os.read(0,n-len(b))\n"
    " if not c:raise SystemExit('jupyter_lounge: the node program did not arrive')\n"
    " b+=c\n"
    "del sys.argv[1]\n"
    "exec(compile(b,'<jupyter_lounge node program>','exec'))\n"
)


def program() -> bytes:
    """This module's source after trust.py's, as one program, calling ``main``."""
    here = os.path.dirname(os.path.abspath(__file__))
    parts = []
    for name in ("trust.py", "envstore.py"):
        with open(os.path.join(here, name)) as f:
            parts += [ln for ln in f.read().splitlines() if not ln.startswith("from __future__")]
    parts.append("main(sys.argv[1:])")
    return ("\n".join(parts) + "\n").encode()


def command(python: str, action: str, *args: str) -> list[str]:
    """argv for the node: its ``python`` runs BOOT, which reads ``program()`` from stdin."""
    return [python, "-I", "-c", BOOT, str(len(program())), action, *args]


# -- the tree hash: what was sent is what arrived -----------------------------------------------
class TreeHash:
    """sha256 over the members of a tar stream, in order: kind, name, link target or size, and
    every byte of every file. The sender computes it while writing, the node while unpacking."""

    def __init__(self) -> None:
        self.h = hashlib.sha256()
        self.files = 0
        self.bytes = 0

    def member(self, kind: str, name: str, extra: str) -> None:
        self.h.update(f"{kind}\0{name}\0{extra}\n".encode("utf-8", "surrogateescape"))
        if kind == "f":
            self.files += 1

    def data(self, chunk: bytes) -> None:
        self.h.update(chunk)
        self.bytes += len(chunk)

    def hexdigest(self) -> str:
        return self.h.hexdigest()


def frame(kind: bytes, payload: bytes) -> bytes:
    """One frame of the stream after the program: ``D`` tar data, ``E`` the trailer (JSON)."""
    return kind + struct.pack(">I", len(payload)) + payload


class _FrameReader:
    """A file-like reader of the tar frames on stdin; stops at the trailer and keeps it.
    (tarfile reads 10 KiB at a time: the buffer moves a position, it is not re-sliced.)"""

    def __init__(self, fd: int = 0) -> None:
        self.fd, self.buf, self.pos, self.trailer = fd, bytearray(), 0, None

    def _exactly(self, n: int) -> bytearray:
        out = bytearray()
        while len(out) < n:
            chunk = os.read(self.fd, min(n - len(out), 1 << 20))
            if not chunk:
                raise EOFError("the stream ended early (the sync was interrupted)")
            out += chunk
        return out

    def read(self, n: int = -1) -> bytes:
        while self.trailer is None and (n < 0 or len(self.buf) - self.pos < n):
            del self.buf[: self.pos]  # once per frame: what was read goes
            self.pos = 0
            kind, size = self._exactly(1), struct.unpack(">I", self._exactly(4))[0]
            payload = self._exactly(size)
            if kind == b"E":
                self.trailer = json.loads(bytes(payload))
            else:
                self.buf += payload
        left = len(self.buf) - self.pos
        n = left if n < 0 or n > left else n
        out = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return out


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


def _locked(path: str):
    """The store's lock (exclusive), waited for up to LOCK_WAIT_S seconds."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"another sync held {path} for {LOCK_WAIT_S:g} s; try again later"
                ) from None
            time.sleep(0.2)


def _safe_name(name: str) -> str:
    parts = name.split("/")
    if name.startswith("/") or ".." in parts or not name:
        raise ValueError(f"refusing a path outside the environment: {name!r}")
    return name


def _unpack(reader: _FrameReader, into: str) -> TreeHash:
    import tarfile

    tree, made = TreeHash(), {into}
    with tarfile.open(fileobj=reader, mode="r|") as tar:
        for m in tar:
            name = _safe_name(m.name)
            dest = os.path.join(into, name)
            if os.path.dirname(dest) not in made:  # a member whose folder came first is usual
                os.makedirs(os.path.dirname(dest), 0o755, exist_ok=True)
                made.add(os.path.dirname(dest))
            if m.isdir():
                tree.member("d", name, "")
                os.makedirs(dest, 0o755, exist_ok=True)
                made.add(dest)
            elif m.issym():
                tree.member("l", name, m.linkname)
                os.symlink(m.linkname, dest)
            elif m.islnk():
                tree.member("h", name, m.linkname)
                os.link(os.path.join(into, _safe_name(m.linkname)), dest)
            elif m.isreg():
                tree.member("f", name, str(m.size))
                src = tar.extractfile(m)
                fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "wb") as out:
                    while chunk := src.read(1 << 20):
                        tree.data(chunk)
                        out.write(chunk)
                os.chmod(dest, m.mode & 0o755)  # nobody else may change it
    return tree


def _in_use(env: str) -> bool:
    """Does a running agent hold this environment (a shared lock on its marker)?"""
    import fcntl

    try:
        fd = os.open(os.path.join(env, MARKER), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def receive(local_dir: str, fp: str, keep: int) -> dict:
    import shutil
    import tempfile

    base, envs, env = _dirs(local_dir, fp)
    private_dir(base, "local_dir")
    private_dir(envs, "environment store")
    lock = _locked(os.path.join(envs, ".lock"))
    try:
        for name in os.listdir(envs):  # what an interrupted sync left (we hold the lock)
            if name.startswith(f".{fp}.part-") or name.endswith(".part"):
                shutil.rmtree(os.path.join(envs, name), ignore_errors=True)
        tmp = tempfile.mkdtemp(prefix=f".{fp}.part-", dir=envs)
        try:
            reader = _FrameReader()
            tree = _unpack(reader, tmp)
            while reader.trailer is None:  # the tar's end padding, then the trailer
                reader.read(1 << 16)
            sent = reader.trailer
            if sent.get("tree") != tree.hexdigest():
                raise ValueError(
                    f"the environment arrived damaged: {tree.files} files, {tree.bytes} bytes "
                    f"received, {sent.get('files')} files, {sent.get('bytes')} bytes sent"
                )
            marker = {"fingerprint": fp, "tree": tree.hexdigest(), "time": time.time()}
            with open(os.path.join(tmp, MARKER), "w") as f:
                json.dump(marker, f)
            os.chmod(tmp, 0o755)
            if os.path.isdir(env) and not os.path.isfile(os.path.join(env, MARKER)):
                shutil.rmtree(env)  # a broken one (from an older version): replaced
            if os.path.isdir(env):
                shutil.rmtree(tmp)  # another sync finished it meanwhile
            else:
                os.rename(tmp, env)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        removed, kept_in_use = _prune(envs, fp, keep)
    finally:
        os.close(lock)
    return {
        "state": "shipped",
        "files": tree.files,
        "bytes": tree.bytes,
        "removed": removed,
        "in_use": kept_in_use,
    }


def _prune(envs: str, newest: str, keep: int) -> tuple[list[str], list[str]]:
    """Remove environments beyond the ``keep`` most recent, never one an agent runs."""
    import shutil

    found = []
    for name in os.listdir(envs):
        marker = os.path.join(envs, name, MARKER)
        if not name.startswith(".") and os.path.isfile(marker):
            found.append((name == newest, os.stat(marker).st_mtime, name))
    found.sort(reverse=True)
    removed, in_use = [], []
    for _, _, name in found[keep:]:
        path = os.path.join(envs, name)
        if _in_use(path):
            in_use.append(name)
        else:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(name)
    return removed, in_use


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
        "free_mib": shutil.disk_usage(folder).free // 2**20,
        "gpus": gpus,
        "nvidia_smi_error": smi_error,
        "hub_error": hub,
    }


def main(argv: list[str]) -> None:
    action, args = argv[0], argv[1:]
    try:
        if action == "check":
            print(json.dumps(check(*args)), flush=True)
        elif action == "doctor":
            print(json.dumps(doctor(*args)), flush=True)
        elif action == "receive":
            print(json.dumps(receive(args[0], args[1], int(args[2]))), flush=True)
        elif action == "launch":
            launch(*args)
        else:
            raise ValueError(f"unknown action {action!r}")
    except (UntrustedPath, OSError, ValueError, EOFError, TimeoutError) as e:
        print(f"jupyter_lounge on {os.uname().nodename}: {e}", file=sys.stderr, flush=True)
        sys.exit(3)
