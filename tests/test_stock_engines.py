"""Lounge engines behave like stock ones: what a user of ipyparallel or Dask does with the
stock client works on them the same way (ipyparallel's own suite runs in
test_ipyparallel_suite.py). Real controllers, agents and forked engines, on this machine."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time

import pytest

from jupyter_lounge import Lounge, faces, state
from jupyter_lounge.errors import LoungeError

from .conftest import wait_until


def _sleep(seconds, mark_in=None):
    """Sleep; first, given a folder, leave a file named for this engine's pid in it: the
    engine is then running the task (its Ctrl-C handler is in place; before, an engine
    ignores SIGINT)."""
    import os
    import time

    if mark_in:
        open(os.path.join(mark_in, str(os.getpid())), "w").close()
    time.sleep(seconds)
    return seconds


def _spin(seconds):
    """Pure Python for ``seconds``: interruptible at any line (unlike a sleep in C)."""
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return seconds


def _running(rc, tmp_path):
    """Both engines run ``_sleep`` for 60 s: its AsyncResult, once they do. The
    controller's queue counts a task as the engine's when it is sent, before the engine runs
    it, and a signal that came then was ignored (seen once in make test)."""
    folder = tmp_path / "running"
    folder.mkdir()
    ar = rc[:].apply_async(_sleep, 60, str(folder))
    wait_until(lambda: len(os.listdir(folder)) == 2, 20, "both engines running the task")
    return ar


def _crash():
    import os

    os._exit(3)


def _pid():
    import os

    return os.getpid()


@pytest.fixture
def ipp(lounge_dir):
    # Heartbeats every second: the controller would declare a dead engine after 20 misses
    # (20 s), so a death seen within 10 s below can only have come from the node's nanny.
    cluster = Lounge(2, engines="ipyparallel", wait=True, heartbeat_ms=1000)
    cluster.start_sync()
    yield cluster
    cluster.stop_sync()


def test_ipyparallel_signal_death_and_shutdown(ipp, tmp_path):
    rc = ipp.client
    # Client.send_signal reaches each engine through the node's nanny, while it is busy
    ar = _running(rc, tmp_path)
    rc.send_signal(signal.SIGINT, block=True)
    with pytest.raises(Exception) as info:
        ar.get(timeout=20)
    assert "KeyboardInterrupt" in str(info.value), str(info.value)

    # a crash is reported by the nanny at once (the heartbeat would take 20 minutes)
    # and the agent replaces the engine
    ar = rc[rc.ids[0]].apply_async(_crash)
    with pytest.raises(Exception) as info:
        ar.get(timeout=10)
    assert "EngineError" in repr(info.value) or "died" in str(info.value), repr(info.value)
    wait_until(lambda: len(rc.ids) == 2, 30, "a replacement engine")
    assert ipp.n == 2

    # an engine shut down on purpose is not replaced, and the target drops with it
    before = set(rc.ids)
    rc.shutdown(targets=[rc.ids[-1]], block=True)
    wait_until(lambda: len(rc.ids) == 1, 20, "the engine to unregister")
    time.sleep(2)  # a replacement would have registered by now
    assert len(rc.ids) == 1 and set(rc.ids) < before
    ipp.nodes_status()
    assert ipp.n == 1
    rows = ipp.engines()
    assert sorted(r["state"] for r in rows) == ["retired", "running"], rows
    # scaling up again forks new ranks
    ipp.scale_sync(2)
    ipp.wait_for_engines_sync(2, 60)
    assert ipp.n == 2
    # `exit` in an engine (%px exit) ends it on purpose too
    rc.wait_for_engines(2, timeout=30)
    rc[rc.ids[-1]].execute("exit", block=False)
    wait_until(lambda: len(rc.ids) == 1, 20, "the exited engine to unregister")
    time.sleep(2)
    ipp.nodes_status()
    assert len(rc.ids) == 1 and ipp.n == 1


def test_the_controller_queues_a_registration_flood_instead_of_dropping_it(ipp):
    """Every socket engines connect to listens with a backlog of 4,096 (ZMQ's default, 100,
    overflowed when hundreds of engines registered at once: their connections waited for
    TCP to try again; a local cluster's Unix sockets have the same queue)."""
    from jupyter_lounge.engines.ipp_controller import BACKLOG

    info = state.read_json(ipp.kind.connection_files(ipp.dir)[0])
    transport, where = info["interface"].split("://", 1)
    assert transport == "ipc"  # a local cluster: its Unix sockets, "path:port" each
    ports = {info[k] for k in ("registration", "control", "mux", "task", "iopub")}
    ports |= {info["hb_ping"], info["hb_pong"]}
    addresses = {f"{where}:{port}" for port in ports}
    listening = {}
    ss = subprocess.run(["ss", "-Hlx"], capture_output=True, text=True, timeout=30)
    for line in ss.stdout.splitlines():
        _, _, _, backlog, local, *_ = line.split()
        listening[local] = int(backlog)
    assert {a: listening.get(a) for a in addresses} == {a: BACKLOG for a in addresses}


def test_the_hub_still_refuses_a_pending_engine_twice_without_scanning_them_all(ipp):
    """Our hub finds a registration's clash among the pending ones by key (a scan of every
    pending registration was half its time in a flood of 4,096): a second registration of a
    pending engine is still refused, and an engine id asked for twice, or already in use,
    is still given to one engine only."""
    import zmq

    from jupyter_lounge.engines.ipp_nanny import session_for

    info = state.read_json(ipp.kind.connection_files(ipp.dir)[0])
    session = session_for(info)
    ctx = zmq.Context()
    public, secret = zmq.curve_keypair()

    def register(uuid: str, asked: int | None) -> dict:
        sock = ctx.socket(zmq.DEALER)
        sock.linger = 0
        if info.get("curve_serverkey"):  # (a local cluster has none: Unix sockets)
            sock.curve_serverkey = info["curve_serverkey"].encode()
            sock.curve_publickey, sock.curve_secretkey = public, secret
        # a socket identity of its own: the hub's ROUTER ignores a peer whose identity a
        # closing socket still holds there, so a second registration under the first's
        # identity was answered to nobody when it came before the first socket's goodbye
        sock.identity = f"{uuid}-{os.urandom(4).hex()}".encode()
        sock.connect(f"{info['interface']}:{info['registration']}")
        content = {"uuid": uuid} if asked is None else {"uuid": uuid, "id": asked}
        session.send(sock, "registration_request", content)
        assert sock.poll(10_000), "the hub did not answer"
        return session.deserialize(session.feed_identities(sock.recv_multipart())[1])["content"]

    try:
        tag = os.urandom(4).hex()
        first = register(f"pending-{tag}", 90)
        assert (first["status"], first["id"]) == ("ok", 90)
        again = register(f"pending-{tag}", None)  # its heart never beats: still pending
        assert again["status"] == "error" and "in use" in again["evalue"], again
        other = register(f"other-{tag}", 90)
        taken = register(f"third-{tag}", ipp.client.ids[0])
        assert other["status"] == taken["status"] == "ok"
        ids = {90, *ipp.client.ids}
        assert other["id"] not in ids and taken["id"] not in ids | {other["id"]}
    finally:
        ctx.destroy(linger=0)


def test_ipyparallel_broadcast_magics_and_interrupt(ipp, tmp_path):
    rc = ipp.client
    for coalescing in (False, True):
        view = rc.broadcast_view(is_coalescing=coalescing)
        assert view.apply_sync(lambda: 7) == [7, 7]
        view.scatter("x", list(range(4)), block=True)
        assert sorted(sum(view.pull("x", block=True), [])) == [0, 1, 2, 3]
    # the engine app is the application singleton: %matplotlib inline works on engines
    out = rc[:].execute("%matplotlib inline\nimport matplotlib.pyplot as plt", block=True)
    assert out.successful()
    shown = rc[:].execute(
        "from IPython.display import HTML, display\ndisplay(HTML('<b>x</b>'))", block=True
    )
    assert all(any("text/html" in o["data"] for o in outputs) for outputs in shown.outputs), (
        shown.outputs
    )

    # %lounge interrupt: the running work stops, the cluster and its engines stay
    pids = sorted(rc[:].apply_sync(_pid))
    ar = _running(rc, tmp_path)
    assert ipp.interrupt_sync() == 2  # engines interrupted (the faces' sentence: test_cli)
    with pytest.raises(Exception) as info:
        ar.get(timeout=20)
    assert "KeyboardInterrupt" in str(info.value)
    assert sorted(rc[:].apply_sync(_pid)) == pids  # the same engines, still serving


def _connection_file():
    from ipykernel import get_connection_file

    return get_connection_file()


def test_bind_kernel_makes_an_engine_a_kernel_a_frontend_connects_to(lounge_dir):
    """As on stock engines: bind_kernel() opens the engine's kernel ports (loopback, signed)
    for jupyter console --existing, and the engine still serves the cluster. On a cluster
    with CurveZMQ (every one but --no-tls) stock ipyparallel's bound kernel cannot work ("Bound
    kernel does not support CURVE security"), so this is the --no-tls cluster's."""
    from jupyter_client import BlockingKernelClient

    cluster = Lounge(1, engines="ipyparallel", tls=False, wait=True).start_sync()
    try:
        rc = cluster.client
        rc[0].execute("import ipyparallel\nipyparallel.bind_kernel()", block=True)
        kc = BlockingKernelClient(connection_file=rc[0].apply_sync(_connection_file))
        kc.load_connection_file()
        assert kc.ip == "127.0.0.1"
        kc.start_channels()
        try:
            reply = kc.execute_interactive("x = 6 * 7", timeout=30)
        finally:
            kc.stop_channels()
        assert reply["content"]["status"] == "ok"
        assert rc[0].pull("x", block=True) == 42  # the same namespace, still the cluster's
    finally:
        cluster.stop_sync()


def test_bind_kernel_on_a_local_cluster_opens_unix_sockets_in_its_folder(lounge_dir):
    """On a local cluster (ipc://, no CurveZMQ) bind_kernel() works too, and its kernel's
    sockets are Unix sockets in the cluster's private folder, not loopback ports."""
    from jupyter_client import BlockingKernelClient

    cluster = Lounge(1, engines="ipyparallel", wait=True).start_sync()
    try:
        rc = cluster.client
        rc[0].execute("import ipyparallel\nipyparallel.bind_kernel()", block=True)
        kc = BlockingKernelClient(connection_file=rc[0].apply_sync(_connection_file))
        kc.load_connection_file()
        assert kc.transport == "ipc" and kc.ip.startswith(cluster.socket_dir + "/k"), kc.ip
        kc.start_channels()
        try:
            reply = kc.execute_interactive("y = 6 * 7", timeout=30)
        finally:
            kc.stop_channels()
        assert reply["content"]["status"] == "ok"
        assert rc[0].pull("y", block=True) == 42
    finally:
        cluster.stop_sync()


def test_interrupt_refuses_a_stopped_cluster(ipp):
    ipp.stop_sync()
    with pytest.raises(LoungeError, match="not running"):
        ipp.interrupt_sync()


def test_dask_stock_client(lounge_dir):
    import dask.array as da
    from distributed import Client

    from jupyter_lounge.engines.dask import QUIET

    cluster = Lounge(2, engines="dask", wait=True)
    cluster.start_sync()
    try:
        client: Client = cluster.client
        assert client.submit(lambda x: x + 1, 1).result(timeout=30) == 2
        assert client.gather(client.map(lambda x: x * 2, range(10))) == list(range(0, 20, 2))
        [data] = client.scatter([list(range(100))], broadcast=True)
        assert client.submit(sum, data).result(timeout=30) == 4950
        pids = client.run(os.getpid)
        assert len(pids) == 2

        def idle_costs():
            import dask

            return [dask.config.get(k) for k in QUIET]

        quiet = [ours for _, ours in QUIET.values()]
        assert list(client.run(idle_costs).values()) == [quiet, quiet]  # an idle one is quiet
        levels = client.run(lambda: logging.getLogger("distributed").getEffectiveLevel())
        assert list(levels.values()) == [logging.WARNING] * 2  # no INFO lines per worker
        x = da.arange(10_000, chunks=1_000)
        assert int(client.compute(x.sum()).result(timeout=60)) == sum(range(10_000))
        try:
            import dask.dataframe as dd
            import pandas as pd

            df = dd.from_pandas(pd.DataFrame({"k": [1, 2, 1, 2], "v": range(4)}), npartitions=2)
            got = client.compute(df.groupby("k").v.sum()).result(timeout=60)
            assert got.to_dict() == {1: 2, 2: 4}
        except ImportError as e:  # dask.dataframe needs pyarrow: installed with the package
            pytest.fail(f"dask.dataframe is not usable on lounge workers: {e}")

        # a worker killed mid-task: the task is rescheduled and the agent replaces the worker
        slow = client.submit(_sleep, 3, pure=False)
        wait_until(
            lambda: client.processing() and any(client.processing().values()),
            10,
            "the task to start",
        )
        [(addr, _)] = [(a, k) for a, k in client.processing().items() if k]
        os.kill(pids[addr], signal.SIGKILL)
        assert slow.result(timeout=60) == 3
        wait_until(lambda: len(client.scheduler_info()["workers"]) == 2, 60, "a new worker")

        # restart without nannies: the scheduler closes the workers, the agents fork new ones
        client.restart(timeout=60)
        assert len(client.scheduler_info()["workers"]) == 2
        assert set(client.run(os.getpid).values()).isdisjoint(pids.values())
        assert cluster.n == 2

        # %lounge interrupt: each running task raises Interrupted; the workers stay
        running = client.map(_spin, [60, 60], pure=False)
        wait_until(
            lambda: sum(len(k) for k in client.processing().values()) == 2, 10, "both tasks to run"
        )
        said = faces.interrupted(cluster, cluster.interrupt_sync())
        assert said.startswith("Interrupted 2 engines of") and "raises Interrupted" in said, said
        for future in running:
            with pytest.raises(Exception) as info:
                future.result(timeout=20)
            assert type(info.value).__name__ == "Interrupted", repr(info.value)
        assert len(client.scheduler_info()["workers"]) == 2
        assert client.submit(lambda: 5).result(timeout=30) == 5
    finally:
        cluster.stop_sync()


@pytest.mark.fast
def test_idle_dask_workers_are_made_quiet_where_the_user_configured_nothing():
    import dask

    from jupyter_lounge.engines.dask import QUIET, quiet_workers

    stock = {k: v[0] for k, v in QUIET.items()}
    with dask.config.set({**stock, "distributed.admin.tick.interval": "50ms"}):
        changed = quiet_workers()
        assert "distributed.admin.tick.interval" not in changed  # the user's own value stays
        assert dask.config.get("distributed.admin.tick.interval") == "50ms"
        assert dask.config.get("distributed.worker.profile.enabled") is False
        assert dask.config.get("distributed.worker.memory.monitor-interval") == "500ms"
    with dask.config.set(stock):
        kept = quiet_workers(profile=True)  # with --dashboard: its instruments stay on
        assert "distributed.admin.tick.interval" in kept
        for key in ("profile.enabled", "system-monitor.disk", "system-monitor.gil.enabled"):
            name = f"distributed.{'worker' if key.startswith('profile') else 'admin'}.{key}"
            assert name not in kept and dask.config.get(name) is True, name


@pytest.mark.fast
def test_dask_info_logs_are_quieted_only_where_the_user_configured_none():
    import dask

    from jupyter_lounge.engines.dask import quiet_worker_logs

    dask_logger = logging.getLogger("distributed")
    before = dask_logger.level
    try:
        dask_logger.setLevel(logging.INFO)
        with dask.config.set({"logging": {"distributed": "info"}}):  # the user's own
            assert quiet_worker_logs() is False and dask_logger.level == logging.INFO
        assert quiet_worker_logs() is True and dask_logger.level == logging.WARNING
        dask_logger.setLevel(logging.DEBUG)  # set by the user in code
        assert quiet_worker_logs() is False and dask_logger.level == logging.DEBUG
    finally:
        dask_logger.setLevel(before)
