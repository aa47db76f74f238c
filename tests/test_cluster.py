"""The contract suite: real controllers, real node agents, real forked engines, for both
engine kinds; the tests that take the ``backend`` fixture run on every backend (Slurm on the
testbed). The rest reach into local processes (kill an engine by pid, and so on)."""

from __future__ import annotations

import gc
import os
import select
import signal
import subprocess
import sys
import threading
import time

import pytest

from jupyter_lounge import Lounge, current, faces, state
from jupyter_lounge.errors import LoungeError, LoungeTimeout

from .conftest import processes_under, wait_until

KINDS = ["ipyparallel", "dask"]


def run_everywhere(cluster, fn):
    """fn() on every engine, through the stock client."""
    if cluster.kind.name == "ipyparallel":
        return cluster.client[:].apply_sync(fn)
    return list(cluster.client.run(fn).values())


def modules_seen():
    import sys

    return sorted(m for m in ("numpy", "json", "tensorflow") if m in sys.modules)


@pytest.fixture(params=KINDS)
def kind(request):
    return request.param


def test_start_map_scale_stop(kind, backend, lounge_dir):
    cluster = Lounge(3, engines=kind, nodes=2, preload="numpy", wait=True, **backend)
    cluster.start_sync()
    try:
        assert current() is cluster
        # preload visible before any task imported it: the first thing the engines run
        assert run_everywhere(cluster, modules_seen) == [["json", "numpy"]] * 3
        nodes = cluster.nodes_status()
        assert [r["target"] for r in nodes] == [2, 1] and len({r["node"] for r in nodes}) == 2
        expected = sorted(r["node"] for r in nodes for _ in range(r["target"]))
        assert sorted(n for n, _ in cluster.registered()) == expected

        df = cluster.map(lambda x: x * x, range(10), progress=False)
        assert list(df["item"]) == list(range(10))
        assert list(df["result"]) == [x * x for x in range(10)]
        assert df["error"].isna().all()
        assert set(df["engine"]) <= {0, 1, 2} and df["seconds"].ge(0).all()
        assert set(df["host"]) <= {os.uname().nodename} | {r["node"] for r in nodes}

        cluster.scale_sync(5)
        cluster.scale_sync(5)  # twice is harmless
        cluster.wait_for_engines_sync(5, timeout=60)
        ranks = sorted(r for _, r in cluster.registered())
        assert ranks == [0, 1, 2, 3, 4]
        assert sum(len(a["ranks"]) for a in cluster.agents) == 5

        cluster.scale_sync(2)
        wait_until(lambda: len(cluster.registered()) == 2, 30, "scale down to 2 engines")
        assert state.load_state(cluster.name)["n"] == 2
    finally:
        cluster.stop_sync()
    assert state.load_state(cluster.name) is None
    assert processes_under(str(lounge_dir)) == []


def test_sweep_items_are_keyword_arguments(kind, backend):
    cluster = Lounge(2, engines=kind, wait=True, **backend).start_sync()
    try:

        def train(lr, layers):
            if layers == 0:
                raise ValueError("no layers")
            return {"score": lr * layers}

        grid = [{"lr": lr, "layers": n} for lr in (0.1, 0.2) for n in (0, 3)]
        df = cluster.map(train, grid, progress=False)
        assert list(df.columns[:2]) == ["lr", "layers"]
        assert df.loc[df.layers == 0, "error"].str.startswith("ValueError: no layers").all()
        ok = df[df.layers == 3]
        assert ok["error"].isna().all()
        assert list(ok["score"]) == pytest.approx([0.3, 0.6])
    finally:
        cluster.stop_sync()


def worker_folders(cluster) -> dict[int, str]:
    """A Dask cluster's workers' folders by rank."""
    from jupyter_lounge.engines.base import parse_engine_name

    def folder(dask_worker):
        return dask_worker.name, dask_worker.local_directory

    return {parse_engine_name(n)[1]: d for n, d in cluster.client.run(folder).values()}


def test_engine_killed_mid_map_loses_nothing(kind, pids_of):
    cluster = Lounge(3, engines=kind, wait=True).start_sync()
    try:
        victim = pids_of(cluster)[0]
        before = worker_folders(cluster) if kind == "dask" else {}

        def kill_soon():
            time.sleep(1.0)
            os.kill(victim, signal.SIGKILL)

        threading.Thread(target=kill_soon).start()

        def slow(x):
            import time

            time.sleep(0.5)
            return x + 100

        df = cluster.map(slow, range(12), progress=False, timeout=120)
        assert df["error"].isna().all(), df["error"].tolist()
        assert list(df["result"]) == [x + 100 for x in range(12)]
        assert victim not in pids_of(cluster)
        wait_until(lambda: len(pids_of(cluster)) == 3, 10, "the killed engine's replacement")
        cluster.wait_for_engines_sync(3, timeout=60)
        report = state.read_json(cluster.agents[0]["files"]["report"])
        assert sum(e["restarts"] for e in report["engines"].values()) == 1
        if kind == "dask":  # each rank its own workspace; a replacement purges its dead one's
            after = worker_folders(cluster)
            assert set(after) == set(before) and after != before, (before, after)
            for rank, folder in after.items():
                workspace = os.path.dirname(folder)
                assert os.path.basename(os.path.dirname(workspace)) == f"rank-{rank}"
                assert {e for e in os.listdir(workspace) if not e.endswith(".lock")} == {
                    os.path.basename(folder),
                    os.path.basename(folder) + ".dirlock",
                }, (rank, os.listdir(workspace))
    finally:
        cluster.stop_sync()


def test_agent_killed_takes_its_engines_and_is_reported(kind, pids_of):
    cluster = Lounge(4, engines=kind, nodes=2, wait=True).start_sync()
    try:
        agent = cluster.agents[0]
        engines = [
            p
            for p in pids_of(cluster)
            if p
            in {e["pid"] for e in state.read_json(agent["files"]["report"])["engines"].values()}
        ]
        assert len(engines) == 2
        os.kill(agent["pid"], signal.SIGKILL)

        def gone():
            return not any(
                os.path.exists(f"/proc/{p}")
                and open(f"/proc/{p}/stat").read().split(")")[1].split()[0] != "Z"
                for p in engines
            )

        wait_until(gone, 10, "the dead agent's engines to exit")
        rows = {r["node"]: r for r in cluster.nodes_status()}
        assert rows[agent["node"]]["status"] == "lost"
        assert rows[cluster.agents[1]["node"]]["status"] == "running"
        wait_until(lambda: len(cluster.registered()) == 2, 30, "the controller to drop them")
        assert "lost" in faces.describe(cluster)
    finally:
        cluster.stop_sync()


def test_attach_from_another_process(kind, backend, lounge_dir):
    cluster = Lounge(2, engines=kind, name="shared", wait=True, **backend)
    cluster.start_sync()
    try:
        code = (
            "from jupyter_lounge import Lounge\n"
            "c = Lounge.attach('shared')\n"
            "c.wait_for_engines_sync(2, timeout=30)\n"
            "df = c.map(lambda x: x + 1, [1, 2, 3], progress=False)\n"
            "print(list(df.result), sorted(r for _, r in c.registered()))\n"
            "c.scale_sync(3)\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=120,
            env=os.environ,
        )
        assert out.returncode == 0, out.stderr
        assert "[2, 3, 4] [0, 1]" in out.stdout.splitlines(), out.stdout
        cluster.wait_for_engines_sync(3, timeout=60)  # the other process scaled it
    finally:
        cluster.stop_sync()


def test_preload_failure_is_one_clear_error_and_cleans_up(kind, backend, lounge_dir):
    cluster = Lounge(2, engines=kind, preload="json,no_such_module_xyz", **backend)
    with pytest.raises(LoungeError) as info:
        cluster.start_sync()
    message = str(info.value)
    assert "no_such_module_xyz" in message and "node" in message
    assert "ModuleNotFoundError" in message
    assert state.load_state(cluster.name) is None
    assert processes_under(str(lounge_dir)) == []


def test_timeout_names_what_it_waited_for(lounge_dir):
    cluster = Lounge(2, preload="tensorflow", timeout=0.5)
    with pytest.raises(LoungeTimeout) as info:
        cluster.start_sync()
    message = str(info.value)
    assert "Timed out after 0.5 s waiting for" in message and cluster.name in message
    assert "--timeout" in message
    assert processes_under(str(lounge_dir)) == []
    assert state.list_states() == []


def test_duplicate_name_and_unknown_names():
    cluster = Lounge(1, name="dup").start_sync()
    try:
        with pytest.raises(LoungeError, match="A cluster named 'dup' is already in use"):
            Lounge(1, name="dup").start_sync()
        assert len(cluster.registered()) == 1  # the running one was left alone
        with pytest.raises(LoungeError, match="No cluster named 'nope'"):
            Lounge.attach("nope")
    finally:
        cluster.stop_sync()
    from jupyter_lounge.manager import ClusterManager

    with pytest.raises(LoungeError, match="No cluster named 'dup' to stop"):
        ClusterManager().stop("dup")


def test_tensorflow_preloaded_runs_an_op_in_every_engine(kind):
    cluster = Lounge(3, engines=kind, preload="tensorflow", wait=True, timeout=180).start_sync()
    try:
        assert all("tensorflow" in m for m in run_everywhere(cluster, modules_seen))

        def tf_op():
            import os

            import tensorflow as tf

            return float(tf.reduce_sum(tf.ones((8, 8)))), os.environ["LOUNGE_RANK"]

        out = run_everywhere(cluster, tf_op)
        assert sorted(out) == [(64.0, "0"), (64.0, "1"), (64.0, "2")]

        def collector():
            import gc

            return gc.isenabled(), gc.get_threshold(), gc.get_freeze_count()

        # the agent imported with no full collection, froze what it made, and its engines
        # collect as any Python does
        for enabled, thresholds, frozen in run_everywhere(cluster, collector):
            assert enabled and thresholds == gc.get_threshold() and frozen > 100_000

        def draw():
            import numpy as np

            return float(np.random.random())

        assert len(set(run_everywhere(cluster, draw))) == 3  # reseeded after the fork
    finally:
        cluster.stop_sync()


def test_an_ipyparallel_engine_takes_what_its_agent_made_before_the_fork():
    """IPythonKernel lists every loaded module's file and IPython keeps their names: walks
    that, made in each forked engine, copied 23 MiB of the agent's pages into it (smaps). The
    agent lists them once before the fork, in objects of its own; the kernel holds what its
    walks would have found, from those lists, and the modules read the real sys again. The
    engine application too is initialized by the agent: each engine still has a session id
    of its own and signs as its own process (a message sent with the agent's pid is refused
    by ZMQ's fork check)."""
    cluster = Lounge(2, preload="json,decimal", wait=True).start_sync()
    try:

        def seen():
            import decimal
            import sys

            import ipykernel.ipkernel
            import IPython.core.shellapp
            from IPython import get_ipython

            shell = get_ipython()
            files, names = shell.kernel._kernel_modules, shell._sys_modules_keys
            return (
                decimal.__file__ in files,  # what the walk would find
                any(f is decimal.__file__ for f in files),  # ... but not the module's own
                {"decimal", "json", "ipykernel"} <= names and type(names) is set,
                ipykernel.ipkernel.sys is sys and IPython.core.shellapp.sys is sys,
            )

        def session():
            import os

            from ipyparallel.engine.app import IPEngine

            app = IPEngine.instance()
            # no Python woken at every ping of the controller's (the agent watches it)
            listens = app._hb_listener is not None or app.max_heartbeat_misses != 0
            return (
                app.lounge_initialized and not listens,
                app.session.pid == os.getpid(),
                app.session.session,
            )

        def shell():
            import builtins
            import os
            import sys

            from ipyparallel.engine.kernel import IPythonParallelKernel
            from IPython import get_ipython

            from jupyter_lounge.engines import ipyparallel

            shell = get_ipython()
            kernel = IPythonParallelKernel.instance()
            return (
                shell is ipyparallel._made.shell,  # made by the agent before the fork
                shell.kernel is kernel and shell.parent is kernel and kernel.shell is shell,
                shell.displayhook.pub_socket is kernel.iopub_socket,
                (builtins.__IPYTHON__, os.environ["PAGER"], sys.modules["__main__"].__name__),
            )

        assert run_everywhere(cluster, seen) == [(True, False, True, True)] * 2
        made = (True, True, True, (True, "cat", "__main__"))
        assert run_everywhere(cluster, shell) == [made] * 2
        # the shell at work: each engine's namespace, output and results are its own
        code = "import os; x = os.getpid(); print(x); x"
        ar = cluster.client[:].execute(code, silent=False, block=True)
        xs = cluster.client[:].pull("x", block=True)
        assert len(set(xs)) == 2 and ar.stdout == [f"{x}\n" for x in xs], (xs, ar.stdout)
        assert [r["data"]["text/plain"] for r in ar.execute_result] == [str(x) for x in xs]
        made = run_everywhere(cluster, session)
        assert [m[:2] for m in made] == [(True, True)] * 2, made
        assert len({m[2] for m in made}) == 2, made  # a session id each
    finally:
        cluster.stop_sync()


def test_controller_lost_takes_engines_down(kind, pids_of):
    from jupyter_lounge.procs import alive

    cluster = Lounge(2, engines=kind, wait=True).start_sync()
    try:
        engines = pids_of(cluster)
        assert len(engines) == 2 and all(e["registered"] for e in cluster.engines())
        os.killpg(cluster.controller_pid, signal.SIGKILL)
        agent = cluster.agents[0]
        wait_until(lambda: not alive(agent["pid"]), 20, "the agent to notice its controller left")
        report = state.read_json(agent["files"]["report"])
        assert report["status"] == "controller-lost"
        assert not any(alive(p) for p in engines)
    finally:
        cluster.stop_sync()


def test_private_and_signed_by_default(kind):
    """A local cluster talks over Unix sockets in a folder only its user can enter (no
    port), and ipyparallel still signs every message; the folder is gone after stop."""
    cluster = Lounge(2, engines=kind, wait=True).start_sync()
    try:
        assert list(cluster.map(lambda x: -x, [1, 2], progress=False).result) == [-1, -2]
        engine_file = cluster.kind.connection_files(cluster.dir)[0]
        assert oct(engine_file.stat().st_mode & 0o777) == "0o600"
        folder = cluster.socket_dir
        assert oct(os.stat(folder).st_mode & 0o777) == "0o700"
        if kind == "dask":
            assert cluster.client.scheduler.address == f"unix://{folder}/scheduler"
            assert all(
                addr.startswith(f"unix://{folder}/") for addr in cluster.client.run(os.getpid)
            )
        else:  # ipc://, each message signed
            info = state.read_json(engine_file)
            assert info["interface"] == f"ipc://{folder}/e" and len(info.get("key", "")) == 64
            assert not info.get("curve_serverkey")
    finally:
        cluster.stop_sync()
    assert not os.path.exists(folder)


def test_a_local_cluster_without_unix_sockets_is_encrypted(kind, monkeypatch):
    """Where Python has no Unix sockets (Windows), a local cluster is on loopback TCP,
    encrypted as a cluster across machines is: Dask with the cluster's own CA (a client
    without a certificate is refused), ipyparallel with CurveZMQ and signed messages."""
    from jupyter_lounge.engines import unix_comm

    monkeypatch.setattr(unix_comm, "available", lambda: False)
    cluster = Lounge(2, engines=kind, wait=True).start_sync()
    try:
        assert cluster.socket_dir is None
        assert list(cluster.map(lambda x: -x, [1, 2], progress=False).result) == [-1, -2]
        if kind == "dask":
            from distributed import Client

            assert cluster.client.scheduler.address.startswith("tls://127.0.0.1:")
            with pytest.raises((OSError, TimeoutError)):  # no certificate: refused
                Client(
                    cluster.client.scheduler.address.replace("tls://", "tcp://"),
                    timeout=3,
                    set_as_default=False,
                )
        else:
            info = state.read_json(cluster.kind.connection_files(cluster.dir)[0])
            assert info["interface"] == "tcp://127.0.0.1"
            assert info.get("curve_serverkey") and len(info.get("key", "")) == 64
    finally:
        cluster.stop_sync()


def test_an_ipyparallel_engine_that_stops_answering_is_dropped_by_the_heartbeat():
    """An engine frozen (alive to its agent, silent to the controller) is unregistered once
    it has missed 20 beats of the controller's heart monitor (150 ms here), while the others,
    answering every beat, stay registered and run what they are sent."""
    cluster = Lounge(3, wait=True).start_sync()
    try:
        rc = cluster.client
        rows = sorted(cluster.engines(), key=lambda r: r["rank"])
        frozen, others = rows[0], rows[1:]
        time.sleep(1.5)  # ten beats: every engine answered them
        assert sorted(rc.ids) == [0, 1, 2]
        os.kill(frozen["pid"], signal.SIGSTOP)
        try:
            wait_until(lambda: 0 not in rc.ids, 30, "the controller to drop the frozen engine")
            assert sorted(rc.ids) == [1, 2]
            assert sorted(rc[:].apply_sync(os.getpid)) == sorted(r["pid"] for r in others)
        finally:
            os.kill(frozen["pid"], signal.SIGCONT)
    finally:
        cluster.stop_sync()


def test_engines_report_per_engine_state(pids_of):
    cluster = Lounge(3, nodes=2, wait=True).start_sync()
    try:
        rows = cluster.engines()
        assert [r["rank"] for r in sorted(rows, key=lambda r: r["rank"])] == [0, 1, 2]
        assert all(r["state"] == "running" and r["registered"] and r["restarts"] == 0 for r in rows)
        assert sorted(r["pid"] for r in rows) == sorted(pids_of(cluster))
    finally:
        cluster.stop_sync()


@pytest.mark.parametrize(
    "source, expected",
    [
        (
            "import threading, time\n"
            "threading.Thread(target=time.sleep, args=(60,), name='sneaky', daemon=True).start()\n",
            "threads ['sneaky'] are running",
        ),
        ("import zmq\nctx = zmq.Context()\n", "a ZMQ context exists"),
    ],
)
def test_preload_that_is_unsafe_to_fork_fails_loudly(
    tmp_path, monkeypatch, lounge_dir, source, expected
):
    (tmp_path / "unsafe_mod.py").write_text(source)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    cluster = Lounge(2, preload="unsafe_mod")
    with pytest.raises(LoungeError) as info:
        cluster.start_sync()
    assert expected in str(info.value) and "--preload" in str(info.value)
    assert processes_under(str(lounge_dir)) == []


def test_async_api_in_a_running_loop():
    import asyncio

    async def main():
        cluster = await Lounge(1, engines="dask").start()
        try:
            await cluster.scale(2)
            await cluster.wait_for_engines(2, timeout=60)
            return len(cluster.registered())
        finally:
            await cluster.stop()

    assert asyncio.run(main()) == 2


@pytest.mark.parametrize("received_by", ["the process", "another thread"])
def test_interrupted_start_cleans_up(lounge_dir, received_by):
    """A Ctrl-C during a start stops it and what it started, whichever thread of the
    process the signal reaches (Linux gives a process's signal to any of its threads)."""
    cluster = Lounge(2, preload="tensorflow", wait=True)
    ended = threading.Event()  # the other thread's end
    if received_by == "the process":
        interrupt = (os.kill, (os.getpid(), signal.SIGINT))
    else:
        other = threading.Thread(target=ended.wait, args=(30,), daemon=True)
        other.start()
        interrupt = (signal.pthread_kill, (other.ident, signal.SIGINT))
    # Ctrl-C raises KeyboardInterrupt, as in a Python in the foreground or a kernel (a Python
    # started in the background by a shell without job control inherits SIGINT ignored)
    stock = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(1.5, *interrupt)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            cluster.start_sync()
    finally:
        timer.join()
        ended.set()
        signal.signal(signal.SIGINT, stock)
    assert cluster.status == "stopped"
    assert state.list_states() == []
    assert processes_under(str(lounge_dir)) == []


def test_each_engine_gets_its_own_gpu_and_identity():
    # This machine has no GPU: name two, so the pinning the agent does is visible in the
    # engines' environment (the GPU library reads it when first used, after the fork).
    cluster = Lounge(5, gpus=["0", "1"], engines_per_gpu=2, wait=True)
    cluster.start_sync()
    try:

        def identity():
            import os

            return (
                int(os.environ["LOUNGE_RANK"]),
                os.environ["LOUNGE_SIZE"],
                os.environ["LOUNGE_NODE"],
                os.environ["CUDA_VISIBLE_DEVICES"],
                os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH"),  # a shared GPU: memory growth
            )

        got = sorted(run_everywhere(cluster, identity))
        node = cluster.backend.plan(5, 1)[0][0]
        assert got == [
            (0, "5", node, "0", "true"),
            (1, "5", node, "1", "true"),
            (2, "5", node, "0", "true"),
            (3, "5", node, "1", "true"),
            (4, "5", node, "", None),
        ]
    finally:
        cluster.stop_sync()


def test_stop_after_a_failed_start_and_twice_is_harmless(lounge_dir):
    cluster = Lounge(1, preload="no_such_module_abc")
    with pytest.raises(LoungeError):
        cluster.start_sync()
    cluster.stop_sync()
    cluster.stop_sync()
    assert cluster.status == "stopped" and state.list_states() == []


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_256_engines_on_one_machine_start_map_and_stop_with_nothing_left(kind, lounge_dir, pids_of):
    """The scale a lounge PC or a big node reaches: one agent forks 256 engines (file
    descriptors raised where needed), all register, a map uses them, stop leaves nothing."""
    cluster = Lounge(256, engines=kind, wait=True, timeout=600).start_sync()
    try:
        pids = pids_of(cluster)
        assert len(set(pids)) == 256 and len(cluster.registered()) == 256
        assert sorted(run_everywhere(cluster, os.getpid)) == sorted(pids)

        def slow(x):
            import os
            import time

            time.sleep(0.05)
            return x * 3, os.getpid()

        df = cluster.map(slow, range(2048), progress=False, timeout=300)
        assert df.error.isna().all(), df.error.dropna().tolist()[:3]
        assert [r[0] for r in df.result] == [x * 3 for x in range(2048)]
        assert len({r[1] for r in df.result}) > 128  # spread over the engines, not a few
    finally:
        cluster.stop_sync()
    assert state.list_states() == [] and processes_under(str(lounge_dir)) == []


_LAST_WORDS = """
import os, sys, types, zmq
from jupyter_lounge.engines.ipyparallel import _let_last_words_out
ctx = zmq.Context.instance()
sock = ctx.socket(zmq.DEALER)
sock.connect(sys.argv[1])
for i in range(8):
    sock.send(bytes([i]) * (8 << 20))
if sys.argv[2] == "flush":
    _let_last_words_out(types.SimpleNamespace(context=ctx))
os._exit(0)
"""


@pytest.mark.fast
def test_an_engine_asked_to_end_hands_its_last_words_out_before_it_exits():
    """An engine ends with os._exit, which ends ZMQ's I/O thread with whatever is still
    queued there: a shutdown reply was lost that way, and the client waited for ever. The
    engine first closes its context with a linger: all 64 MiB it queued just before its exit
    reach the peer (without that, about half did here)."""
    import zmq

    ctx = zmq.Context()
    peer = ctx.socket(zmq.ROUTER)
    port = peer.bind_to_random_port("tcp://127.0.0.1")
    try:
        out = subprocess.run(
            [sys.executable, "-c", _LAST_WORDS, f"tcp://127.0.0.1:{port}", "flush"],
            capture_output=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr.decode()
        got = 0
        while peer.poll(500):
            got += len(peer.recv_multipart()[1])
        assert got == 8 * (8 << 20), got
    finally:
        peer.close(linger=0)
        ctx.term()


@pytest.mark.fast
def test_the_nanny_gives_an_engine_its_relay_only_once_the_controller_can_reach_it(tmp_path):
    """A node's nanny relays each engine's control channel. It answers the engine's attach
    request once the relay's connection to the controller is up: the controller can route a
    message to the engine from that moment (before, a client's first shutdown or signal to
    a new engine was dropped). A controller that cannot be reached, or that does not take the
    keys, gets the engine a sentence instead, within the engine's own wait."""
    import json as _json

    import zmq

    from jupyter_lounge.engines import ipp_nanny

    node_keys, controller_keys, stranger_keys = (zmq.curve_keypair() for _ in range(3))
    connection = {
        "key": "k" * 32,
        "signature_scheme": "hmac-sha256",
        "interface": "tcp://127.0.0.1",
        "registration": 1,  # never reached here: the nanny only connects to it
        "curve_serverkey": controller_keys[0].decode(),
    }
    session = ipp_nanny.session_for(connection)
    engine = subprocess.Popen(["sleep", "60"])  # a child of this process, as an engine is
    ready_r, ready_w = os.pipe()
    nanny = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import json, os, sys; from jupyter_lounge.engines import ipp_nanny; "
            "c, k = json.loads(sys.argv[1]), [x.encode() for x in sys.argv[2:4]]; "
            "ipp_nanny.serve(c, tuple(k), os.getppid(), int(sys.argv[4]))",
            _json.dumps(connection),
            node_keys[0].decode(),
            node_keys[1].decode(),
            str(ready_w),
        ],
        pass_fds=[ready_w],
    )
    os.close(ready_w)
    ctx = zmq.Context()
    try:
        with os.fdopen(ready_r, "rb") as ready:
            assert select.select([ready], [], [], 60)[0], "the nanny did not say it was ready"
            nanny_url = _json.loads(ready.readline())["nanny_url"]

        def attach(control_url: str) -> dict:
            sock = ctx.socket(zmq.DEALER)
            sock.linger = 0
            sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = (
                node_keys[0],
                *node_keys,
            )
            sock.connect(nanny_url)
            content = {"pid": engine.pid, "id": 7, "ident": "e-7", "control_url": control_url}
            session.send(sock, ipp_nanny.ATTACH, content)
            assert sock.poll(ipp_nanny.ATTACH_WAIT_S * 1000), "the nanny did not answer"
            reply = session.deserialize(session.feed_identities(sock.recv_multipart())[1])
            sock.close()
            return reply["content"]

        def controller(keys) -> tuple:
            sock = ctx.socket(zmq.ROUTER)
            sock.linger = 0
            sock.curve_server, sock.curve_secretkey = True, keys[1]
            sock.router_mandatory = True  # an unroutable message raises instead of vanishing
            return sock, sock.bind_to_random_port("tcp://127.0.0.1")

        control, port = controller(controller_keys)
        reply = attach(f"tcp://127.0.0.1:{port}")
        # routable at once (router_mandatory raises where the relay is not connected yet)
        session.send(control, "shutdown_request", {"restart": False}, ident=b"e-7")
        relay = ctx.socket(zmq.ROUTER)
        relay.linger = 0
        relay.curve_serverkey, relay.curve_publickey, relay.curve_secretkey = (
            node_keys[0],
            *node_keys,
        )
        relay.connect(reply["url"])
        assert relay.poll(10_000), "the relay passed nothing on"
        passed = session.deserialize(session.feed_identities(relay.recv_multipart())[1])
        assert passed["header"]["msg_type"] == "shutdown_request"

        import socket

        with socket.socket() as probe:  # a port where nothing listens
            probe.bind(("127.0.0.1", 0))
            nobody = probe.getsockname()[1]
        unreached = attach(f"tcp://127.0.0.1:{nobody}")
        assert unreached == {
            "error": f"the controller at tcp://127.0.0.1:{nobody} did not complete a "
            f"connection within {ipp_nanny.HANDSHAKE_WAIT_S:g} s: check that this node "
            "reaches that address and port (a firewall between them, or an address this node "
            "has no route to)"
        }
        _, stranger_port = controller(stranger_keys)  # not the key the node was given
        refused = attach(f"tcp://127.0.0.1:{stranger_port}")
        assert refused == {
            "error": f"the handshake with the controller at tcp://127.0.0.1:{stranger_port} "
            "failed (its keys or its protocol are not this node's): stop the cluster and "
            "start it again, so that its nodes get its keys"
        }
    finally:
        nanny.kill()
        engine.kill()
        nanny.wait()
        engine.wait()
        ctx.destroy(linger=0)
