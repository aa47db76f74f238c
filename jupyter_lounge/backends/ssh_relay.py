"""The local half of the ssh backend: one relay per node agent reached over SSH.

``python -m jupyter_lounge.backends.ssh_relay SPEC [--program [--first LINE]] -- ssh ... -- CMD``

(``--program``: the command is envstore's bootstrap, which first reads the node program from
the session's stdin, then starts the agent of a synced environment; ``--first``: a line to
send before it, the one WSL's bash runs on a Windows PC.)

The relay runs here, beside the controller, in the agent's place: the cluster reads and writes
the same spec, control and report files as for any other agent, and the relay carries them
over the SSH session's stdin and stdout as lines of the agent protocol (``protocol.py``; the
agent's end is its ``StdioLink``), so no connection info is ever on a command line, and
nothing needs a shared file system:

* to the agent: the spec first; the connection file (and, for Dask, the
  cluster CA's certificate and the workers' certificate and key) once the controller has
  written it; the control file
  whenever it changes (polled, and at once on SIGHUP);
* from the agent: its reports, written to the local report file.

SIGTERM asks the agent to stop (as the control file does) and ends the session after a grace
period. The relay exits when the session ends, with its exit code.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from .. import protocol
from ..procs import output_text
from ..protocol import Control, ProtocolError, Report, read_json

POLL_S = 0.2
STOP_GRACE_S = 8.0


class Relay:
    def __init__(self, spec_path: str, ssh: list[str], program: bool = False, first: str = ""):
        self.spec = protocol.read_spec(spec_path)
        if self.spec is None:
            raise SystemExit(f"relay: cannot read spec file {spec_path}")
        self.ssh = ssh
        self.program = program  # the node program (envstore) goes first: it starts the agent
        self.first = first.encode()  # before it, the line WSL's bash runs (Windows PCs)
        self.files_sent = False
        self.control_mtime = 0.0
        self.hup = False
        self.term_at: float | None = None
        self.stop_sent = False
        self.reported = False  # an agent's report came: its lines are the protocol now

    def send(self, kind: str, payload) -> None:
        try:
            self.proc.stdin.write(protocol.encode(kind, payload))
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass  # the session ended; the loop sees it on stdout

    def connection_files(self) -> dict | None:
        """The files an agent needs to reach the controller, once they all exist."""
        path = Path(self.spec.connection_file)
        if read_json(path) is None:
            return None
        files = {"connection.json": path.read_text()}
        tls_dir = self.spec.engine_options.get("tls_dir")
        if tls_dir and self.spec.engine_kind == "dask":  # ipyparallel's keys are in it
            from ..engines.dask import NODE_FILES  # the CA and the workers' own: not the client's

            for name in NODE_FILES:
                files[name] = (Path(tls_dir) / name).read_text()
        return files

    def forward_control(self) -> None:
        try:
            mtime = os.stat(self.spec.control_file).st_mtime
        except FileNotFoundError:
            return
        if mtime != self.control_mtime or self.hup:
            self.control_mtime, self.hup = mtime, False
            control = protocol.read_control(self.spec.control_file)
            if control is not None:
                self.send("control", control)

    def run(self) -> int:
        signal.signal(signal.SIGHUP, lambda *_: setattr(self, "hup", True))
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        self.proc = subprocess.Popen(self.ssh, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        if self.program:
            from ..envstore import program

            try:
                self.proc.stdin.write(self.first + program())
            except (BrokenPipeError, OSError):
                pass  # the session ended; the loop sees it on stdout
        self.send("spec", self.spec)
        out, buf = self.proc.stdout.fileno(), b""
        while True:
            if not self.files_sent:
                files = self.connection_files()
                if files is not None:
                    self.send("files", files)
                    self.files_sent = True
            self.forward_control()
            if self.term_at is not None and not self.stop_sent:
                self.send("control", Control(stop=True))
                self.stop_sent = True
            if self.term_at is not None and time.monotonic() - self.term_at > STOP_GRACE_S:
                self.proc.kill()
            try:
                ready, _, _ = select.select([out], [], [], POLL_S)
            except InterruptedError:
                continue
            if not ready:
                continue
            chunk = os.read(out, 1 << 16)
            if not chunk:
                return self.proc.wait()
            *lines, buf = (buf + chunk).split(b"\n")
            for line in lines:
                try:
                    kind, payload = protocol.decode(line)
                    if kind != "report":
                        continue
                    protocol.write_report(self.spec.report_file, Report.from_dict(payload))
                    self.reported = True
                except ProtocolError as e:
                    if not self.reported:  # the node's own words before any agent ran (a
                        # Windows PC's wsl.exe: "There is no distribution ..."): to the log,
                        # which the cluster quotes when the session ends
                        print(f"node: {output_text(line).strip()}", file=sys.stderr, flush=True)
                        continue
                    # an agent of another version: the cluster says so
                    failed = Report(status="failed", error=f"The node agent sent {e}.")
                    protocol.write_report(self.spec.report_file, failed)
                except OSError:  # a full disk: the next report may get through
                    pass

    def _on_term(self, signum, frame) -> None:
        if self.term_at is None:
            self.term_at = time.monotonic()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    program = len(argv) > 1 and argv[1] == "--program"
    if program:
        del argv[1]
    first = ""
    if program and len(argv) > 2 and argv[1] == "--first":
        first = argv[2]
        del argv[1:3]
    if len(argv) < 3 or argv[1] != "--":
        raise SystemExit(
            "usage: python -m jupyter_lounge.backends.ssh_relay SPEC.json "
            "[--program [--first LINE]] -- SSH ..."
        )
    sys.exit(Relay(argv[0], argv[2:], program, first).run())


if __name__ == "__main__":
    main()
