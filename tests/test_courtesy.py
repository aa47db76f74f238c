"""Courtesy: engines leave a machine a person uses and come back when it is idle again.
The rule is pure logic (tested with a given clock); telemetry reads this real machine; and on
the testbed a person logs in at one node for real while a map runs."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from jupyter_lounge import Lounge, state
from jupyter_lounge.telemetry import Courtesy, IdlePolicy, Telemetry

from .conftest import inventory_for_testbed, processes_under, slurm_testbed_problem, wait_until

INFRA = Path(__file__).parent / "infra"
POLICY = IdlePolicy(cpu_percent=50, gpu_percent=20, for_seconds=10, idle_after_seconds=60)


def quiet(**extra):
    return {"users": [], "foreign_cpu_percent": 0, "gpus": [], **extra}


def test_a_login_makes_it_in_use_at_once_and_idle_only_after_a_quiet_while():
    c = Courtesy(POLICY, now=0)
    assert c.update(quiet(), now=1) == "idle"
    assert c.update(quiet(users=["ana"]), now=2) == "in use" and c.reason == "ana logged in"
    assert c.update(quiet(), now=3) == "in use"  # just left: not yet
    assert c.update(quiet(), now=62) == "in use"
    assert c.update(quiet(), now=63) == "idle"


def test_foreign_load_counts_only_when_it_lasts():
    c = Courtesy(POLICY, now=0)
    assert c.update(quiet(foreign_cpu_percent=90), now=1) == "idle"
    assert c.update(quiet(foreign_cpu_percent=90), now=5) == "idle"
    assert c.update(quiet(foreign_cpu_percent=10), now=6) == "idle"  # a blip resets it
    assert c.update(quiet(foreign_cpu_percent=90), now=7) == "idle"
    assert c.update(quiet(foreign_cpu_percent=90), now=17) == "in use"
    assert "90% CPU" in c.reason
    gpu = Courtesy(POLICY, now=0)
    gpu.update(quiet(gpus=[{"util_percent": 80}]), now=1)
    assert gpu.update(quiet(gpus=[{"util_percent": 80}]), now=11) == "in use"
    probe = Courtesy(POLICY, now=0)
    assert probe.update(quiet(), now=1, probe_in_use=True) == "in use"


def test_telemetry_reads_this_machine_and_sees_foreign_cpu():
    keeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        tel = Telemetry(own_pid=keeper.pid)  # the burner is not a child of "ours"
        tel.sample()
        time.sleep(1.5)
        sample = tel.sample()
        assert sample["foreign_cpu_percent"] > 50
        assert 0 <= sample["memory_percent"] <= 100 and sample["cpus"] >= 1
        assert len(sample["load"]) == 3 and isinstance(sample["users"], list)
        assert sample["gpus"] == []  # no GPU here; a GPU machine reports one dict per GPU
    finally:
        burner.kill()
        keeper.kill()
        burner.wait()
        keeper.wait()


@pytest.mark.parametrize(
    "kind, where",
    [("ipyparallel", "ssh"), ("dask", "ssh"), ("ipyparallel", "slurm"), ("dask", "slurm")],
)
def test_a_person_logging_in_evicts_engines_without_losing_work(kind, where, tmp_path, lounge_dir):
    problem = slurm_testbed_problem()
    if problem:
        pytest.skip(problem)
    if where == "ssh":  # the lounge: the inventory's idle policy applies by itself
        options = inventory_for_testbed(tmp_path / "lounge.toml")
        with open(options["inventory"], "a") as f:
            f.write("[idle]\nfor_seconds = 3\nidle_after_seconds = 4\n")
        options["nodes"] = 3
    else:
        courtesy = {"for_seconds": 3, "idle_after_seconds": 4}
        options = {"backend": "slurm", "engines_per_node": 2, "courtesy": courtesy}
    cluster = Lounge(6, engines=kind, wait=True, **options).start_sync()
    node = None
    try:
        node = cluster.nodes_status()[0]["node"]

        def arrive():
            time.sleep(1.5)
            subprocess.run(
                [str(INFRA / "login-node"), node.removeprefix("node"), "ana"],
                check=True,
                timeout=30,
            )

        threading.Thread(target=arrive).start()

        def slow(x):
            import socket
            import time

            time.sleep(0.5)
            return x, socket.gethostname()

        t0 = time.monotonic()
        df = cluster.map(slow, range(30), progress=False, timeout=120)
        assert df.error.isna().all(), df.error.dropna().tolist()
        assert [r[0] for r in df.result] == list(range(30))
        row = wait_until(
            lambda: next(
                (
                    r
                    for r in cluster.nodes_status()
                    if r["node"] == node and (r["status"], r["why"]) == ("in use", "ana logged in")
                ),
                None,
            ),
            10,
            f"{node} reported in use",
        )
        assert row["ready"] == 0 or time.monotonic() - t0 < 15
        report = state.read_json(cluster.agents[0]["files"]["report"])
        assert report["courtesy"] == {"state": "in use", "reason": "ana logged in"}
        assert report["telemetry"]["users"] == ["ana"]
        assert all(e["state"] == "evicted" for e in report["engines"].values())
        wait_until(lambda: len(cluster.registered()) == 4, 15, "the evicted engines to leave")

        subprocess.run(
            [str(INFRA / "logout-node"), node.removeprefix("node")], check=True, timeout=30
        )
        cluster.wait_for_engines_sync(6, timeout=30)  # back after the quiet while
        assert next(r for r in cluster.nodes_status() if r["node"] == node)["status"] == "running"
    finally:
        if node:
            subprocess.run([str(INFRA / "logout-node"), node.removeprefix("node")], timeout=30)
        cluster.stop_sync()


@pytest.mark.parametrize("kind", ["ipyparallel", "dask"])
def test_an_agent_gives_its_memory_back_while_in_use_and_returns_full(kind, tmp_path, lounge_dir):
    """A person at the machine: the engines go, and the agent executes itself anew without
    the preload (same pid, a fraction of the memory). Idle again: it imports the preload anew
    and forks the engines, which have it."""
    person = tmp_path / "person"
    courtesy = {
        "probe": f"test -e {person}",  # this machine's own people and load do not count here
        "cpu_percent": 100,
        "gpu_percent": 100,
        "for_seconds": 1,
        "idle_after_seconds": 1,
    }
    cluster = Lounge(2, engines=kind, preload="pandas", courtesy=courtesy, wait=True)
    cluster.start_sync()
    try:

        def report():
            return state.read_json(cluster.agents[0]["files"]["report"])

        full = wait_until(lambda: (r := report())["telemetry"] and r, 10, "a telemetry sample")
        assert full["status"] == "running"
        person.touch()
        lean = wait_until(
            lambda: (
                (r := report())["status"] == "in use"
                and r["telemetry"]["agent_mib"] < full["telemetry"]["agent_mib"] / 2
                and r
            ),
            30,
            "the agent to rest lean",
        )
        assert lean["pid"] == full["pid"] and lean["timings"] == full["timings"]
        assert all(e["state"] == "evicted" for e in lean["engines"].values())
        agent = psutil.Process(full["pid"])
        assert "--resume" in agent.cmdline() and agent.children() == []
        wait_until(lambda: len(cluster.registered()) == 0, 15, "the evicted engines to leave")

        person.unlink()
        cluster.wait_for_engines_sync(2, timeout=60)
        back = report()
        assert back["pid"] == full["pid"] and back["status"] == "running"
        assert all(e["restarts"] == 1 for e in back["engines"].values())
        df = cluster.map(lambda _: "pandas" in sys.modules, range(4), progress=False)
        assert df.result.tolist() == [True] * 4  # forked from an agent that imported it anew
    finally:
        cluster.stop_sync()
    assert processes_under(str(lounge_dir)) == []


def test_a_cluster_stopped_while_its_agent_rests_leaves_nothing(tmp_path, lounge_dir):
    person = tmp_path / "person"
    courtesy = {"probe": f"test -e {person}", "cpu_percent": 100, "gpu_percent": 100}
    cluster = Lounge(2, courtesy=courtesy, wait=False).start_sync()
    try:
        person.touch()
        report = wait_until(
            lambda: (
                (r := state.read_json(cluster.agents[0]["files"]["report"]))
                and r["status"] == "in use"
                and "--resume" in psutil.Process(r["pid"]).cmdline()
                and r
            ),
            30,
            "the agent to rest",
        )
        assert cluster.nodes_status()[0]["why"] == "the idle probe says in use"
    finally:
        cluster.stop_sync()
    assert not psutil.pid_exists(report["pid"]) and processes_under(str(lounge_dir)) == []
