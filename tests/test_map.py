"""lounge.map on real engines: batches, the function shipped once, every item one row in input
order whatever happens to an engine. (A testbed node powered off mid-map: test_ssh.py and
test_slurm.py, test_node_power_cut_mid_map_loses_no_item.)"""

from __future__ import annotations

import os
import signal
import threading

import pytest

from jupyter_lounge import Lounge
from jupyter_lounge.mapping import _Driver

from .conftest import wait_until

KINDS = ["ipyparallel", "dask"]


@pytest.fixture(params=KINDS)
def cluster(request, lounge_dir):
    slow = request.node.get_closest_marker("heartbeat_ms")
    heartbeat = slow.args[0] if slow else None
    cluster = Lounge(4, engines=request.param, wait=True, heartbeat_ms=heartbeat).start_sync()
    yield cluster
    cluster.stop_sync()


def test_a_hundred_thousand_items_every_row_in_input_order(cluster):
    def twice_or_fail(v):
        if v % 9973 == 0 and v:
            raise ValueError(f"no {v}")
        return 2 * v

    n = 100_000
    df = cluster.map(twice_or_fail, range(n), progress=False)
    assert len(df) == n and list(df["item"]) == list(range(n))
    failed = {v for v in range(1, n) if v % 9973 == 0}
    assert set(df.index[df.error.notna()]) == failed  # an item's error is its own row
    assert all(df.error[v].startswith(f"ValueError: no {v}") for v in failed)
    ok = df[df.error.isna()]
    assert (ok.result == 2 * ok.item).all()
    assert set(df.engine) == {0, 1, 2, 3}  # every engine took batches
    assert (df.node != "").all() and (df.host != "").all() and (ok.seconds >= 0).all()


def test_a_sweep_keeps_its_parameters_first_and_the_result_keys_right_after(cluster):
    grid = [{"lr": lr, "units": u} for lr in (0.1, 0.01) for u in (8, 16)]
    df = cluster.map(lambda lr, units: {"loss": lr * units, "ok": True}, grid, progress=False)
    assert list(df.columns) == [
        *("lr", "units", "result", "loss", "ok", "error"),
        *("engine", "node", "host", "seconds"),
    ]
    assert list(df.loss) == [g["lr"] * g["units"] for g in grid]


def loads_on_engines(cluster) -> dict:
    def loads():
        from jupyter_lounge import tasks

        return dict(tasks.loads)

    if cluster.kind.name == "dask":
        return dict(cluster.client.run(loads))
    return dict(zip(cluster.client.ids, cluster.client[:].apply_sync(loads)))


def test_the_function_and_its_closure_travel_once_per_node_and_load_once_per_engine(cluster):
    import numpy as np

    weights = np.arange(1_000_000, dtype=np.float64)  # 8 MB the function closes over
    before = loads_on_engines(cluster)
    df = cluster.map(lambda i: float(weights[i]), range(2000), progress=False)
    assert df.error.isna().all() and list(df.result) == [float(i) for i in range(2000)]
    after = loads_on_engines(cluster)
    new = {
        engine: {k: v - before.get(engine, {}).get(k, 0) for k, v in seen.items()}
        for engine, seen in after.items()
    }
    counts = [count for seen in new.values() for count in seen.values() if count]
    assert counts == [1] * len(counts) and len(counts) == df.engine.nunique() == 4
    # local engines: none was sent it over the network; the driver linked the run's image
    # where they look for a sibling's copy, and each mapped that file
    assert df.attrs["function_sent"] == 0
    from jupyter_lounge import runstore

    (image,) = runstore.function_files(cluster.name, df.attrs["run"])
    (copy,) = [p for p in cluster.dir.glob("map-*.pkl") if p.stat().st_ino == image.stat().st_ino]
    assert copy.stat().st_mode & 0o777 == image.stat().st_mode & 0o777 == 0o600


def test_the_image_keeps_large_buffers_out_of_band_and_loads_them_in_place(tmp_path):
    import numpy as np

    from jupyter_lounge import tasks

    def closure():
        weights = np.arange(1_000_000, dtype=np.float64)

        def f(i):
            weights[0] = -1.0  # what it closes over stays writable, as when pickled in band
            return float(weights[i])

        return f

    parts = tasks.pack(closure())
    assert len(parts) == 2 and len(parts[0]) < 10_000 and parts[1].nbytes == 8_000_000
    path = str(tmp_path / "image")
    tasks.write_image(path, tasks.frame(parts), sync=True)
    fn = tasks.load(tasks.map_image(path, writable=True))
    assert fn(0) == -1.0 and fn(999_999) == 999_999.0
    weights = fn.__closure__[0].cell_contents
    assert not weights.flags.owndata and weights.ctypes.data % tasks.ALIGN == 0  # in the map
    assert tasks.load(bytearray(b"".join(tasks.frame(parts))))(5) == 5.0
    with open(path, "rb") as f:  # the file is as written: the engine's writes are its own
        assert tasks.unframe(f.read())[1].tobytes() == parts[1].tobytes()


@pytest.mark.heartbeat_ms(5000)  # the controller's would notice after 100 s: the nanny tells it
def test_an_engine_killed_mid_batch_loses_no_item_and_doubles_none(cluster):
    def slow(v):
        import time

        time.sleep(0.02)
        return v, os.getpid()

    import sqlite3

    from jupyter_lounge import runstore

    victim = next(e["pid"] for e in cluster.engines() if e["rank"] == 1)

    def ran_on_the_victim() -> int:
        path = runstore.store_path(cluster.name, "victim")
        if not path.exists():
            return 0
        with sqlite3.connect(path) as db:
            return db.execute("SELECT count(*) FROM rows WHERE engine = 1").fetchone()[0]

    def kill_once_it_ran_some():
        wait_until(lambda: ran_on_the_victim() >= 5, 60, "rank 1's first rows")
        os.kill(victim, signal.SIGKILL)

    threading.Thread(target=kill_once_it_ran_some, daemon=True).start()
    df = cluster.map(slow, range(400), name="victim", progress=False, timeout=60)
    assert df.error.isna().all(), df.error.dropna().tolist()
    assert [r[0] for r in df.result] == list(range(400))  # each once, in order
    pids = {r[1] for r in df.result}
    assert victim in pids and len(pids) >= 4  # it ran some, then its rank's new engine did
    wait_until(lambda: len(cluster.registered()) == 4, 30, "the killed engine's replacement")


def test_batches_grow_from_the_measured_time_per_item_and_stay_fair():
    class Kind:  # no engine: only the driver's sizing is looked at
        pass

    class Cluster:
        kind, client = Kind(), None

    driver = _Driver(Cluster(), len, list(range(100_000)), retries=1, timeout=None)
    driver.engines = {e: f"node{e}" for e in range(8)}
    assert len(driver._batch()) == 1  # nothing timed yet: one item, to measure
    driver.per_item = 1e-6  # tiny items: as many as a tenth of a second holds, within limits
    assert len(driver._batch()) == 3125  # a fair share: a quarter of what each engine has left
    driver.todo.extend(range(10_000_000))
    assert len(driver._batch()) == 20_000  # never more than MAX_BATCH
    driver.per_item = 1.0  # one second each: one at a time, so none piles up on one engine
    assert len(driver._batch()) == 1


class InProcess:
    """An engine kind whose engines run batches here, at once (pure driver logic): engine
    ``doomed`` (None: any) dies on its batch while ``fail`` deaths are left, and a new engine
    with a new id takes its place, as an agent's replacement registers anew."""

    name = "fake"

    def __init__(self, engines=(0, 1, 2), doomed=None, fail=0, node=None):
        self.ids, self.doomed, self.fail, self.sent = list(engines), doomed, fail, []
        self.node = node  # every engine on this node; None: each on its own

    def engines(self, client):
        return {e: self.node or f"node{e}" for e in self.ids}

    def submit_to(self, client, engine, fn, *args):
        from concurrent.futures import Future

        self.sent.append((engine, args[2] is not None))  # did it carry the function?
        future = Future()
        if self.fail and self.doomed in (None, engine):
            self.fail -= 1
            self.ids[self.ids.index(engine)] = max(self.ids) + 1
            future.set_exception(RuntimeError("its engine died"))
        else:
            future.set_result(fn(*args))
        return future

    def wait_any(self, futures, timeout):
        pass

    def outcome(self, future):
        return future.result()


def drive(kind, items, retries=1, status=None):
    """The table of a map over ``kind``'s engines; ``status()`` gives the nodes' rows."""
    from jupyter_lounge import tasks

    tasks._functions.clear()  # each fake engine is this process: start without the function

    class Cluster:
        client = None

        def nodes_status(self):
            return status() if status else [{"status": "running", "error": None}]

    Cluster.kind = kind
    driver = _Driver(Cluster(), lambda v: v * 10, items, retries=retries, timeout=30)

    class Bar:
        def update(self, n):
            pass

    driver.run(Bar())
    return driver.table()


def test_a_lost_batch_runs_again_elsewhere_and_keeps_its_rows():
    kind = InProcess(doomed=1, fail=1)
    df = drive(kind, list(range(50)))
    assert list(df.result) == [v * 10 for v in range(50)] and df.error.isna().all()


def test_the_batches_of_a_lost_node_run_elsewhere_though_the_controller_still_has_it(
    monkeypatch, capsys
):
    """A powered-off PC: its engine's batch never comes back and the controller (its
    heartbeat slow on purpose) still lists the engine; the node's agent is lost."""
    from concurrent.futures import Future

    from jupyter_lounge import mapping

    monkeypatch.setattr(mapping, "NODES_EVERY_S", 0.1)

    class PoweredOff(InProcess):
        def submit_to(self, client, engine, fn, *args):
            if engine == 1:
                self.sent.append((engine, args[2] is not None))
                return Future()  # never done
            return super().submit_to(client, engine, fn, *args)

    kind = PoweredOff(engines=[0, 1, 2])

    def status():
        cut = any(engine == 1 for engine, _ in kind.sent)
        why = "the SSH session to 10.77.0.12 ended" if cut else None
        return [{"node": "node1", "status": "lost" if cut else "running", "error": why}]

    df = drive(kind, list(range(40)), status=status)
    assert list(df.result) == [v * 10 for v in range(40)] and df.error.isna().all()
    assert 1 not in set(df.engine) and sum(1 for e, _ in kind.sent if e == 1) == 1
    assert [kind.engines(None)] == [{0: "node0", 1: "node1", 2: "node2"}]  # still listed
    said = capsys.readouterr().out  # the driver's log says so
    assert "lost a batch on engine 1 (its node (node1) was lost: the SSH session to" in said
    assert "): items back in the queue 1, given up 0" in said, said


def test_an_item_lost_more_often_than_retries_says_so_in_its_row():
    kind = InProcess(engines=[1], fail=10)
    df = drive(kind, list(range(3)), retries=2)
    assert list(df.error) == ["lost: RuntimeError: its engine died"] * 3
    assert kind.fail == 1  # three tries each: nine engines died


def test_engines_that_lost_a_batch_but_are_still_there_get_work_again():
    class Flaky(InProcess):  # the batch fails, the engine stays (same id): not a death
        def submit_to(self, client, engine, fn, *args):
            from concurrent.futures import Future

            if self.fail:
                self.fail -= 1
                self.sent.append((engine, args[2] is not None))
                future = Future()
                future.set_exception(RuntimeError("lost dependencies"))
                return future
            return super().submit_to(client, engine, fn, *args)

    kind = Flaky(engines=[0, 1], fail=2)  # both lose their first batch
    df = drive(kind, list(range(20)), retries=3)  # once every engine is marked, none waits
    assert list(df.result) == [v * 10 for v in range(20)] and df.error.isna().all()


def test_the_function_goes_with_the_first_batch_to_each_engine_only():
    kind = InProcess(engines=[0, 1, 2])
    drive(kind, list(range(200)))
    first = {}
    for engine, carried in kind.sent:
        first.setdefault(engine, carried)
        if engine in first and first[engine] is not carried:
            assert not carried  # later batches: the key alone
    assert first == {0: True, 1: True, 2: True}


def test_an_engine_that_lost_the_function_is_sent_it_again():
    from jupyter_lounge import tasks

    class Forgetful(InProcess):  # a restarted engine behind the same id
        def submit_to(self, client, engine, fn, *args):
            if len(self.sent) == 3:
                tasks._functions.clear()
            return super().submit_to(client, engine, fn, *args)

    kind = Forgetful(engines=[0])
    df = drive(kind, list(range(100)))
    assert list(df.result) == [v * 10 for v in range(100)] and df.error.isna().all()
    carried = [c for _, c in kind.sent]
    assert carried[:4] == [True, False, False, False]  # then it forgot (before the 4th)
    assert carried.count(True) == 2  # sent again once, after its "missing"


def test_the_function_travels_once_per_node_and_the_siblings_read_its_copy(tmp_path, monkeypatch):
    from jupyter_lounge import tasks

    monkeypatch.setenv("LOUNGE_SHARE_DIR", str(tmp_path))

    class Apart(InProcess):  # each engine its own process: only the node's copy is shared
        def submit_to(self, client, engine, fn, *args):
            tasks._functions.clear()
            return super().submit_to(client, engine, fn, *args)

    kind = Apart(engines=[0, 1, 2], node="pc1")
    df = drive(kind, list(range(60)))
    assert list(df.result) == [v * 10 for v in range(60)] and df.error.isna().all()
    assert df.attrs["function_sent"] == 1  # one node: one transfer
    assert [carried for _, carried in kind.sent].count(True) == 1
    copies = list(tmp_path.glob("map-*.pkl"))
    assert len(copies) == 1 and copies[0].stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("cluster", ["dask"], indirect=True)
def test_a_dask_result_lost_with_its_worker_before_it_was_fetched_is_a_lost_batch(cluster):
    # The race the full suite once hit: a batch finished, its worker killed before the result
    # was gathered; Dask reschedules it onto that (dead, pinned) worker, and waiting on it
    # would never end. outcome() must say it was lost, so the driver reruns it elsewhere.
    import time

    from jupyter_lounge.engines.base import parse_engine_name
    from jupyter_lounge.errors import LoungeError

    victim = next(e for e in cluster.engines() if e["rank"] == 1)
    workers = cluster.client.scheduler_info(n_workers=-1)["workers"]
    addr = next(a for a, w in workers.items() if parse_engine_name(w["name"])[1] == 1)
    future = cluster.kind.submit_to(cluster.client, addr, os.getpid)
    wait_until(lambda: future.status == "finished", 30, "the pinned task to finish")
    os.kill(victim["pid"], signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(LoungeError, match="died before the batch's result"):
        cluster.kind.outcome(future)
    assert time.monotonic() - started < 60
