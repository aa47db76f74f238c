"""Secure by default, tested as a stranger would: another user at every port of a cluster, a
capture of what crosses the testbed's bridge, injected values, planted folders.

The stranger is ``nobody`` running tests/stranger.py, in the network namespace of each
listening process (a user on the same PC or login node) and, for ports on a node's address,
from this machine too (anyone on the lounge LAN).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from jupyter_lounge import Lounge, state
from jupyter_lounge.errors import LoungeError
from jupyter_lounge.procs import group_members

from .conftest import inventory_for_testbed, node_processes, slurm_testbed_problem, wait_until

KINDS = ["ipyparallel", "dask"]
HERE = Path(__file__).parent
TESTBED = Path(os.environ.get("LOUNGE_TESTBED", "/tmp/lounge-testbed"))


# -- who listens where -------------------------------------------------------------------------
def cluster_pids(cluster) -> set[int]:
    """The cluster's processes: the controller's group, local agents and their engines, and
    every jupyter_lounge process on the testbed's nodes (agents and their engines)."""
    import psutil

    pids = {cluster.controller_pid, *group_members(cluster.controller_pid)}
    for agent in cluster.agents:
        if agent.get("pid"):
            pids.add(agent["pid"])
            try:
                pids |= {p.pid for p in psutil.Process(agent["pid"]).children(recursive=True)}
            except psutil.NoSuchProcess:
                pass
    if cluster.backend.name != "local":
        for i in (1, 2, 3):
            for line in node_processes(i):
                pid, command = line.split(" ", 1)
                # srun and slurmstepd are Slurm's (its own listeners, authenticated by
                # Slurm's credentials); they carry our agent's command line as arguments
                if not command.startswith(("srun", "slurmstepd", "/usr/bin/srun")):
                    pids.add(int(pid))
    return pids


def _hex_address(text: str) -> str:
    raw = bytes.fromhex(text)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return str(ipaddress.IPv6Address(words))


def listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket ``pid`` listens on, read from its own network
    namespace (psutil reads this one's)."""
    try:
        inodes = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
        found = set()
        for table in ("tcp", "tcp6"):
            with open(f"/proc/{pid}/net/{table}") as f:
                for line in f.read().splitlines()[1:]:
                    cols = line.split()
                    if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                        host, port = cols[1].split(":")
                        found.add((_hex_address(host), int(port, 16)))
        return found
    except OSError:
        return set()  # it exited meanwhile


def unix_listening(pid: int) -> set[str]:
    """The path of every Unix socket ``pid`` listens on (``/proc/net/unix``: flags
    00010000, accepting connections)."""
    try:
        inodes = {
            link[8:-1]
            for fd in os.listdir(f"/proc/{pid}/fd")
            if (link := os.readlink(f"/proc/{pid}/fd/{fd}")).startswith("socket:[")
        }
        with open(f"/proc/{pid}/net/unix") as f:
            rows = [line.split() for line in f.read().splitlines()[1:]]
    except OSError:
        return set()  # it exited meanwhile
    return {r[7] for r in rows if len(r) > 7 and r[3] == "00010000" and r[6] in inodes}


def netns(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def ss_listeners(pid: int) -> list[str]:
    """``ss -ltnpH`` as seen in the network namespace of ``pid``."""
    out = subprocess.run(
        ["nsenter", f"--net=/proc/{pid}/ns/net", "ss", "-ltnpH"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return out.stdout.splitlines()


def stranger(pid: int | None, canary: str, ports: list[str]) -> list[dict]:
    """tests/stranger.py as ``nobody``, in the network namespace of ``pid`` (None: here)."""
    site = sysconfig.get_paths()["purelib"]
    python = ["/usr/bin/python3", "-s"] if os.path.exists("/usr/bin/python3") else [sys.executable]
    cmd = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    cmd += ["env", f"PYTHONPATH={site}", "HOME=/tmp", *python, str(HERE / "stranger.py")]
    cmd += [canary, *ports]
    if pid is not None:
        cmd = ["nsenter", f"--net=/proc/{pid}/ns/net", *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return [json.loads(line) for line in out.stdout.splitlines()]


def probe_everything(cluster) -> tuple[list[dict], list[str]]:
    """Every listening port of the cluster, tried by the stranger: from the listener's own
    network namespace, and from this machine for a node's address. Returns the stranger's
    rows and the ss lines of the cluster's listeners."""
    pids = cluster_pids(cluster)
    by_ns: dict[str, tuple[int, set]] = {}
    for pid in pids:
        found = listening(pid)
        if found:
            ns = netns(pid)
            by_ns.setdefault(ns, (pid, set()))[1].update(found)
    ss_lines = []
    for pid, _ in by_ns.values():
        ss_lines += [line for line in ss_listeners(pid) if any(f"pid={p}," in line for p in pids)]
    canary = f"/tmp/lounge-canary-{uuid.uuid4().hex[:8]}"
    rows, mine = [], netns(os.getpid())
    paths = sorted({path for pid in pids for path in unix_listening(pid)})
    if paths:  # a local cluster's sockets: tried by a user of this machine
        rows += stranger(None, canary, paths)
    for ns, (pid, found) in by_ns.items():
        ports = sorted(f"{ip}:{port}" for ip, port in found)
        rows += stranger(pid if ns != mine else None, canary, ports)
        lan = sorted(f"{ip}:{port}" for ip, port in found if not ip.startswith("127."))
        if ns != mine and lan:  # and from here: someone else on the LAN
            rows += stranger(None, canary, lan)
    assert not os.path.exists(canary), "a stranger's code ran on the cluster"
    return rows, ss_lines


# -- what crosses the bridge -------------------------------------------------------------------
def pcap_payloads(path: Path) -> tuple[bytes, int]:
    """(every packet's bytes joined, TCP payload bytes between this machine and the nodes
    except ssh's): enough to search for a marker and to know the map's traffic was seen."""
    data = path.read_bytes()
    pos, raw, payload = 24, [], 0
    while pos + 16 <= len(data):
        incl = struct.unpack("<I", data[pos + 8 : pos + 12])[0]
        packet = data[pos + 16 : pos + 16 + incl]
        pos += 16 + incl
        raw.append(packet)
        if len(packet) < 34 or packet[12:14] != b"\x08\x00" or packet[23] != 6:
            continue  # not IPv4 TCP
        ihl = (packet[14] & 0x0F) * 4
        tcp = packet[14 + ihl :]
        sport, dport = struct.unpack(">HH", tcp[:4])
        body = tcp[(tcp[12] >> 4) * 4 :]
        if 22 not in (sport, dport):
            payload += len(body)
    return b"".join(raw), payload


class Capture:
    """tcpdump on the testbed's bridge for as long as the ``with`` block runs."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.proc = subprocess.Popen(
            ["tcpdump", "-i", "lbr0", "-n", "-s", "0", "-U", "-w", str(self.path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        wait_until(lambda: self.path.exists(), 10, "tcpdump to start writing")
        time.sleep(0.5)
        return self

    def __exit__(self, *exc):
        time.sleep(0.5)
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=10)
        self.said = self.proc.stderr.read().decode(errors="replace")


def send_in_clear(text: str) -> None:
    """A marker sent in the clear across the bridge: the capture must see it (a control)."""
    import socket

    with socket.create_connection(("10.77.0.11", 22), timeout=5) as s:
        s.sendall(text.encode())
        time.sleep(0.3)


def backend_options(where: str, tmp_path) -> dict:
    if where == "local":
        return {"backend": "local"}
    problem = slurm_testbed_problem()
    if problem:
        pytest.skip(problem)
    if where == "slurm":
        return {"backend": "slurm", "engines_per_node": 2}
    return inventory_for_testbed(tmp_path / "lounge.toml")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("where", ["local", "slurm", "ssh"])
def test_a_stranger_can_neither_reach_nor_read_a_cluster(kind, where, tmp_path, lounge_dir):
    options = backend_options(where, tmp_path)
    marker = f"tissue-sample-{uuid.uuid4().hex[:12]}"
    control = f"in-the-clear-{uuid.uuid4().hex[:12]}"
    cluster = Lounge(4, engines=kind, nodes=2, wait=True, **options)
    capture = Capture(tmp_path / "bridge.pcap") if where != "local" else None
    try:
        if capture:
            capture.__enter__()
        cluster.start_sync()
        df = cluster.map(lambda s: s.upper(), [f"{marker}-{i}" for i in range(24)], progress=False)
        assert list(df.result) == [f"{marker}-{i}".upper() for i in range(24)]
        if capture:  # once the control is written, so is every packet before it
            send_in_clear(control)
            wait_until(
                lambda: control.encode() in capture.path.read_bytes(), 30, "tcpdump to write"
            )
            capture.__exit__()
        rows, ss_lines = probe_everything(cluster)
    finally:
        if capture and capture.proc.poll() is None:
            capture.__exit__()
        cluster.stop_sync()
    assert rows  # the controller's ports or sockets at least, and the engines' (Dask)
    assert all(row["answers"] == {} for row in rows), [r for r in rows if r["answers"]]
    unix = [r for r in rows if r["port"].startswith("/")]
    tcp = {r["port"] for r in rows} - {r["port"] for r in unix}
    assert {line.split()[3] for line in ss_lines} == tcp  # all tried
    if where == "local":  # Unix sockets only, in a folder of ours alone
        assert not ss_lines and unix, (ss_lines, unix)
        assert all("Permission denied" in r.get("unreachable", "") for r in unix), unix
    else:
        assert ss_lines
    for line in ss_lines:  # never every interface
        address = line.split()[3].rsplit(":", 1)[0]
        assert address not in ("0.0.0.0", "*", "[::]", "[::ffff:0.0.0.0]"), line
        if where == "local":
            assert address == "127.0.0.1", line
    if capture:
        seen, payload = pcap_payloads(capture.path)
        assert control.encode() in seen, capture.said  # the capture sees clear text...
        assert payload > 10_000  # ...and it saw the engines' traffic...
        for text in (marker, marker.upper()):  # ...but no item and no result in the clear
            assert text.encode() not in seen


@pytest.mark.parametrize("kind", KINDS)
def test_the_stranger_notices_an_open_door(kind, lounge_dir):
    """The control: with --no-tls (local only) the same stranger gets answers, so the test
    above could fail. (Dask without TLS even runs the stranger's code.)"""
    cluster = Lounge(2, engines=kind, tls=False, wait=True).start_sync()
    try:
        pids = cluster_pids(cluster)
        ports = sorted({f"{ip}:{port}" for pid in pids for ip, port in listening(pid)})
        canary = f"/tmp/lounge-canary-{uuid.uuid4().hex[:8]}"
        rows = stranger(None, canary, ports)
        assert any(row["answers"] for row in rows)
        if kind == "dask":
            assert os.path.exists(canary)
            os.unlink(canary)
    finally:
        cluster.stop_sync()


def test_a_local_dask_cluster_uses_sockets_no_other_user_can(lounge_dir, monkeypatch):
    """A local Dask cluster listens on no TCP port: its scheduler and workers listen on Unix
    sockets (0600) in a folder of their own (0700). Opened to everyone, a socket still
    answers no other user: its listener reads the peer's uid (SO_PEERCRED) and hangs up.
    The control: a listener that takes the stranger's uid for its own answers the same
    stranger (and runs its code). After stop, the folder is gone."""
    import stat
    import threading

    from jupyter_lounge.engines import unix_comm

    cluster = Lounge(2, engines="dask", wait=True).start_sync()
    try:
        folder = Path(cluster.socket_dir)
        pids = cluster_pids(cluster)
        assert not any(listening(pid) for pid in pids)
        sockets = sorted({path for pid in pids for path in unix_listening(pid)})
        assert len(sockets) == 3, sockets  # the scheduler and 2 workers (no HTTP: no port)
        assert all(Path(path).parent == folder for path in sockets)
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert all(stat.S_IMODE(os.stat(path).st_mode) == 0o600 for path in sockets)
        scheduler = str(folder / "scheduler")
        folder.chmod(0o711)  # the door open but for the peer check
        os.chmod(scheduler, 0o666)
        canary = f"/tmp/lounge-canary-{uuid.uuid4().hex[:8]}"
        [row] = stranger(None, canary, [scheduler])
        assert row.get("connected") and row["answers"] == {}, row
        assert not os.path.exists(canary)
        assert list(cluster.map(lambda x: -x, [1, 2], progress=False).result) == [-1, -2]
    finally:
        cluster.stop_sync()
    assert not folder.exists()

    # the control: the same listener, with the stranger's uid for its own
    from distributed.core import Server
    from distributed.protocol.pickle import loads

    unix_comm.register()
    monkeypatch.setattr(unix_comm.os, "getuid", lambda: 65534)  # nobody's
    place = Path(tempfile.mkdtemp(prefix="lounge-control-"))
    place.chmod(0o711)
    path, ready, done = str(place / "s"), threading.Event(), threading.Event()

    async def serve():
        server = Server({"run": lambda function, **_: loads(function)()})
        await server.listen(unix_comm.address(path))
        os.chmod(path, 0o666)
        ready.set()
        while not done.is_set():
            await asyncio.sleep(0.05)
        server.stop()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    try:
        assert ready.wait(10), "the control listener did not start"
        canary = f"/tmp/lounge-canary-{uuid.uuid4().hex[:8]}"
        [row] = stranger(None, canary, [path])
        assert row["answers"].get("dask"), row
        assert os.path.exists(canary)
        os.unlink(canary)
    finally:
        done.set()
        thread.join(10)
        shutil.rmtree(place, ignore_errors=True)


def test_no_tls_is_for_this_machine_only(tmp_path):
    options = backend_options("ssh", tmp_path)
    with pytest.raises(LoungeError, match="--no-tls is allowed only with --backend local"):
        Lounge(2, tls=False, **options)
    with pytest.raises(LoungeError, match="--no-tls is allowed only with --backend local"):
        Lounge(2, tls=False, backend="slurm")


def test_the_dask_dashboard_is_off_unless_asked_then_on_loopback(lounge_dir):
    import urllib.request

    cluster = Lounge(1, engines="dask", dashboard=True, wait=True).start_sync()
    try:
        info = state.read_json(cluster.dir / "scheduler.json")
        port = info["services"]["dashboard"]
        assert ("127.0.0.1", port) in listening(cluster.controller_pid)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10) as r:
            assert r.status == 200
    finally:
        cluster.stop_sync()
    with pytest.raises(LoungeError, match="--dashboard is Dask's"):
        Lounge(1, dashboard=True)


# -- injection ---------------------------------------------------------------------------------
CANARY = f"/tmp/lounge-injected-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize(
    "options, sentence",
    [
        (
            {"backend": "slurm", "partition": f"debug\ntouch {CANARY}"},
            "The Slurm option partition 'debug\\ntouch",
        ),
        (
            {"backend": "slurm", "time_limit": f"1:00:00\ntouch {CANARY}"},
            "holds a control character",
        ),
        ({"backend": "slurm", "account": f"a;touch {CANARY}"}, "is not valid: use a value like"),
        ({"backend": "slurm", "qos": f"$(touch {CANARY})"}, "The Slurm option qos"),
        (
            {"backend": "slurm", "extra_directives": [f"--comment=x\ntouch {CANARY}"]},
            "The #SBATCH directive",
        ),
        (
            {"backend": "slurm", "extra_directives": [f"--comment=a b;touch {CANARY}"]},
            "no spaces or quotes",
        ),
        ({"backend": "slurm", "mem_per_engine": f"2G\ntouch {CANARY}"}, "control character"),
        ({"name": f"x\ntouch {CANARY}"}, "Cluster name"),
        ({"name": "trailing-newline\n"}, "Cluster name"),
        ({"preload": f"os;open('{CANARY}','w')"}, "is not a module name"),
        ({"preload": ["numpy", "__import__('os').system('touch x')"]}, "is not a module name"),
    ],
)
def test_injected_values_are_refused_before_anything_runs(options, sentence, lounge_dir):
    with pytest.raises(LoungeError) as info:
        Lounge(2, **options).start_sync()
    message = str(info.value)
    assert sentence in message and "\n" not in message.replace("\\n", ""), message
    assert not os.path.exists(CANARY)
    assert state.list_states() == []


@pytest.mark.parametrize(
    "node_line, sentence",
    [
        (f'host = "-oProxyCommand=touch {CANARY}"', "is not a host name"),
        (f'host = "10.77.0.11\\ntouch {CANARY}"', "control character"),
        (f'host = "10.77.0.11"\nuser = "-oProxyCommand=touch {CANARY}"', "is not a login name"),
        (f'host = "10.77.0.11"\nlocal_dir = "relative/{CANARY}"', "must be an absolute path"),
        (f'host = "10.77.0.11"\nknown_hosts = "/tmp/a /tmp/{CANARY}"', "has a space"),
        ('host = "10.77.0.11"\npython = "-c"', "may not start with '-'"),
    ],
)
def test_injected_inventory_values_are_refused(node_line, sentence, tmp_path):
    inv = tmp_path / "lounge.toml"
    inv.write_text(f'[[node]]\nname = "pc1"\n{node_line}\n')
    with pytest.raises(LoungeError, match="line|number") as info:
        Lounge(1, backend="ssh", inventory=str(inv))
    assert sentence in str(info.value)
    assert not os.path.exists(CANARY)


def test_quoted_values_reach_the_node_as_data_not_commands(tmp_path, lounge_dir):
    """Values the inventory may hold with shell characters (a python path, a local_dir) are
    quoted once on the way: the node sees the literal path, and runs nothing else."""
    problem = slurm_testbed_problem()
    if problem:
        pytest.skip(problem)
    odd = f"/var/local/odd $(touch {CANARY}); `touch {CANARY}` 'q'"
    common = (
        f'user = "root"\nkey = "{os.environ["LOUNGE_TESTBED_KEY"]}"\n'
        f'known_hosts = "{os.environ["LOUNGE_TESTBED_KNOWN_HOSTS"]}"\nengines = 4\n'
    )
    inv = tmp_path / "lounge.toml"
    inv.write_text(
        f'[[node]]\nname = "node1"\nhost = "10.77.0.11"\n{common}'
        f'python = "{sys.executable}"\nlocal_dir = "{odd}"\npools = ["odd-dir"]\n\n'
        f'[[node]]\nname = "node2"\nhost = "10.77.0.12"\n{common}'
        f'python = "{sys.executable}; touch {CANARY}"\nlocal_dir = "/var/local/lounge"\n'
        'pools = ["odd-python"]\n'
    )
    options = {"backend": "ssh", "inventory": str(inv)}
    cluster = Lounge(2, pool="odd-dir", wait=True, **options)
    try:
        cluster.start_sync()
        df = cluster.map(
            lambda _: __import__("os").environ["LOUNGE_NODE"], range(4), progress=False
        )
        assert set(df.result) == {"node1"}
        assert (TESTBED / "local" / "node1" / odd.removeprefix("/var/local/") / "run").is_dir()
    finally:
        cluster.stop_sync()
    other = Lounge(2, pool="odd-python", strict=True, wait=True, **options)
    with pytest.raises(LoungeError, match="node2"):  # its python is the literal odd path
        other.start_sync()
    assert not os.path.exists(CANARY)
    import shutil

    shutil.rmtree(TESTBED / "local" / "node1" / odd.removeprefix("/var/local/"))


def test_ssh_is_run_without_forwarding_and_with_the_host_after_double_dash(tmp_path):
    from jupyter_lounge.backends.ssh import SSHBackend

    inv = tmp_path / "lounge.toml"
    inv.write_text('[[node]]\nname = "pc1"\nhost = "10.77.0.11"\nuser = "ana"\n')
    cmd = SSHBackend(inventory=str(inv)).ssh_command("pc1")
    assert cmd[-2:] == ["--", "10.77.0.11"]
    for option in (
        "BatchMode=yes",
        "StrictHostKeyChecking=yes",
        "ForwardAgent=no",
        "ClearAllForwardings=yes",
        "ControlPath=none",  # an agent's session neither rides nor becomes a kept connection
    ):
        assert option in cmd


@pytest.mark.fast
def test_a_kept_connection_is_shared_only_by_the_same_options_in_a_folder_of_ours(
    tmp_path, monkeypatch, request
):
    """Short sessions (sync, stage, survey) ride one connection per node and set of ssh
    options, whose socket is in a private folder; a folder someone else made is not used, and
    persist 0 keeps none."""
    from traitlets.config import Config

    from jupyter_lounge.backends import ssh

    inv = tmp_path / "lounge.toml"
    node = 'host = "10.77.0.11"\nuser = "ana"\n'
    inv.write_text(f'[[node]]\nname = "pc1"\n{node}\n[[node]]\nname = "pc2"\n{node}key = "/k"\n')
    runtime = Path(tempfile.mkdtemp(dir="/tmp"))  # short: a socket's path is ~100 bytes at most
    request.addfinalizer(lambda: shutil.rmtree(runtime))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    backend = ssh.SSHBackend(inventory=str(inv))

    def option(cmd: list[str], name: str) -> str | None:
        found = [o.split("=", 1)[1] for o in cmd if o.startswith(name + "=")]
        assert len(found) <= 1, cmd
        return found[0] if found else None

    one, again = backend.reusing_ssh_command("pc1"), backend.reusing_ssh_command("pc1")
    assert one == again and one[-2:] == ["--", "10.77.0.11"]
    assert option(one, "ControlMaster") == "auto" and option(one, "ControlPersist") == "300"
    socket_path = Path(option(one, "ControlPath"))
    assert socket_path.parent == runtime / "lounge-ssh"
    assert socket_path.parent.stat().st_mode & 0o777 == 0o700
    other = option(backend.reusing_ssh_command("pc2"), "ControlPath")  # same host, another key
    assert other != str(socket_path) and Path(other).parent == socket_path.parent
    monkeypatch.setenv("JUPYTER_LOUNGE_DIR", str(tmp_path / "another-lounge"))
    assert option(backend.reusing_ssh_command("pc1"), "ControlPath") != str(socket_path)

    planted = runtime / "planted"
    planted.mkdir(mode=0o700)
    os.chown(planted, 65534, 65534)  # nobody made it first
    assert ssh.connections_dir([str(planted)]) is None
    assert ssh.connections_dir([str(runtime / ("x" * 60))]) is None  # too long for a socket
    assert ssh.connections_dir([str(runtime / "a b")]) is None  # no ssh option holds it
    assert ssh.connections_dir([str(planted), str(runtime / "ok")]) == str(runtime / "ok")
    monkeypatch.setattr(ssh, "connections_dir", lambda places=None: None)
    assert option(backend.reusing_ssh_command("pc1"), "ControlPath") == "none"

    monkeypatch.undo()
    none = ssh.SSHBackend(inventory=str(inv), config=Config({"SSHBackend": {"persist": 0}}))
    cmd = none.reusing_ssh_command("pc1")
    assert option(cmd, "ControlPath") == "none" and option(cmd, "ControlMaster") is None
    for bad in (-1, 86401):
        with pytest.raises(LoungeError, match=f"The ssh option persist is {bad}: give the"):
            ssh.SSHBackend(inventory=str(inv), config=Config({"SSHBackend": {"persist": bad}}))


# -- folders we trust --------------------------------------------------------------------------
def test_a_lounge_folder_someone_else_made_is_refused(tmp_path, monkeypatch):
    planted = tmp_path / "planted"
    planted.mkdir(mode=0o700)
    os.chown(planted, 65534, 65534)  # nobody made it first
    monkeypatch.setenv("JUPYTER_LOUNGE_DIR", str(planted))
    with pytest.raises(LoungeError, match=r"belongs to nobody \(uid 65534\), not to you"):
        Lounge(1).start_sync()
    open_one = tmp_path / "open"
    open_one.mkdir(mode=0o700)
    open_one.chmod(0o777)
    monkeypatch.setenv("JUPYTER_LOUNGE_DIR", str(open_one))
    with pytest.raises(LoungeError, match=f"run `chmod go-w {open_one}`"):
        Lounge(1).start_sync()
    linked = tmp_path / "linked"
    linked.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    monkeypatch.setenv("JUPYTER_LOUNGE_DIR", str(linked))
    with pytest.raises(LoungeError, match="is a symbolic link"):
        Lounge(1).start_sync()


def test_an_inventory_others_can_change_is_refused(tmp_path):
    """It names the machines that get our keys and the idle probe they run."""
    inv = tmp_path / "lounge.toml"
    inv.write_text('[[node]]\nname = "pc1"\nhost = "10.77.0.11"\n')
    inv.chmod(0o666)
    with pytest.raises(LoungeError, match=f"run `chmod go-w {inv}`"):
        Lounge(1, backend="ssh", inventory=str(inv))
    inv.chmod(0o644)
    os.chown(inv, 65534, 65534)
    with pytest.raises(LoungeError, match="owner uid 65534"):
        Lounge(1, backend="ssh", inventory=str(inv))


def test_a_symlinked_cluster_folder_is_refused_and_not_followed(lounge_dir, tmp_path):
    target = tmp_path / "theirs"
    target.mkdir()
    (target / "keep.txt").write_text("theirs")
    state.lounge_dir()  # made, ours
    (lounge_dir / "planted").symlink_to(target, target_is_directory=True)
    with pytest.raises(LoungeError, match="cluster folder .*planted is a symbolic link"):
        Lounge(1, name="planted").start_sync()
    assert (target / "keep.txt").read_text() == "theirs"  # not followed, not removed
    assert not any(p.suffix == ".json" for p in lounge_dir.iterdir())


def test_a_node_folder_another_user_made_is_refused_by_agent_and_sync(tmp_path, lounge_dir):
    problem = slurm_testbed_problem()
    if problem:
        pytest.skip(problem)
    options = inventory_for_testbed(tmp_path / "lounge.toml")
    planted = TESTBED / "local" / "node2" / "planted"  # node2's /var/local/planted
    planted.mkdir(exist_ok=True)
    os.chown(planted, 65534, 65534)
    text = Path(options["inventory"]).read_text()
    node2 = text.index('name = "node2"')
    text = text[:node2] + text[node2:].replace(
        'local_dir = "/var/local/lounge"', 'local_dir = "/var/local/planted"', 1
    ).replace('pools = ["gpu"]', 'pools = ["gpu", "planted"]', 1)
    Path(options["inventory"]).write_text(text)
    try:
        with pytest.raises(LoungeError, match="node 'node2' refuses its local_dir: The local_dir"):
            Lounge(6, nodes=3, strict=True, wait=True, **options).start_sync()
        assert state.list_states() == []
        cmd = [sys.executable, "-m", "jupyter_lounge.cli", "sync", "--pool", "planted"]
        cmd += ["--inventory", options["inventory"]]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert out.returncode == 2 and (
            "node2: The local_dir /var/local/planted belongs to nobody (uid 65534)" in out.stderr
        ), out.stderr
        assert not (planted / "envs").exists()  # nothing written into their folder
    finally:
        import shutil

        shutil.rmtree(planted, ignore_errors=True)
    wait_until(lambda: not any(node_processes(i) for i in (1, 2, 3)), 15, "nothing left on nodes")
