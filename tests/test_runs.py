"""Runs: a map outlives the kernel that started it; cancel; a run driver killed mid-run resumes
with no row twice; a stopped cluster's runs stay readable until --forget. (Two runs on two
pools of the ssh lounge: test_ssh.py; the sidebar's runs: test_server.py and the browser.)"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import threading
import time

import pytest

from jupyter_lounge import Lounge, run, runner, runs, runstore, state
from jupyter_lounge.errors import LoungeError
from jupyter_lounge.runstore import PartialResult

from .conftest import processes_under, wait_until
from .test_cli import lounge


@pytest.fixture
def cluster(lounge_dir):
    cluster = Lounge(2, name="runs", wait=True).start_sync()
    yield cluster
    cluster.stop_sync()


def done(name: str, cluster: str = "runs") -> int:
    return run(name, cluster=cluster).summary()["done"]


def wait_for_rows(name: str, n: int, cluster: str = "runs", timeout: float = 60) -> None:
    """Until the run exists and has ``n`` rows stored."""
    path = runstore.store_path(cluster, name)
    wait_until(lambda: path.exists() and done(name, cluster) >= n, timeout, f"{n} rows of {name}")


def mapping_in_a_thread(cluster, *args, **kwargs) -> dict:
    """cluster.map in a thread (this one goes on to hurt it); what it gave or raised."""
    out: dict = {}

    def go():
        try:
            out["df"] = cluster.map(*args, progress=False, **kwargs)
        except Exception as e:  # noqa: BLE001 - the test looks at it
            out["error"] = e

    out["thread"] = threading.Thread(target=go, daemon=True)
    out["thread"].start()
    return out


KERNEL_CODE = """
%load_ext jupyter_lounge
%lounge start 2 --wait --name sweepy
import time, jupyter_lounge
def train(v):
    time.sleep(0.2)
    return {"loss": v * v}
"""


def test_a_run_outlives_the_kernel_that_started_it(lounge_dir):
    """The kernel is SIGKILLed mid-run: the run finishes, another process reads its table,
    and only then does the keeper stop the cluster, leaving no process behind."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", env=dict(os.environ))
    try:
        reply = kc.execute_interactive(KERNEL_CODE, timeout=240)
        assert reply["content"]["status"] == "ok", reply["content"]
        kc.execute("df = jupyter_lounge.current().map(train, range(60), name='sweep')")
        wait_for_rows("sweep", 4, "sweepy", timeout=120)
        os.kill(km.provisioner.process.pid, signal.SIGKILL)
        killed_at = done("sweep", "sweepy")
        assert killed_at < 60
        df = run("sweep", cluster="sweepy").wait(timeout=120, progress=False)
        assert list(df.item) == list(range(60)) and list(df.loss) == [v * v for v in range(60)]
        assert df.error.isna().all() and df.attrs["status"] == "done"
        # the run over, the keeper stops the cluster; the run stays readable
        wait_until(lambda: state.load_state("sweepy") is None, 60, "the keeper to stop it")
        wait_until(lambda: not processes_under(str(lounge_dir)), 30, "its processes to exit")
        assert run("sweep").summary()["status"] == "done"
        assert run("sweep").result().equals(df)
    finally:
        kc.stop_channels()
        km.cleanup_resources()


def test_cancel_stops_the_run_and_keeps_its_rows(cluster):
    def slow(v):
        time.sleep(1)
        return v

    out = mapping_in_a_thread(cluster, slow, range(100), name="long")
    wait_for_rows("long", 2)
    cluster.run("long").cancel()
    out["thread"].join(30)
    assert not out["thread"].is_alive()
    assert isinstance(out["error"], LoungeError)
    assert "Run 'long' cancelled" in str(out["error"]) and ".result()" in str(out["error"])
    summary = cluster.run("long").summary()
    assert summary["status"] == "cancelled" and summary["done"] < 100
    with pytest.warns(PartialResult, match=r"Run 'long' is cancelled: \d+ of 100 items done"):
        df = cluster.run("long").result()
    assert 2 <= len(df) < 100 and (df.result == df.item).all()
    assert df.attrs["status"] == "cancelled"
    # its batches were interrupted, not left running: the engines take the next map at once
    again = cluster.map(lambda v: -v, range(6), progress=False)
    assert list(again.result) == [-v for v in range(6)]
    with pytest.raises(LoungeError, match="already has a run named 'long'"):
        cluster.map(slow, [1], name="long", progress=False)


def test_a_killed_run_driver_is_restarted_and_resumes_with_no_row_twice(cluster, lounge_dir):
    def stamp(v):
        time.sleep(0.05)
        return v, time.time()

    first = runner._pid("runs")
    out = mapping_in_a_thread(cluster, stamp, range(200), name="resumed")
    wait_for_rows("resumed", 20)
    os.kill(first[0], signal.SIGKILL)
    killed, before = time.time(), done("resumed")
    out["thread"].join(120)  # the follower finds the driver gone and starts another
    assert "error" not in out, out.get("error")
    df = out["df"]
    assert [r[0] for r in df.result] == list(range(200)) and df.error.isna().all()
    kept = sum(1 for r in df.result if r[1] < killed)
    assert kept >= before  # the rows stored before the kill were not run again
    second = runner._pid("runs")
    assert second and second[0] != first[0] and runner.alive("runs")
    log = (lounge_dir / "runs" / "runs" / "driver.log").read_text()
    assert "resuming resumed" in log
    db = sqlite3.connect(runstore.store_path("runs", "resumed"))
    assert db.execute("SELECT count(*), count(DISTINCT idx) FROM rows").fetchone() == (200, 200)
    db.close()


def test_a_stalled_run_says_so_and_listing_the_runs_resumes_it(cluster):
    def slow(v):
        time.sleep(0.05)
        return v

    out = mapping_in_a_thread(cluster, slow, range(400), name="s", timeout=1)
    out["thread"].join(60)
    assert "goes on: follow it with run('s', cluster='runs').wait()" in str(out["error"])
    os.kill(runner._pid("runs")[0], signal.SIGKILL)
    wait_until(lambda: not runner.alive("runs"), 10, "the driver to die")
    summary = runs("runs")[0]
    assert summary["status"] == "stalled" and "its driver is gone" in summary["error"]
    assert cluster.runs()[0]["name"] == "s"  # listing them restarts the driver
    wait_until(lambda: runner.alive("runs"), 30, "the driver to be back")
    df = cluster.run("s").wait(timeout=60, progress=False)
    assert list(df.result) == list(range(400))


def test_a_stopped_cluster_keeps_its_runs_until_forget(lounge_dir, tmp_path):
    cluster = Lounge(2, name="kept", wait=True).start_sync()
    cluster.map(lambda v: v + 1, range(5), name="r1", progress=False)
    cluster.stop_sync()
    assert state.load_state("kept") is None and not processes_under(str(lounge_dir))
    assert [r["name"] for r in runs()] == ["r1"]
    assert list(run("r1").result().result) == [1, 2, 3, 4, 5]
    listing = lounge("runs")
    assert listing.returncode == 0 and "kept     r1    done    5/5" in listing.stdout
    csv = tmp_path / "r1.csv"
    out = lounge("run", "r1", "--csv", str(csv))
    assert out.returncode == 0 and f"Wrote 5 rows of 5 to {csv}." in out.stdout
    assert csv.read_text().splitlines()[1].startswith("0,0,1,")
    bad = lounge("run", "nope")
    assert bad.returncode == 2 and "No run named 'nope' in any cluster" in bad.stderr
    # a cluster of that name again sees the runs; --forget removes them with it
    cluster = Lounge(2, name="kept", wait=True).start_sync()
    assert [r["name"] for r in cluster.runs()] == ["r1"]
    assert len(runstore.function_files("kept", "r1")) == 1  # kept with its store
    cluster.stop_sync(forget=True)
    assert runs() == [] and not (lounge_dir / "kept").exists()


def test_delete_and_bad_names(cluster):
    cluster.map(abs, [-1], name="gone", progress=False)
    cluster.map(abs, [-1], name="gone.too", progress=False)  # its files start with "gone."
    assert len(runstore.function_files("runs", "gone")) == 1
    cluster.run("gone").delete()
    assert runstore.function_files("runs", "gone") == []  # its function's image too
    assert len(runstore.function_files("runs", "gone.too")) == 1
    cluster.run("gone.too").delete()
    assert sorted(p.name for p in runstore.runs_dir("runs").iterdir() if p.name[0] != ".") == [
        "driver.json",
        "driver.log",
    ]
    with pytest.raises(LoungeError, match="Cluster 'runs' has no run named 'gone'"):
        cluster.run("gone")
    for bad in ("../x", "a b", "-x", ""):
        with pytest.raises(LoungeError, match="Run name .* is not valid"):
            cluster.map(abs, [1], name=bad, progress=False)
    with pytest.raises(LoungeError, match="Pools are the lounge's: map\\(pool='gpu'\\) needs"):
        cluster.map(abs, [1], pool="gpu", progress=False)
    assert [r["name"] for r in cluster.runs()] == []


def test_the_store_is_private_and_holds_one_row_per_item(cluster):
    cluster.map(lambda v: {"v": v}, range(10), name="p", progress=False)
    path = runstore.store_path("runs", "p")
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700
    (image,) = runstore.function_files("runs", "p")  # the function, beside its store
    assert image.stat().st_mode & 0o777 == 0o600
    db = sqlite3.connect(path)
    status, total, done_, errors = db.execute(
        "SELECT status, total, done, errors FROM run"
    ).fetchone()
    assert (status, total, done_, errors) == ("done", 10, 10, 0)
    assert [i for (i,) in db.execute("SELECT idx FROM rows ORDER BY idx")] == list(range(10))
    db.close()
    assert json.loads(json.dumps(cluster.run("p").summary()))["load_code"].startswith(
        "from jupyter_lounge import run\n"
    )


def test_interrupting_the_engines_mid_map_ends_only_the_items_running_then(cluster):
    def slow(v):
        time.sleep(0.5)
        return v

    out = mapping_in_a_thread(cluster, slow, range(16), name="poked")
    wait_for_rows("poked", 2)
    cluster.interrupt_sync()
    out["thread"].join(60)
    df = out["df"]
    stopped = df[df.error.notna()]
    assert 1 <= len(stopped) <= 2 and stopped.error.str.startswith("KeyboardInterrupt").all()
    assert (df[df.error.isna()].result == df[df.error.isna()].item).all()  # the rest ran


def test_ctrl_c_on_a_map_cancels_its_run(cluster):
    def slow(v):
        time.sleep(0.5)
        return v

    timer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        cluster.map(slow, range(100), name="stopped", progress=False)
    timer.join()
    wait_until(lambda: cluster.run("stopped").summary()["status"] == "cancelled", 10,
               "the run to be cancelled")  # fmt: skip


def test_a_dead_run_driver_shows_in_the_clusters_status_and_the_next_map_restarts_it(cluster):
    assert lounge("status", "runs").stdout.count("run driver") == 0
    os.kill(runner._pid("runs")[0], signal.SIGKILL)
    wait_until(lambda: not runner.alive("runs"), 10, "the driver to die")
    status = lounge("status", "runs")
    assert "Its run driver is gone: following a run, `lounge runs runs`" in status.stdout
    assert list(cluster.map(abs, [-3], progress=False).result) == [3]
    assert runner.alive("runs") and "run driver" not in lounge("status", "runs").stdout
