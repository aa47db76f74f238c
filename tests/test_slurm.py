"""The Slurm backend on a real multi-node Slurm: the testbed's slurmctld and one slurmd per
node, each node its own network, hostname and process namespace (tests/infra/up)."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest

from jupyter_lounge import Lounge, state
from jupyter_lounge.errors import LoungeError, LoungeTimeout

from .conftest import (
    map_or_show_driver_log,
    processes_under,
    slurm_testbed_problem,
    wait_until,
)

INFRA = Path(__file__).parent / "infra"


def squeue() -> list[str]:
    out = subprocess.run(
        ["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True, timeout=30
    )
    return out.stdout.strip().splitlines()


@pytest.fixture(scope="module", autouse=True)
def testbed():
    problem = slurm_testbed_problem()
    if problem:
        pytest.skip(problem)
    yield
    assert squeue() == [], f"jobs left in squeue: {squeue()}"


@pytest.fixture(autouse=True)
def no_job_left():
    yield
    wait_until(lambda: squeue() == [], 30, "squeue to be empty after the test")


@pytest.mark.parametrize("kind", ["ipyparallel", "dask"])
def test_start_map_scale_stop_on_three_nodes(kind, lounge_dir):
    preload = "tensorflow" if kind == "ipyparallel" else "numpy"
    cluster = Lounge(
        6,
        engines=kind,
        backend="slurm",
        engines_per_node=2,
        preload=preload,
        wait=True,
        timeout=180,
    ).start_sync()
    try:
        jobs = {a["job"] for a in cluster.agents}
        assert len(jobs) == 1 and len(cluster.agents) == 3  # one allocation, an agent a node
        assert len(squeue()) == 1

        def where():
            import os
            import socket
            import sys

            return socket.gethostname(), os.environ["LOUNGE_NODE"], preload in sys.modules

        df = cluster.map(lambda _: where(), range(30), progress=False)
        hosts = {r[0] for r in df.result}
        assert hosts == {"node1", "node2", "node3"}
        assert all(r[0] == r[1] and r[2] for r in df.result)
        assert set(df.host) == hosts
        if kind == "ipyparallel":

            def tf_op():
                import tensorflow as tf

                return float(tf.reduce_sum(tf.ones((8, 8))))

            assert cluster.client[:].apply_sync(tf_op) == [64.0] * 6

        cluster.scale_sync(8)  # a further allocation, not a job per engine
        cluster.wait_for_engines_sync(8, timeout=120)
        assert len({a["job"] for a in cluster.agents}) == 2 and len(squeue()) == 2
        cluster.scale_sync(5)  # the scale-up allocation empties and is released
        wait_until(lambda: len(squeue()) == 1, 30, "the emptied allocation to leave squeue")
        wait_until(lambda: len(cluster.registered()) == 5, 30, "5 engines")
        assert {a["job"] for a in cluster.agents} == jobs
    finally:
        cluster.stop_sync()
    assert squeue() == []
    assert state.list_states() == []
    assert processes_under(str(lounge_dir)) == []


def test_pending_reason_is_shown_and_the_wait_times_out(lounge_dir):
    blocker = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "-N3",
            "--exclusive",
            "-J",
            "blocker",
            "--wrap",
            "sleep 120",
            "-o",
            "/dev/null",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.strip()
    try:
        wait_until(lambda: any("RUNNING" in j for j in squeue()), 20, "the blocker to run")
        cluster = Lounge(2, backend="slurm", engines_per_node=2, timeout=4)
        with pytest.raises(LoungeTimeout) as info:
            cluster.start_sync()
        message = str(info.value)
        assert "Timed out after 4 s" in message and "pending" in message
        assert "Resources" in message or "Priority" in message
        assert [j for j in squeue() if "blocker" not in j] == []  # ours was cancelled
    finally:
        subprocess.run(["scancel", blocker], timeout=30)
    assert state.list_states() == []


def test_slurm_rejecting_the_job_is_one_clear_error(lounge_dir):
    cluster = Lounge(2, backend="slurm", gpus_per_node=1)  # nodes have none
    with pytest.raises(LoungeError) as info:
        cluster.start_sync()
    message = str(info.value)
    assert message.startswith("`sbatch --parsable") and "exit code 1" in message
    assert "gres" in message.lower()  # Slurm's own words
    assert "\n" not in message.strip()
    with pytest.raises(LoungeError, match="`sinfo -h -N -o %o -p nope` lists no node; check"):
        Lounge(2, backend="slurm", partition="nope").start_sync()
    assert state.list_states() == [] and squeue() == []
    assert processes_under(str(lounge_dir)) == []


def test_slurm_down_is_one_clear_error(tmp_path, monkeypatch, lounge_dir):
    conf = Path(os.environ["SLURM_CONF"]).read_text()
    down = tmp_path / "slurm.conf"  # the same cluster, but a controller port nobody serves
    down.write_text(re.sub(r"SlurmctldPort=\d+", "SlurmctldPort=9", conf))
    monkeypatch.setenv("SLURM_CONF", str(down))
    with pytest.raises(LoungeError) as info:
        Lounge(2, backend="slurm", listen_ip="10.77.0.1").start_sync()
    message = str(info.value)
    assert (
        message.startswith("`sbatch --parsable") and "Unable to contact slurm controller" in message
    )
    assert state.list_states() == [] and processes_under(str(lounge_dir)) == []


def test_more_nodes_than_the_partition_has_fails_fast(lounge_dir):
    cluster = Lounge(10, backend="slurm", engines_per_node=2)  # 5 > 3 nodes
    t0 = time.monotonic()
    with pytest.raises(LoungeError) as info:
        cluster.start_sync()
    assert time.monotonic() - t0 < 30  # not the 120 s start timeout
    assert re.search(
        r"can never start \(Partition(NodeLimit|Config)\): ask for fewer nodes", str(info.value)
    )
    assert state.list_states() == [] and squeue() == []


def test_scancel_from_outside_mid_map_reports_lost_items(lounge_dir):
    cluster = Lounge(4, backend="slurm", engines_per_node=2, wait=True).start_sync()
    try:
        job = cluster.agents[0]["job"]
        threading.Timer(2.0, subprocess.run, (["scancel", job],)).start()

        def slow(x):
            import time

            time.sleep(1)
            return x

        t0 = time.monotonic()
        df = cluster.map(slow, range(40), progress=False, timeout=120)
        assert time.monotonic() - t0 < 60  # gave up on the rest, did not hang
        lost = df[df.error.notna()]
        assert len(lost) > 0 and len(df) == 40
        assert lost.error.str.contains("lost|EngineError|died", regex=True).all()
        assert df[df.error.isna()].result.tolist() == df[df.error.isna()].item.tolist()
        rows = cluster.nodes_status()
        assert all(r["status"] == "lost" for r in rows), rows
        assert f"Slurm job {job}" in rows[0]["error"]
    finally:
        cluster.stop_sync()
    assert state.list_states() == []


@pytest.mark.parametrize("kind", ["ipyparallel", "dask"])
def test_node_power_cut_mid_map_loses_no_item(kind, lounge_dir):
    # the controller's heartbeat would notice the node after 100 s: its silence does it
    cluster = Lounge(
        6, engines=kind, backend="slurm", engines_per_node=2, wait=True, heartbeat_ms=5000
    ).start_sync()
    victim = None
    try:

        def slow(x):
            import socket
            import time

            time.sleep(0.5)
            return x, socket.gethostname()

        victim = cluster.nodes_status()[1]["node"]  # e.g. node2
        index = victim.removeprefix("node")
        threading.Timer(1.5, subprocess.run, ([str(INFRA / "kill-node"), index],)).start()
        df = map_or_show_driver_log(cluster, lounge_dir, slow, range(30), timeout=60)
        assert df.error.isna().all(), df.error.dropna().tolist()
        assert [r[0] for r in df.result] == list(range(30))
        late = {r[1] for r in df.result[-6:]}
        assert victim not in late  # the last items ran on the nodes still up

        def lost():
            rows = cluster.nodes_status()
            return next((r for r in rows if r["node"] == victim and r["status"] == "lost"), None)

        row = wait_until(lost, 30, f"{victim} reported lost")
        assert "stopped answering" in row["error"], row
    finally:
        cluster.stop_sync()
        if victim:
            subprocess.run(
                [str(INFRA / "reup"), "3", "8"], capture_output=True, timeout=300, check=True
            )  # power the testbed's node back on
    assert state.list_states() == []
