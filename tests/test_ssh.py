"""The ssh backend's own cases on the testbed's sshd nodes (the contract suite runs it too)."""

from __future__ import annotations

import pytest

from jupyter_lounge import Lounge, state
from jupyter_lounge.errors import LoungeError

from .conftest import inventory_for_testbed, processes_under, slurm_testbed_problem


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
    cluster = Lounge(3, nodes=3, wait=True, progress=False, **lounge_toml).start_sync()
    try:
        df = cluster.map(lambda _: __import__("socket").gethostname(), range(12), progress=False)
        assert set(df.result) == {"node1", "node2", "node3"}
    finally:
        cluster.stop_sync()
    assert processes_under(str(lounge_dir)) == []


def test_an_unreachable_node_is_skipped_with_a_warning(lounge_toml, lounge_dir):
    cluster = Lounge(16, wait=True, progress=False, **lounge_toml)
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
        Lounge(16, wait=True, progress=False, strict=True, **lounge_toml).start_sync()
    assert state.list_states() == [] and processes_under(str(lounge_dir)) == []


def test_more_engines_than_the_pool_has_slots(lounge_toml):
    with pytest.raises(LoungeError, match="17 engines do not fit on 4 lounge node"):
        Lounge(17, progress=False, **lounge_toml).start_sync()
    with pytest.raises(LoungeError, match="Unknown pool 'vision'"):
        Lounge(2, progress=False, pool="vision", **lounge_toml)


def test_lounge_nodes_live_asks_every_node(lounge_toml):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    infra = Path(__file__).parent / "infra"
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
    assert rows["node2"]["state"] == "in use (ana logged in)"
    assert rows["node2"]["telemetry"]["users"] == ["ana"]
    assert rows["node1"]["state"] == "idle" and rows["node3"]["state"] == "idle"
    assert 0 <= rows["node1"]["cpu"] <= 100 and rows["node1"]["mem"] > 0
    assert rows["pc-off"]["state"] == "offline"
    assert "Connection refused" in rows["pc-off"]["why"]
