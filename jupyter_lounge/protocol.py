"""The agent protocol: everything a cluster and its node agents say to each other.

Three messages, each a JSON object that carries the protocol ``version``:

* ``Spec``, cluster -> agent, once: which engine kind, what to preload, where the files are.
* ``Control``, cluster -> agent, whenever it changes: the ranks wanted, the cluster's size, an
  interrupt token, stop. Ranks live here only: a scale edits the control, never the spec.
* ``Report``, agent -> cluster, on every change and every probe (its heartbeat): status,
  each engine's state, the machine's telemetry, the launch phases.

Two links carry them, behind one interface (``spec()``, ``poll(timeout)``, ``publish()``):

* ``FileLink`` (local, Slurm: one file system): the spec, control and report files of the
  cluster's folder. The agent re-reads the control file when it changes, at once on SIGHUP.
* ``StdioLink`` (ssh: the node shares no file system): JSON lines on the SSH session; on the
  cluster's side ``backends/ssh_relay.py`` turns them into the same files, so the cluster
  reads and writes files whichever link an agent has.

The files are written atomically with mode 0600 (readers see the old or the new one, never
half). An agent of another protocol version is refused with a sentence saying so. This
module imports nothing of the package but ``trust`` (node agents import it before they fork).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import tempfile
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

VERSION = 1


class ProtocolError(Exception):
    """A message this side cannot use (another version, or not a message at all)."""


# -- atomic JSON files ------------------------------------------------------------------------
def write_json(path: Path | str, data: Any, compact: bool = False) -> None:
    """Write JSON atomically with mode 0600: readers see the old or the new file, never half.
    ``compact``: on one line, unsorted (a cache of tens of thousands of entries: 10x faster)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            if compact:
                f.write(json.dumps(data, separators=(",", ":")))
            else:
                json.dump(data, f, indent=1, sort_keys=True)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def read_json(path: Path | str) -> Any:
    """The parsed file, or None when it is missing or caught mid-creation."""
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return None


# -- the messages -----------------------------------------------------------------------------
class _Message:
    """A dataclass that travels as a JSON object with the protocol version."""

    @classmethod
    def from_dict(cls, data: Any):
        if not isinstance(data, dict):
            raise ProtocolError(f"a {cls.__name__.lower()} must be a JSON object, not {data!r:.80}")
        version = data.get("version")
        if version != VERSION:
            raise ProtocolError(
                f"a {cls.__name__.lower()} of agent protocol version {version}, and this side "
                f"speaks version {VERSION}: run the same jupyter_lounge on the node and here"
            )
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Spec(_Message):
    """What one node agent runs: written once by the cluster, read once by the agent."""

    cluster: str
    key: str  # the agent's key in its cluster: "<allocation>.<task>"
    engine_kind: str
    connection_file: str  # the controller's file the engines connect with
    control_file: str
    report_file: str
    node: str | None = None  # None: the agent names itself after its host
    preload: list[str] = field(default_factory=list)
    gpus: list[str] | None = None  # None: the agent finds the node's own
    engines_per_gpu: int = 1
    restart: bool = True  # fork a crashed engine again (up to the agent's limit)
    connect_timeout: float = 60.0  # seconds to wait for the controller's connection file
    courtesy: dict | None = None  # the idle policy (telemetry.IdlePolicy) to follow, if any
    engine_options: dict = field(default_factory=dict)  # the engine kind's own
    local_dir: str | None = None  # ssh: the node-local folder the agent keeps its files in
    presence: str = "linux"  # "windows": who uses the PC is seen from Windows (windows.py)
    data: dict = field(default_factory=dict)  # data set name -> its folder, as it is (local)
    stage: list = field(default_factory=list)  # Slurm: data sets to copy to scratch first
    # ({name, source, manifest, tree}; see treestore.stage_copy)
    scratch: str | None = None  # Slurm: the node-local folder they go to (None: $TMPDIR)
    version: int = VERSION


@dataclass
class Control(_Message):
    """What the cluster wants of one agent now."""

    ranks: list[int] = field(default_factory=list)
    size: int = 0  # engines in the whole cluster (each engine's LOUNGE_SIZE)
    interrupt: str | None = None  # a new token: interrupt the running work once
    stop: bool = False
    version: int = VERSION


@dataclass
class Report(_Message):
    """How one agent is: its status, and each engine by rank (``str(rank)`` -> pid, state,
    restarts, crashes, index, exit)."""

    node: str = ""
    status: str = "starting"  # preloading, waiting-controller, running, in use, stopped, failed
    host: str = ""
    pid: int = 0
    error: str | None = None
    engines: dict[str, dict] = field(default_factory=dict)
    time: float = 0.0  # when it was written (time.time()); a silent agent is a lost one
    timings: list[list] = field(default_factory=list)  # [phase, seconds] in launch order
    telemetry: dict | None = None  # the last sample of the machine (telemetry.Telemetry)
    courtesy: dict | None = None  # {"state", "reason"} when the agent yields to people
    version: int = VERSION

    def running(self) -> int:
        return sum(1 for e in self.engines.values() if e.get("state") == "running")


def write_spec(path: Path | str, spec: Spec) -> None:
    write_json(path, spec.to_dict())


def read_spec(path: Path | str) -> Spec | None:
    data = read_json(path)
    return None if data is None else Spec.from_dict(data)


def write_control(path: Path | str, control: Control) -> None:
    write_json(path, control.to_dict())


def read_control(path: Path | str) -> Control | None:
    data = read_json(path)
    return None if data is None else Control.from_dict(data)


def write_report(path: Path | str, report: Report) -> None:
    write_json(path, report.to_dict())


def read_report(path: Path | str) -> Report | None:
    """The agent's last report; None before its first. A report this side cannot read is a
    failed agent, with the sentence saying why (an old jupyter_lounge on the node)."""
    data = read_json(path)
    if data is None:
        return None
    try:
        return Report.from_dict(data)
    except ProtocolError as e:
        node = data.get("node", "") if isinstance(data, dict) else ""
        return Report(node=node, status="failed", error=f"The node agent sent {e}.")


# -- lines on an SSH session ------------------------------------------------------------------
def encode(kind: str, payload: Any) -> bytes:
    """One line of the stdio link: ``{"spec": ...}``, ``{"files": ...}``, ``{"control": ...}``
    to the agent; ``{"report": ...}`` from it."""
    if isinstance(payload, _Message):
        payload = payload.to_dict()
    return json.dumps({kind: payload}, separators=(",", ":")).encode() + b"\n"


def decode(line: bytes) -> tuple[str, Any]:
    """(kind, payload) of one line; ProtocolError when it is not a line of this protocol."""
    try:
        message = json.loads(line)
    except ValueError:
        raise ProtocolError(f"not a protocol line: {line[:80]!r}") from None
    if not isinstance(message, dict) or len(message) != 1:
        raise ProtocolError(f"not a protocol line: {line[:80]!r}")
    return next(iter(message.items()))


# -- the agent's links ------------------------------------------------------------------------
class FileLink:
    """The agent's side when the cluster's folder is on this node's file system (local,
    Slurm): the control file is re-read when it changes, at once after ``hup()``."""

    closed = False  # a file link never closes: the controller probe notices a lost cluster

    def __init__(self, spec_path: str, carried: dict | None = None):
        self.spec_path = spec_path if carried is None else carried["spec_path"]
        self._spec: Spec | None = None
        self._mtime = 0.0
        self._hup = True  # a re-executed agent reads the control afresh too

    def carry(self) -> dict:
        """What an agent executing itself anew needs to go on with this link (NodeAgent.rest)."""
        return {"kind": "file", "spec_path": self.spec_path}

    def spec(self) -> Spec:
        try:
            self._spec = read_spec(self.spec_path)
        except ProtocolError as e:
            raise SystemExit(f"node agent: spec file {self.spec_path}: {e}") from None
        if self._spec is None:
            raise SystemExit(f"node agent: cannot read spec file {self.spec_path}")
        return self._spec

    def hup(self) -> None:
        self._hup = True

    def poll(self, timeout: float) -> Control | None:
        """Wait ``timeout`` seconds; the control when it changed since the last poll."""
        if timeout > 0:
            time.sleep(timeout)
        path = self._spec.control_file
        try:
            mtime = os.stat(path).st_mtime
        except FileNotFoundError:
            return None
        if mtime == self._mtime and not self._hup:
            return None
        self._mtime, self._hup = mtime, False
        try:
            return read_control(path)
        except ProtocolError:
            return None  # a control of another version: the spec would have said so first

    def publish(self, report: Report) -> None:
        try:
            write_report(self._spec.report_file, report)
        except OSError:  # a full disk: the engines run on; the next report may get through
            pass

    def close_in_child(self) -> None:
        """In a forked engine: nothing of the link to close."""

    def cleanup(self) -> None:
        """At the agent's exit: the cluster's folder is the cluster's to remove."""


class StdioLink:
    """The agent's side of an SSH session when the node shares no file system with the
    cluster (``--stdio``): lines in on stdin (the spec first, then the connection files and
    every control change), reports out on the original stdout. The agent's own stdout and its
    engines' go to stderr, so nothing but reports travels on the report stream; a closed
    stdin means the session is gone. No thread: ``poll`` waits with ``select``.

    The agent's files live in a private node-local folder (``<local_dir>/run/<cluster>.<key>``)
    that the link makes, points the spec at, and removes at exit."""

    def __init__(self, carried: dict | None = None):
        self.out = os.dup(1)
        os.set_inheritable(self.out, False)
        os.dup2(2, 1)
        self.buf = b""
        self.closed = False
        self.run_dir: str | None = None
        self._spec: dict | None = None  # the spec as it arrived, localized
        self._control: Control | None = None  # the last control that arrived
        self._fresh = False  # ... and poll has not returned it yet
        if carried is not None:  # the same session, in an agent that executed itself anew
            self.buf = carried["buf"].encode("latin-1")
            self.closed, self.run_dir = carried["closed"], carried["run_dir"]
            self._spec = carried["spec"]
            if carried["control"] is not None:
                self._control, self._fresh = Control.from_dict(carried["control"]), True

    def carry(self) -> dict:
        """What an agent executing itself anew needs to go on with this session (see
        NodeAgent.rest): the report stream goes back on fd 1, where the new agent looks for
        it; the bytes read but not yet taken, the spec and the last control go in the dict."""
        os.dup2(self.out, 1)
        control = None if self._control is None else self._control.to_dict()
        return {"kind": "stdio", "buf": self.buf.decode("latin-1"), "closed": self.closed,
                "run_dir": self.run_dir, "spec": self._spec, "control": control}  # fmt: skip

    def _lines(self, timeout: float | None) -> list[tuple[str, Any]]:
        """The lines that arrived within ``timeout`` (None: wait for at least one)."""
        while True:
            if b"\n" in self.buf:
                *lines, self.buf = self.buf.split(b"\n")
                return [decode(line) for line in lines if line.strip()]
            if self.closed:
                if timeout:
                    time.sleep(timeout)
                return []
            if not select.select([0], [], [], timeout)[0]:
                return []
            chunk = os.read(0, 1 << 16)
            if not chunk:
                self.closed = True
            self.buf += chunk

    def spec(self) -> Spec:
        if self._spec is not None:
            return Spec.from_dict(self._spec)
        lines = self._lines(None)
        if not lines:
            raise SystemExit("node agent: stdin closed before the spec arrived")
        (kind, payload), rest = lines[0], lines[1:]
        if kind != "spec":
            raise SystemExit(f"node agent: the first line was {kind!r}, not the spec")
        try:
            spec = Spec.from_dict(payload)
        except ProtocolError as e:
            self.publish(Report(node=socket.gethostname(), status="failed", error=str(e)))
            raise SystemExit(f"node agent: {e}") from None
        self._localize(spec)
        self._spec = spec.to_dict()
        self._take(rest)
        return spec

    def _localize(self, spec: Spec) -> None:
        """Point the spec's files at a private node-local folder (the cluster's own paths are
        on the machine that runs the controller, not here)."""
        from .trust import UntrustedPath, private_dir

        base = os.path.expanduser(spec.local_dir or "~/.cache/jupyter_lounge")
        run = os.path.join(base, "run", f"{spec.cluster}.{spec.key}")
        try:  # ours alone, or refused: the engines' keys and connection files go here
            private_dir(base, "local_dir")
            private_dir(os.path.join(base, "run"), "agents' folder")
            remove_stale_run_dirs(os.path.join(base, "run"))
            private_dir(run, "agent folder")
        except (UntrustedPath, OSError) as e:
            where = spec.node or socket.gethostname()
            message = f"node {where!r} refuses its local_dir: {e}"
            self.publish(Report(node=where, status="failed", error=message, time=time.time()))
            raise SystemExit(f"node agent: {message}") from None
        self.run_dir = run
        spec.connection_file = os.path.join(run, "connection.json")
        spec.control_file = os.path.join(run, "control.json")
        spec.report_file = os.path.join(run, "report.json")
        options = spec.engine_options
        options["profile_dir"] = os.path.join(run, "profile")
        os.makedirs(options["profile_dir"], mode=0o700, exist_ok=True)
        options["local_directory"] = os.path.join(run, "dask-worker-space")
        if options.get("tls_dir"):
            options["tls_dir"] = run

    def _take(self, lines: list[tuple[str, Any]]) -> None:
        """Write the files that arrived into the run folder; keep the last control."""
        for kind, payload in lines:
            if kind == "files":
                for name, text in payload.items():
                    path = os.path.join(self.run_dir, os.path.basename(name))
                    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                    with os.fdopen(fd, "w") as f:
                        f.write(text)
                    os.replace(path + ".tmp", path)
            elif kind == "control":
                self._control, self._fresh = Control.from_dict(payload), True

    def hup(self) -> None:
        """Nothing to re-read: every control change arrives as a line."""

    def poll(self, timeout: float) -> Control | None:
        """Wait up to ``timeout`` for lines (less when one comes); the control when a new one
        arrived since the last poll."""
        self._take(self._lines(timeout))
        control, self._fresh = (self._control if self._fresh else None), False
        return control

    def publish(self, report: Report) -> None:
        if self.run_dir is not None:  # the node-local copy tells a later agent we live
            try:
                write_report(os.path.join(self.run_dir, "report.json"), report)
            except OSError:
                pass
        try:
            os.write(self.out, encode("report", report))
        except OSError:  # the session is gone; the stdin side notices and stops the agent
            self.closed = True

    def close_in_child(self) -> None:
        """In a forked engine: the link is the agent's alone."""
        os.close(self.out)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)

    def cleanup(self) -> None:
        if self.run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)


def remove_stale_run_dirs(root: str, young_s: float = 120.0) -> None:
    """Remove the folders of agents that died without cleaning up (a power cut): their report
    names a pid that is no node agent now, or they have no report and are not new."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return
    for name in names:
        path = os.path.join(root, name)
        report = read_json(os.path.join(path, "report.json"))
        try:
            if report is None and time.time() - os.stat(path).st_mtime < young_s:
                continue  # an agent starting right now
            with open(f"/proc/{int((report or {}).get('pid') or 0)}/cmdline", "rb") as f:
                if b"jupyter_lounge.node" in f.read():
                    continue
        except (OSError, ValueError):
            pass
        shutil.rmtree(path, ignore_errors=True)
