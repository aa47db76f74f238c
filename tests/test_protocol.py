"""The agent protocol (protocol.py): its messages, their files, and the stdio link an agent
uses over SSH, driven here through real pipes by a real child process."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from jupyter_lounge import protocol
from jupyter_lounge.protocol import Control, ProtocolError, Report, Spec

pytestmark = pytest.mark.fast


def spec(tmp_path, **extra) -> Spec:
    return Spec(
        cluster="c",
        key="0.0",
        engine_kind="ipyparallel",
        connection_file=str(tmp_path / "conn.json"),
        control_file=str(tmp_path / "control.json"),
        report_file=str(tmp_path / "report.json"),
        **extra,
    )


def test_messages_round_trip_through_their_files_private(tmp_path):
    s = spec(tmp_path, preload=["numpy"], engine_options={"tls_dir": "/x"})
    protocol.write_spec(tmp_path / "spec.json", s)
    assert protocol.read_spec(tmp_path / "spec.json") == s
    assert (tmp_path / "spec.json").stat().st_mode & 0o777 == 0o600
    protocol.write_control(s.control_file, Control(ranks=[3, 4], size=5, interrupt="t"))
    assert protocol.read_control(s.control_file) == Control([3, 4], 5, "t")
    report = Report(node="n1", status="running", engines={"3": {"pid": 7, "state": "running"}})
    protocol.write_report(s.report_file, report)
    assert protocol.read_report(s.report_file) == report
    assert protocol.read_report(s.report_file).running() == 1
    assert protocol.read_report(tmp_path / "none.json") is None


def test_the_spec_holds_no_ranks_the_control_does():
    assert "ranks" not in {f.name for f in dataclasses.fields(Spec)}
    assert "ranks" in {f.name for f in dataclasses.fields(Control)}


def test_a_report_of_another_version_is_a_failed_agent_saying_so(tmp_path):
    path = tmp_path / "report.json"
    protocol.write_json(path, {"node": "pc7", "status": "running", "version": 99})
    report = protocol.read_report(path)
    assert report.status == "failed" and report.node == "pc7"
    assert "protocol version 99" in report.error and "same jupyter_lounge" in report.error
    with pytest.raises(ProtocolError, match="version None"):
        Control.from_dict({"ranks": [1]})


@pytest.mark.parametrize("line", [b"not json", b"[1, 2]", b'{"a": 1, "b": 2}'])
def test_a_line_that_is_not_of_the_protocol_is_refused(line):
    with pytest.raises(ProtocolError, match="not a protocol line"):
        protocol.decode(line)


def test_lines_name_their_kind():
    assert protocol.decode(protocol.encode("control", Control([1], 2))) == (
        "control",
        Control([1], 2).to_dict(),
    )


def test_the_file_link_returns_a_control_once_per_change(tmp_path):
    s = spec(tmp_path)
    protocol.write_spec(tmp_path / "spec.json", s)
    link = protocol.FileLink(str(tmp_path / "spec.json"))
    assert link.spec() == s
    assert link.poll(0) is None  # no control file yet
    protocol.write_control(s.control_file, Control([0, 1], 2))
    assert link.poll(0) == Control([0, 1], 2)
    assert link.poll(0) is None  # unchanged
    link.hup()
    assert link.poll(0) == Control([0, 1], 2)  # a nudge re-reads it


STDIO_AGENT = """
import sys
from jupyter_lounge.protocol import Report, StdioLink
link = StdioLink()
spec = link.spec()
print("this goes to stderr, not the report stream")
control = None
while control is None and not link.closed:
    control = link.poll(0.1)
files = sorted(__import__("os").listdir(link.run_dir))
link.publish(Report(node=spec.node, status="running", error=f"{control.ranks} {files}"))
while not link.closed:
    link.poll(0.1)
link.cleanup()
"""


def test_the_stdio_link_localizes_the_spec_takes_files_and_controls_and_reports(tmp_path):
    s = spec(tmp_path, node="pc1", local_dir=str(tmp_path / "local"))
    lines = [
        protocol.encode("spec", s),
        protocol.encode("files", {"connection.json": json.dumps({"a": 1})}),
        protocol.encode("control", Control([5, 6], 7)),
    ]
    proc = subprocess.run(
        [sys.executable, "-c", STDIO_AGENT],
        input=b"".join(lines),
        capture_output=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"this goes to stderr" in proc.stderr
    (kind, payload), *rest = [protocol.decode(x) for x in proc.stdout.splitlines()]
    assert kind == "report" and not rest
    report = Report.from_dict(payload)
    assert report.node == "pc1" and report.error == "[5, 6] ['connection.json', 'profile']"
    run = tmp_path / "local" / "run"
    assert run.stat().st_mode & 0o777 == 0o700 and list(run.iterdir()) == []  # cleaned up


def test_the_stdio_link_refuses_a_spec_of_another_version(tmp_path):
    data = {**spec(tmp_path).to_dict(), "version": 0}
    proc = subprocess.run(
        [sys.executable, "-m", "jupyter_lounge.node", "--stdio"],
        input=json.dumps({"spec": data}).encode() + b"\n",
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode != 0
    kind, payload = protocol.decode(proc.stdout.splitlines()[-1])
    assert kind == "report" and payload["status"] == "failed"
    assert "protocol version 0" in payload["error"]
