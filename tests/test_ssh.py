"""The ssh backend's own cases on the testbed's sshd nodes (the contract suite runs it too)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
import warnings
from pathlib import Path

import pytest

from jupyter_lounge import Lounge, state
from jupyter_lounge.errors import LoungeError

from .conftest import (
    inventory_for_testbed,
    map_or_show_driver_log,
    node_processes,
    processes_under,
    slurm_testbed_problem,
    wait_until,
)

INFRA = Path(__file__).parent / "infra"
TESTBED = Path(os.environ.get("LOUNGE_TESTBED", "/tmp/lounge-testbed"))


def nothing_left_on_the_nodes() -> None:
    left = wait_until(
        lambda: not any(node_processes(i) for i in (1, 2, 3)) or "none",
        15,
        "every agent and engine on the nodes to exit",
    )
    assert left == "none" or left is True
    for i in (1, 2, 3):  # and no agent folder is left on the node's own disk
        run = TESTBED / "local" / f"node{i}" / "lounge" / "run"
        assert not run.exists() or not [p for p in run.iterdir() if "bench" not in p.name]


def ssh_node(index: int, command: str, timeout: float = 30) -> str:
    cmd = [
        "ssh",
        "-F",
        os.environ["LOUNGE_TESTBED_SSH_CONFIG"],
        "-i",
        os.environ["LOUNGE_TESTBED_KEY"],
        "-o",
        f"UserKnownHostsFile={os.environ['LOUNGE_TESTBED_KNOWN_HOSTS']}",
        "-o",
        "BatchMode=yes",
        f"root@10.77.0.1{index}",
        command,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True).stdout


@pytest.fixture
def lounge_toml(tmp_path):
    problem = slurm_testbed_problem()
    if problem:
        pytest.skip(problem)
    options = inventory_for_testbed(tmp_path / "lounge.toml")
    # a fourth PC whose sshd does not answer (port 2 refuses at once)
    with open(options["inventory"], "a") as f:
        f.write(
            '[[node]]\nname = "pc-off"\nhost = "10.77.0.13"\nport = 2\nuser = "root"\n'
            'engines = 4\npools = ["gpu"]\n'
        )
    return options


def test_engines_on_every_node_of_the_pool(lounge_toml, lounge_dir):
    cluster = Lounge(3, nodes=3, wait=True, **lounge_toml).start_sync()
    try:
        df = cluster.map(lambda _: __import__("socket").gethostname(), range(12), progress=False)
        assert set(df.result) == {"node1", "node2", "node3"}
    finally:
        cluster.stop_sync()
    assert processes_under(str(lounge_dir)) == []
    nothing_left_on_the_nodes()


def test_an_unreachable_node_is_skipped_with_a_warning(lounge_toml, lounge_dir):
    cluster = Lounge(16, wait=True, **lounge_toml)
    with pytest.warns(
        UserWarning, match="Lounge node 'pc-off' skipped: the SSH session to 10.77.0.13 ended"
    ):
        cluster.start_sync()
    try:
        assert cluster.n == 12 and len(cluster.registered()) == 12
        assert {r["node"] for r in cluster.nodes_status()} == {"node1", "node2", "node3"}
    finally:
        cluster.stop_sync()
    with pytest.raises(LoungeError, match="agent pc-off of .* never started: the SSH session"):
        Lounge(16, wait=True, strict=True, **lounge_toml).start_sync()
    assert state.list_states() == [] and processes_under(str(lounge_dir)) == []


def test_more_engines_than_the_pool_has_slots(lounge_toml):
    with pytest.raises(LoungeError, match="17 engines do not fit on 4 lounge node"):
        Lounge(17, **lounge_toml).start_sync()
    with pytest.raises(LoungeError, match="Unknown pool 'vision'"):
        Lounge(2, pool="vision", **lounge_toml)


def test_lounge_nodes_live_asks_every_node(lounge_toml):
    infra = INFRA
    subprocess.run([str(infra / "login-node"), "2", "ana"], check=True, timeout=30)
    try:
        cmd = [
            sys.executable,
            "-m",
            "jupyter_lounge.cli",
            "nodes",
            "--live",
            "--json",
            "--inventory",
            lounge_toml["inventory"],
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=os.environ)
        assert out.returncode == 0, out.stderr
        rows = {r["name"]: r for r in json.loads(out.stdout)}
    finally:
        subprocess.run([str(infra / "logout-node"), "2"], timeout=30)
    # one row shape for a node, here and in the REST API (GET nodes)
    assert rows["node2"]["state"] == "in use" and rows["node2"]["why"] == "ana logged in"
    assert rows["node2"]["users"] == rows["node2"]["telemetry"]["users"] == ["ana"]
    assert rows["node1"]["state"] == "idle" and rows["node3"]["state"] == "idle"
    assert 0 <= rows["node1"]["cpu"] <= 100 and rows["node1"]["mem"] > 0
    assert rows["pc-off"]["state"] == "offline"
    assert "Connection refused" in rows["pc-off"]["why"]


@pytest.mark.parametrize("kind", ["ipyparallel", "dask"])
def test_nodes_need_no_shared_file_system(kind, lounge_toml, monkeypatch):
    """The cluster's folder is in a folder of this machine that no node sees (the testbed
    mounts an empty one over it on each node): spec, connection files, TLS keys and control
    reach the agents over the SSH session, reports come back on it, and nothing secret is on
    any command line."""
    here_only = TESTBED / "private" / f"lounge-test-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("JUPYTER_LOUNGE_DIR", str(here_only))
    assert not ssh_node(1, f"ls -d {here_only} 2>/dev/null || true").strip()
    cluster = Lounge(6, engines=kind, nodes=3, wait=True, **lounge_toml)
    cluster.start_sync()
    try:
        df = cluster.map(
            lambda x: (x, __import__("socket").gethostname()), range(12), progress=False
        )
        assert [r[0] for r in df.result] == list(range(12))
        assert {r[1] for r in df.result} == {"node1", "node2", "node3"}
        agents = node_processes(2, "jupyter_lounge.node")
        assert agents and all(
            a.split(" ", 1)[1].endswith("-m jupyter_lounge.node --stdio") for a in agents
        )
        run = ssh_node(2, "ls /var/local/lounge/run/").split()
        assert f"{cluster.name}.0.1" in run
        files = ssh_node(2, f"ls /var/local/lounge/run/{cluster.name}.0.1").split()
        assert "connection.json" in files and "report.json" in files
        # Dask: the cluster CA's certificate and the workers' own; never the client's or the
        # scheduler's key. ipyparallel's keys are in the connection file.
        tls = {f for f in files if f.startswith("tls-")}
        assert tls == ({"tls-ca.pem", "tls-worker.pem"} if kind == "dask" else set())
        cluster.scale_sync(9)  # control travels the same way
        cluster.wait_for_engines_sync(9, timeout=60)
        assert cluster.nodes_status()[1]["target"] == 3
    finally:
        cluster.stop_sync()
        import shutil

        shutil.rmtree(here_only, ignore_errors=True)
    nothing_left_on_the_nodes()


def test_a_cpu_burner_evicts_engines_without_losing_work(lounge_toml, lounge_dir):
    """A person starts a game on node2: a foreign process burning a CPU. Its engines leave
    within the policy's seconds, the map finishes complete, and they come back once it is
    gone and the node has been quiet."""
    with open(lounge_toml["inventory"], "a") as f:
        f.write("[idle]\ncpu_percent = 30\nfor_seconds = 2\nidle_after_seconds = 3\n")
    cluster = Lounge(6, nodes=3, wait=True, **lounge_toml).start_sync()
    burner = "python3 -c 'while True: pass' lounge-test-game"
    try:
        assert [r["node"] for r in cluster.nodes_status()] == ["node1", "node2", "node3"]

        def arrive():
            time.sleep(1.5)
            ssh_node(2, f"setsid {burner} </dev/null >/dev/null 2>&1 &")

        threading.Thread(target=arrive).start()

        def slow(x):
            import socket
            import time

            time.sleep(0.5)
            return x, socket.gethostname()

        started = time.monotonic()
        df = cluster.map(slow, range(30), progress=False, timeout=120)
        assert df.error.isna().all(), df.error.dropna().tolist()
        assert [r[0] for r in df.result] == list(range(30))
        row = wait_until(
            lambda: next(
                (
                    r
                    for r in cluster.nodes_status()
                    if r["node"] == "node2" and r["status"] == "in use" and r["why"]
                ),
                None,
            ),
            15,
            "node2 reported in use",
        )
        assert "CPU" in row["why"], row
        assert [r["node"] for r in cluster.nodes_status() if r["status"] != "running"] == ["node2"]
        evicted_by = time.monotonic() - started
        wait_until(lambda: len(cluster.registered()) == 4, 10, "node2's engines to leave")
        assert evicted_by < 20
        # no engine is left on node2, nor the ipyparallel nanny (both forked from the agent,
        # with its command line): once its engines are gone the agent rests, executing itself
        # anew, lean (NodeAgent.rest), and is the one process of ours there

        def rested():
            left = node_processes(2, "jupyter_lounge.node")
            return len(left) == 1 and "jupyter_lounge.node --resume " in left[0]

        wait_until(rested, 15, "node2's engines and nanny to go and its agent to rest")
        ssh_node(2, "pkill -f lounge-test-gam[e] || true")
        cluster.wait_for_engines_sync(6, timeout=40)
        assert cluster.nodes_status()[1]["status"] == "running"
    finally:
        subprocess.run(["pkill", "-f", "lounge-test-game"], timeout=10)
        cluster.stop_sync()
    nothing_left_on_the_nodes()


@pytest.mark.parametrize("kind", ["ipyparallel", "dask"])
def test_node_power_cut_mid_map_loses_no_item(kind, lounge_toml, lounge_dir):
    # the controller's heartbeat would notice node3 after 100 s: the SSH session does it
    cluster = Lounge(6, engines=kind, nodes=3, wait=True, heartbeat_ms=5000, **lounge_toml)
    cluster.start_sync()
    try:

        def slow(x):
            import socket
            import time

            time.sleep(0.5)
            return x, socket.gethostname()

        threading.Timer(1.5, subprocess.run, ([str(INFRA / "kill-node"), "3"],)).start()
        df = map_or_show_driver_log(cluster, lounge_dir, slow, range(30), timeout=60)
        assert df.error.isna().all(), df.error.dropna().tolist()
        assert [r[0] for r in df.result] == list(range(30))
        assert "node3" not in {r[1] for r in df.result[-6:]}
        row = wait_until(
            lambda: next(
                (
                    r
                    for r in cluster.nodes_status()
                    if r["node"] == "node3" and r["status"] == "lost"
                ),
                None,
            ),
            30,
            "node3 reported lost",
        )
        assert "SSH session" in row["error"], row
    finally:
        cluster.stop_sync()
        subprocess.run(
            [str(INFRA / "reup"), "3", "8"], capture_output=True, timeout=300, check=True
        )  # power the testbed's node back on
    assert state.list_states() == [] and processes_under(str(lounge_dir)) == []
    # node3's disk still holds the folder of the agent that died with it; the next agent
    # there removes it
    stale = TESTBED / "local" / "node3" / "lounge" / "run" / f"{cluster.name}.0.2"
    assert stale.exists()
    Lounge(3, nodes=3, wait=True, **lounge_toml).start_sync().stop_sync()
    assert not stale.exists()
    nothing_left_on_the_nodes()


@pytest.mark.slow
def test_lounge_sync_ships_once_then_agents_run_the_prepositioned_python(
    lounge_toml, lounge_dir, tmp_path, monkeypatch
):
    """`lounge sync` puts this virtualenv (jupyter_lounge included, editable here) on each
    node's own disk; a second sync ships nothing; `--sync` starts run that python; an
    environment that differs by one file ships that file."""
    import shutil

    for folder in ("envs", "store"):  # node1 has nothing of it: all of it travels
        shutil.rmtree(TESTBED / "local" / "node1" / "lounge" / folder, ignore_errors=True)
    cmd = [sys.executable, "-m", "jupyter_lounge.cli", "sync", "--json", "--pool", "gpu"]
    cmd += ["--inventory", lounge_toml["inventory"]]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    rows = {r["node"]: r for r in json.loads(first.stdout)}
    assert rows["node1"]["status"] == "shipped" and rows["node1"]["MiB"] > 100
    assert {rows[n]["status"] for n in ("node2", "node3")} <= {"shipped", "present"}
    assert rows["pc-off"]["status"] == (  # port 2 refuses: said, not fatal
        "failed: ssh: connect to host 10.77.0.13 port 2: Connection refused"
    )
    env = rows["node1"]["env"]
    assert env.startswith("/var/local/lounge/envs/")
    assert not Path(env).exists()  # on the node's own disk, not on this machine
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    again = {r["node"]: r for r in json.loads(second.stdout)}
    assert {again[n]["status"] for n in ("node1", "node2", "node3")} == {"present"}
    assert all(again[n]["MiB"] == 0 for n in ("node1", "node2", "node3"))

    cluster = Lounge(3, nodes=3, sync=True, wait=True, **lounge_toml)
    with warnings.catch_warnings():
        # remembered: no node is asked again, pc-off neither
        warnings.simplefilter("error", UserWarning)
        cluster.start_sync()
    try:

        def where(_):
            import sys

            import jupyter_lounge

            return sys.executable, jupyter_lounge.__file__

        df = cluster.map(where, range(6), progress=False)
        assert {r[0] for r in df.result} == {env + "/bin/python"}
        assert all(r[1].startswith(env + "/lib/") for r in df.result)
    finally:
        cluster.stop_sync()
    nothing_left_on_the_nodes()

    from jupyter_lounge import sync
    from jupyter_lounge._loop import run_sync
    from jupyter_lounge.backends import make_backend

    edited = tmp_path / "edited.py"  # one more source file: a new environment, one file new
    edited.write_text(f"EDITED = {os.urandom(8).hex()!r}\n")  # bytes no node has yet
    tree = sync.env_tree
    monkeypatch.setattr(sync, "env_tree", lambda rescan=False: tree([("lib/edited.py", edited)]))
    fresh = os.urandom(8).hex()  # no node has it, whatever ran on the testbed before
    monkeypatch.setattr(sync, "fingerprint", lambda: fresh)
    backend = make_backend("ssh", inventory=lounge_toml["inventory"])
    rows = run_sync(backend.sync_env(["node1", "node2", "node3"], progress=False))
    assert [(r["status"], r["files"]) for r in rows] == [("shipped", 1)] * 3
    assert all(r["MiB"] < 0.01 for r in rows)


def test_two_runs_on_two_pools_place_items_only_on_their_pools(lounge_toml, lounge_dir):
    """The lounge's queues split the machines: half trains one model, half another."""
    path = Path(lounge_toml["inventory"])
    pools = {"node1": '["cancer"]', "node2": '["nlp"]', "node3": '["nlp", "spare"]'}
    text = path.read_text()
    for node, value in pools.items():  # each node's block ends with its pools line
        head, _, tail = text.partition(f'name = "{node}"')
        tail = tail.replace('pools = ["gpu"]', f"pools = {value}", 1)
        text = head + f'name = "{node}"' + tail
    path.write_text(text)
    cluster = Lounge(4, nodes=2, wait=True, **lounge_toml).start_sync()  # node1, node2
    try:
        assert {r["node"] for r in cluster.nodes_status()} == {"node1", "node2"}

        def where(x):
            import socket
            import time

            time.sleep(0.1)
            return socket.gethostname()

        out: dict = {}
        threads = [
            threading.Thread(
                target=lambda p=pool: out.__setitem__(
                    p, cluster.map(where, range(24), name=f"on-{p}", pool=p, progress=False)
                )
            )
            for pool in ("cancer", "nlp")
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert set(out["cancer"].result) == {"node1"} and set(out["nlp"].result) == {"node2"}
        assert set(out["cancer"].node) == {"node1"} and out["nlp"].error.isna().all()
        runs = {r["name"]: r for r in cluster.runs()}
        assert runs["on-cancer"]["pool"] == "cancer" and runs["on-nlp"]["status"] == "done"
        with pytest.raises(LoungeError, match="Pool 'spare' has no engine in cluster .*node3"):
            cluster.map(where, range(2), pool="spare", progress=False)
        with pytest.raises(LoungeError, match="Unknown pool 'ghost'"):
            cluster.map(where, range(2), pool="ghost", progress=False)
    finally:
        cluster.stop_sync()
    assert processes_under(str(lounge_dir)) == []


def test_short_sessions_share_a_kept_connection_per_node_and_agents_never_do(
    lounge_toml, lounge_dir
):
    """`lounge stage --list` (as sync and stage) leaves one connection open to each node,
    which the next short session rides (the same TCP connection: the same client port in
    SSH_CONNECTION) and an agent's session does not; only we can reach its socket (a
    stranger's `ssh -O check` is refused); close_connections ends them."""
    import psutil

    from jupyter_lounge.backends import make_backend

    options = {k: v for k, v in lounge_toml.items() if k != "backend"}
    backend = make_backend("ssh", **options)
    backend.nodes.pop("pc-off")
    listed = subprocess.run(
        [sys.executable, "-m", "jupyter_lounge.cli", "stage", "--list", "--json", "--pool",
         "gpu", "--inventory", lounge_toml["inventory"]],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr

    def control(name: str, *argv: str, user: list[str] = ()) -> subprocess.CompletedProcess:
        cmd = backend.reusing_ssh_command(name)
        return subprocess.run(
            [*user, *cmd[:-2], *argv, *cmd[-2:]], capture_output=True, text=True, timeout=30
        )

    def client(cmd: list[str]) -> str:  # "client-address client-port server-address 22"
        out = subprocess.run([*cmd, "echo $SSH_CONNECTION"], capture_output=True, text=True,
                             timeout=30, check=True).stdout  # fmt: skip
        return out.strip().splitlines()[-1]

    try:
        for name in ("node1", "node2", "node3"):
            checked = control(name, "-O", "check")
            assert checked.returncode == 0 and "Master running" in checked.stderr, checked
        kept = client(backend.reusing_ssh_command("node1"))
        assert client(backend.reusing_ssh_command("node1")) == kept
        assert client(backend.ssh_command("node1")) != kept  # an agent's: a connection of its own

        socket_path = next(o for o in backend.reusing_ssh_command("node1") if "ControlPath=" in o)
        stranger = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
        refused = control("node1", "-O", "check", user=stranger)
        assert refused.returncode != 0 and "Permission denied" in refused.stderr, refused

        master = [  # "ssh: SOCKET [mux]"
            p
            for p in psutil.process_iter(["cmdline"])
            if socket_path.split("=", 1)[1] in " ".join(p.info["cmdline"] or ())
        ]
        assert len(master) == 1, master
        backend.close_connections()
        for name in ("node1", "node2", "node3"):
            assert control(name, "-O", "check").returncode != 0
        wait_until(lambda: not master[0].is_running(), 10, "node1's kept connection's ssh to exit")
    finally:  # a failed assertion leaves no connection open for 5 minutes
        backend.close_connections()
