"""One real controller, thousands of simulated engines: registration rate, steady controller
CPU and one round trip to all engines, for both engine kinds (issue 17, part 3).

The controller is real and started as a cluster starts it: the command of the engine kind's
``controller_command`` (ipyparallel: ``ipyparallel.controller`` by way of
``engines/ipp_controller.py``, with CurveZMQ, a signed
session key in its profile, ``--ip=127.0.0.1``, the heartbeat a cluster of that size has
(``cluster.heartbeat_for``: 150 ms up to 256 engines, then longer); Dask: our
``dask_scheduler`` with mutual TLS from its own CA), through ``procs.spawn``. A real stock
client of each kind measures what it sees. The engines are simulated, many per process
(``--per-process``, default 512) on one event loop, each with its own sockets and identity:

* ipyparallel: each engine sends the real ``registration_request`` (signed, CurveZMQ with its
  node's key pair, as lounge engines share one per node) on a DEALER of its own, then opens
  what a real engine opens: a shell ROUTER connected to mux, task and its broadcast leaf, a
  control ROUTER, an iopub PUB and its heart (a SUB on the pings, a DEALER with the engine's
  identity for the pongs); it echoes every ping, as ``Heart`` does, so the hub finishes the
  registration and keeps it. On shell it answers ``apply_request`` as the kernel does: unpacks
  the function, calls it, sends a signed ``apply_reply`` with the serialized result and the
  kernel's metadata, between busy/idle status on iopub. It answers nothing on control (no
  abort, shutdown or signal), executes no code cells, has no nanny, and never unregisters.
  That is 8 TCP connections to the controller per engine, as a real one has. Registered: the
  client's ``ids`` (the hub counts an engine once its heart monitor has seen a pong, at its
  next beat). Round trip: ``rc[:].apply_async(f)`` to all engines, through the mux.
* Dask: each worker listens on its own TLS address and sends the real ``register-worker`` op
  (its certificate from the cluster's CA, the real versions, metrics of an idle worker),
  keeps that comm as its batched stream (drains it; a keep-alive each 60 s), and sends
  ``heartbeat_worker`` on a second comm at the interval the scheduler asks for. Its listener
  answers the ``run`` op as ``distributed.worker.run`` does (unpickles the function, calls
  it, replies with the result); nothing else: no tasks, no data, no nanny, no HTTP server.
  Registered: the workers' OK replies. Round trip: ``client.run(f)``, which the scheduler
  broadcasts to every worker's address.

Registration rate: engines / seconds from the moment all simulators are told to start to
the moment the last one is registered. Steady CPU: user+system seconds of the controller and
its child processes over ``--cpu-seconds`` (psutil), once all are registered and a few
seconds have passed, as % of one core (the simulators' own is reported beside it). Round
trip: the median of ``--repeat``. Simulators and controller share this machine's cores, so
the rate and the round trip are what the controller reaches with its engines competing for
the same cores (a lower bound for it alone). The soft file-descriptor limit is
raised to the hard one here and in every simulator (the controller inherits it). A size
that is not reached is recorded with what was reached and ``limit``, the reason.

    python bench/controller_scale.py [--sizes 256,1024,4096] [--kinds ipyparallel,dask]
                                     [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _common import markdown_table, with_timeout

ROOT = Path(__file__).resolve().parent.parent
STALL = 60.0  # seconds without one more registration that end the wait


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def _one():
    return 1


# -- the simulated engines ---------------------------------------------------------------------
def _say(*words) -> None:
    print(*words, flush=True)


def simulate_ipyparallel(conn_file: str, proc: int, count: int) -> None:
    import selectors

    import zmq
    from ipyparallel import util
    from ipyparallel.serialize import serialize_object, unpack_apply_message
    from jupyter_client.session import Session

    from jupyter_lounge.engines.base import engine_ident

    info = json.loads(Path(conn_file).read_text())
    util._disable_session_extract_dates()
    session = Session(
        key=info["key"].encode(),
        signature_scheme=info["signature_scheme"],
        packer=info["pack"],
        unpacker=info["unpack"],
    )
    ctx = zmq.Context(io_threads=1)
    ctx.MAX_SOCKETS = 1 << 17
    server = info.get("curve_serverkey", "").encode()
    public, secret = zmq.curve_keypair()  # one pair per node, as a lounge node's engines
    sel = selectors.DefaultSelector()
    counts = {"registered": 0, "failed": 0, "applied": 0}

    def socket(kind: int, port: int, ident: bytes | None = None):
        s = ctx.socket(kind)
        s.linger = 0
        if server:
            s.curve_serverkey, s.curve_publickey, s.curve_secretkey = server, public, secret
        if ident:
            s.identity = ident
        if kind == zmq.SUB:
            s.subscribe(b"")
        s.connect(f"{info['interface']}:{port}")
        return s

    def watch(s, handler) -> None:
        sel.register(s.FD, selectors.EVENT_READ, (s, handler))
        drain(s, handler)  # what came before the registration of its fd

    def drain(s, handler) -> None:
        while True:  # the fd only signals a change: read until there is nothing
            try:
                frames = s.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            handler(frames)

    class Engine:
        def __init__(self, rank: int):
            self.ident = engine_ident(f"sim{proc}", rank, os.urandom(4).hex())
            self.bident = self.ident.encode()
            self.reg = socket(zmq.DEALER, info["registration"], self.bident)
            watch(self.reg, self.registered)
            session.send(self.reg, "registration_request", content={"uuid": self.ident})

        def registered(self, frames) -> None:
            msg = session.deserialize(session.feed_identities(frames)[1])
            sel.unregister(self.reg.FD)  # the registrar stays open, as an engine's does
            if msg["content"].get("status") != "ok":
                counts["failed"] += 1
                return
            self.id = msg["content"]["id"]
            leaves = info["broadcast"]
            self.shell = socket(zmq.ROUTER, info["mux"], self.bident)
            for port in (info["task"], leaves[self.id % len(leaves)]):
                self.shell.connect(f"{info['interface']}:{port}")
            self.control = socket(zmq.ROUTER, info["control"], self.bident)
            self.iopub = socket(zmq.PUB, info["iopub"])
            self.pong = socket(zmq.DEALER, info["hb_pong"], self.bident)
            self.ping = socket(zmq.SUB, info["hb_ping"])
            watch(self.ping, self.pong.send_multipart)  # the heart: echo each ping
            watch(self.shell, self.request)
            counts["registered"] += 1

        def request(self, frames) -> None:
            idents, rest = session.feed_identities(frames)
            msg = session.deserialize(rest)
            if msg["header"]["msg_type"] != "apply_request":
                return
            pmd = msg.get("metadata") or {}
            md = {
                "started": util.utcnow(),
                "dependencies_met": True,
                "engine": self.ident,
                "is_broadcast": pmd.get("is_broadcast", False),
                "is_coalescing": pmd.get("is_coalescing", False),
                "original_msg_id": pmd.get("original_msg_id", ""),
                "label": pmd.get("label"),
            }
            topic = f"engine.{self.id}.status".encode()
            session.send(self.iopub, "status", {"execution_state": "busy"}, msg, ident=topic)
            try:
                f, args, kwargs = unpack_apply_message(msg["buffers"], {}, copy=False)
                content, bufs = {"status": "ok"}, serialize_object(f(*args, **kwargs))
            except Exception as e:  # noqa: BLE001 - reported to the client, as an engine does
                content, bufs = {"status": "error", "ename": type(e).__name__}, []
                content.update(evalue=str(e), traceback=[])
            md["status"] = content["status"]
            session.send(self.shell, "apply_reply", content, msg, idents, buffers=bufs, metadata=md)
            session.send(self.iopub, "status", {"execution_state": "idle"}, msg, ident=topic)
            counts["applied"] += 1

    sel.register(sys.stdin.fileno(), selectors.EVENT_READ, None)
    engines, said, stop = [], None, False
    _say("ready")
    while not stop:
        for key, _ in sel.select(0.5):
            if key.data is None:
                line = sys.stdin.readline().strip()
                if line == "go":
                    engines = [Engine(proc * 1_000_000 + i) for i in range(count)]
                stop = line in ("stop", "")
            else:
                drain(*key.data)
        now = (counts["registered"], counts["failed"], counts["applied"])
        if now != said:
            _say("registered", *now)
            said = now
    ctx.destroy(linger=0)
    del engines


async def simulate_dask(address: str, tls_dir: str, proc: int, count: int) -> None:
    import pickle
    import uuid

    from distributed.comm import CommClosedError, connect, listen
    from distributed.core import send_recv
    from distributed.protocol import to_serialize
    from distributed.versions import get_versions

    from jupyter_lounge.engines.base import engine_name
    from jupyter_lounge.engines.dask import security

    sec = security(tls_dir, "worker")
    connect_args = sec.get_connection_args("worker") if sec else {}
    listen_args = sec.get_listen_args("worker") if sec else {}
    versions = get_versions()
    metrics = {  # an idle worker's, with the keys the scheduler reads
        "task_counts": {},
        "bandwidth": {"total": 100e6, "workers": {}, "types": {}},
        "digests_total_since_heartbeat": {},
        "managed_bytes": 0,
        "spilled_bytes": {"memory": 0, "disk": 0},
        "transfer": dict.fromkeys(
            ["incoming_bytes", "incoming_count", "incoming_count_total", "outgoing_bytes"]
            + ["outgoing_count", "outgoing_count_total"],
            0,
        ),
        "event_loop_interval": 0.02,
        "cpu": 0.0,
        "memory": 60_000_000,
        "time": time.time(),
        "host_net_io": {"read_bps": 0.0, "write_bps": 0.0},
        "host_disk_io": {"read_bps": 0.0, "write_bps": 0.0},
        "num_fds": 30,
    }
    counts = {"registered": 0, "failed": 0, "applied": 0}
    tasks: set = set()

    def spawn(coro) -> None:
        task = asyncio.ensure_future(coro)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def serve(comm) -> None:  # a worker's listener: the ``run`` op only
        try:
            while True:
                msg = await comm.read()
                op, close = msg.pop("op", None), msg.pop("close", False)
                reply, serializers = msg.pop("reply", True), msg.pop("serializers", None)
                if op == "run":
                    try:
                        args = pickle.loads(msg["args"]) if msg.get("args") else ()
                        kwargs = pickle.loads(msg["kwargs"]) if msg.get("kwargs") else {}
                        value = pickle.loads(msg["function"])(*args, **kwargs)
                        result = {"status": "OK", "result": to_serialize(value)}
                    except Exception as e:  # noqa: BLE001 - the caller sees it
                        result = {"status": "error", "exception": repr(e)}
                    counts["applied"] += 1
                else:
                    result = {"status": "error", "message": f"simulated worker: no {op!r}"}
                if reply:
                    await comm.write(result, serializers=serializers)
                if close or op == "close":
                    break
        except (CommClosedError, OSError):
            pass
        finally:
            comm.abort()

    async def worker(rank: int, listener) -> None:
        me = listener.contact_address
        comm = await connect(address, **connect_args)
        await comm.write(
            {
                "op": "register-worker",
                "reply": False,
                "address": me,
                "status": "running",
                "nthreads": 1,
                "name": engine_name(f"sim{proc}", rank),
                "now": time.time(),
                "resources": {},
                "memory_limit": 0,
                "local_directory": tempfile.gettempdir(),
                "services": {},
                "nanny": None,
                "pid": os.getpid(),
                "versions": versions,
                "metrics": metrics,
                "extra": {},
                "stimulus_id": f"worker-connect-{time.time()}",
                "server_id": f"Worker-{uuid.uuid4()}",
            },
            serializers=["msgpack"],
        )
        answer = await comm.read(deserializers=["msgpack"])
        if answer.get("status") != "OK":
            counts["failed"] += 1
            return
        counts["registered"] += 1
        spawn(_batched(comm))
        beat = await connect(address, **connect_args)
        interval, alive = answer["heartbeat-interval"], time.monotonic()
        await asyncio.sleep(interval * (rank % 97) / 97)  # spread, as start times would
        while True:
            answer = await send_recv(
                beat,
                op="heartbeat_worker",
                address=me,
                now=time.time(),
                metrics=metrics,
                executing={},
                extensions={},
            )
            if answer["status"] != "OK":
                counts["failed"] += 1
                return
            interval = answer["heartbeat-interval"]
            if time.monotonic() - alive > 60:
                await comm.write([{"op": "keep-alive"}])
                alive = time.monotonic()
            await asyncio.sleep(interval)

    async def _batched(comm) -> None:  # what the scheduler sends a worker: read and dropped
        try:
            while True:
                await comm.read()
        except (CommClosedError, OSError):
            pass

    async def start(rank: int, listener) -> None:
        try:
            await worker(rank, listener)
        except (CommClosedError, OSError) as e:
            counts["failed"] += 1
            _say("error", f"{type(e).__name__}: {e}"[:300])

    listeners = []
    for _ in range(count):
        listener = listen("tls://127.0.0.1:0" if sec else "tcp://127.0.0.1:0", serve, **listen_args)
        await listener.start()
        listeners.append(listener)
    loop, lines = asyncio.get_running_loop(), asyncio.Queue()
    loop.add_reader(0, lambda: lines.put_nowait(sys.stdin.readline().strip()))
    said = None
    _say("ready")
    while True:
        try:
            line = await asyncio.wait_for(lines.get(), 0.5)
        except asyncio.TimeoutError:
            line = None
        if line == "go":
            for i, listener in enumerate(listeners):
                spawn(start(proc * 1_000_000 + i, listener))
        elif line is not None and line != "go":
            break  # "stop" or the end of stdin
        now = (counts["registered"], counts["failed"], counts["applied"])
        if now != said:
            _say("registered", *now)
            said = now
    for listener in listeners:
        listener.stop()
    os._exit(0)  # the comms need no goodbye: the bench stops the scheduler next


class Simulator:
    """One simulator process and what it last said (read by a thread of its own)."""

    def __init__(self, kind: str, target: str, tls_dir: str, proc: int, count: int):
        cmd = [sys.executable, __file__, "--simulate", kind, target, tls_dir, str(proc), str(count)]
        env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,  # Ctrl-C reaches the bench, which stops them in order
        )
        self.ready = False  # imports done, listeners open: "go" times registration alone
        self.registered = self.failed = self.applied = 0
        self.errors: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            word, *rest = line.strip().split(" ", 1)
            if word == "ready":
                self.ready = True
            elif word == "registered":
                self.registered, self.failed, self.applied = map(int, rest[0].split())
            elif word == "error" and len(self.errors) < 5:
                self.errors.append(rest[0].strip())

    def tell(self, word: str) -> None:
        try:
            self.proc.stdin.write(word + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def stop(self) -> None:
        self.tell("stop")
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


# -- the bench -----------------------------------------------------------------------------------
class Run:
    """One real controller of ``kind`` in a private folder, a stock client, the simulators."""

    def __init__(self, kind: str, n: int, per_process: int, heartbeat_ms: int):
        from jupyter_lounge.engines import engine_kind

        self.kind, self.n = kind, n
        self.engines = engine_kind(kind)
        self.dir = Path(tempfile.mkdtemp(prefix=f"controller-scale-{kind}-"))
        self.per_process, self.heartbeat_ms = per_process, heartbeat_ms
        self.controller = self.client = None
        self.sims: list[Simulator] = []

    def start(self) -> None:
        from jupyter_lounge.procs import spawn
        from jupyter_lounge.protocol import read_json

        cmd = self.engines.controller_command(
            self.dir, "127.0.0.1", {"heartbeat_ms": self.heartbeat_ms, "tls": True}
        )
        self.controller = spawn(cmd, self.dir / "controller.log")
        files = self.engines.connection_files(self.dir)
        self.wait(lambda: all(read_json(f) for f in files), 60, "the connection files")
        self.client = self.engines.connect(self.dir, 30)
        first = files[0]
        target = str(first) if self.kind == "ipyparallel" else read_json(first)["address"]
        sizes = [self.per_process] * (self.n // self.per_process)
        if self.n % self.per_process:
            sizes.append(self.n % self.per_process)
        self.sims = [Simulator(self.kind, target, str(self.dir), p, k) for p, k in enumerate(sizes)]
        self.wait(lambda: all(s.ready for s in self.sims), 120, "the simulators to be ready")

    def wait(self, done, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            self.check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {timeout:g} s for {what}")
            time.sleep(0.05)

    def check(self) -> None:
        if self.controller.poll() is not None:
            raise RuntimeError(
                f"the controller exited ({self.controller.returncode}): {self.log()}"
            )
        for s in self.sims:
            if s.proc.poll() is not None:
                raise RuntimeError(f"a simulator exited ({s.proc.returncode}): {s.errors}")

    def log(self) -> str:
        """What the controller's log says about engines it lost, and its last line."""
        text = (self.dir / "controller.log").read_text(errors="replace")
        signs = {
            "purged stalled registrations": "purging stalled registration",
            "hearts stopped": "hearts stopped",
            "late pongs": "missed a beat",
            "removed workers": "Remove worker",
        }
        counts = [f"{text.count(s)} {what}" for what, s in signs.items() if s in text]
        last = text.strip().splitlines()[-1:] or ["(empty)"]
        return f"{', '.join(counts) or 'no lost engine in it'}; last line: {last[0][-200:]}"

    def registered(self) -> int:
        if self.kind == "ipyparallel":
            return len(self.client.ids)
        return sum(s.registered for s in self.sims)

    def cpu_used(self) -> dict[str, float]:
        """CPU seconds (user + system) used so far by the controller's first process (the
        ipyparallel hub; the Dask scheduler), by its child processes (ipyparallel's
        schedulers and heart monitor), and by the simulators."""
        import psutil

        def used(procs) -> float:
            total = 0.0
            for p in procs:
                try:
                    t = p.cpu_times()
                    total += t.user + t.system
                except psutil.NoSuchProcess:
                    pass
            return total

        try:
            root = psutil.Process(self.controller.pid)
            children = root.children(recursive=True)
        except psutil.NoSuchProcess:
            root, children = None, []
        sims = []
        for s in self.sims:
            try:
                sims.append(psutil.Process(s.proc.pid))
            except psutil.NoSuchProcess:
                pass
        return {
            "controller": used([root] if root else []),
            "children": used(children),
            "simulators": used(sims),
            **{f"child {c.pid}": used([c]) for c in children},
        }

    def register(self, timeout: float) -> dict:
        """Tell every simulator to start; engines/s until all are registered, or the limit;
        and the CPU each part used meanwhile, per engine registered, with how busy the
        machine's cores were (what bounds the rate on this machine)."""
        before = self.cpu_used()
        for s in self.sims:
            s.tell("go")
        t0 = last_t = time.monotonic()
        last = 0
        limit = None
        while (now := self.registered()) < self.n:
            t = time.monotonic()
            if now > last:
                last, last_t = now, t
            failed = sum(s.failed for s in self.sims)
            if failed:
                errors = [e for s in self.sims for e in s.errors][:2]
                limit = f"{failed} registrations failed: {errors or self.log()}"
            elif t - last_t > STALL:
                limit = f"no registration for {STALL:g} s; controller log: {self.log()}"
            elif t - t0 > timeout:
                limit = f"{timeout:g} s timeout; controller log: {self.log()}"
            if limit:
                break
            self.check()
            time.sleep(0.02)
        else:
            last, last_t = now, time.monotonic()
        rec = {"engines": last, "register_per_s": round(last / max(last_t - t0, 1e-9), 1)}
        after, wall = self.cpu_used(), time.monotonic() - t0
        spent = {part: after[part] - before.get(part, 0.0) for part in after}
        busiest = max((v for k, v in spent.items() if k.startswith("child ")), default=0.0)
        spent = {k: v for k, v in spent.items() if not k.startswith("child ")}
        # the busiest child, one process: what bounds it on a machine of its own
        for part, seconds in (*spent.items(), ("busiest_child", busiest)):
            rec[f"flood_{part}_cpu_ms_per_engine"] = round(1000 * seconds / max(last, 1), 2)
        rec["flood_cores_busy_percent"] = round(
            100 * sum(spent.values()) / (wall * (os.cpu_count() or 1)), 1
        )
        if limit:
            rec["limit"] = limit
        return rec

    def cpu(self, seconds: float) -> dict:
        """% of one core used by the controller (and its children), and by the simulators."""
        import psutil

        t0, c0 = time.monotonic(), self.cpu_used()
        time.sleep(seconds)
        wall, c1 = time.monotonic() - t0, self.cpu_used()
        ctrl = sum(c1[p] - c0[p] for p in ("controller", "children"))
        sims = c1["simulators"] - c0["simulators"]
        fds = sum(
            p.num_fds()
            for p in [psutil.Process(self.controller.pid)]
            + psutil.Process(self.controller.pid).children(recursive=True)
        )
        return {
            "steady_cpu_percent": round(100 * ctrl / wall, 1),
            "simulators_cpu_percent": round(100 * sims / wall, 1),
            "controller_fds": fds,
        }

    def roundtrip(self, repeat: int) -> dict:
        """Seconds for one call of a tiny function on every engine, answers checked."""
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            if self.kind == "ipyparallel":
                values = self.client[:].apply_async(_one).get(timeout=300)
            else:
                values = list(with_timeout(lambda: self.client.run(_one), 300).values())
            times.append(time.perf_counter() - t0)
            if values != [1] * len(values) or len(values) < self.registered():
                raise RuntimeError(f"round trip: {len(values)} answers, not all 1")
        return {"roundtrip_s": round(sorted(times)[len(times) // 2], 3), "roundtrips_s": times}

    def stop(self) -> list[str]:
        """Stop everything this run started; what is left over (nothing, normally)."""
        import psutil

        if self.client is not None:
            try:
                self.engines.close(self.client)
            except Exception:  # noqa: BLE001 - the processes go next anyway
                pass
        for s in self.sims:
            s.stop()
        pids = [s.proc.pid for s in self.sims]
        if self.controller is not None:
            try:
                pids += [c.pid for c in psutil.Process(self.controller.pid).children(True)]
            except psutil.NoSuchProcess:
                pass
            pids.append(self.controller.pid)
            for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
                try:
                    os.killpg(self.controller.pid, sig)  # its own session: the whole group
                    self.controller.wait(wait)
                    break
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    pass
        time.sleep(0.5)
        left = []
        for pid in pids:
            try:
                p = psutil.Process(pid)
                if p.status() != psutil.STATUS_ZOMBIE:
                    p.kill()
                    left.append(f"{pid} {' '.join(p.cmdline())[:80]}")
            except psutil.NoSuchProcess:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)
        return left


def measure(kind: str, n: int, args) -> dict:
    rec: dict = {"kind": kind, "engines": 0, "requested": n, "register_per_s": None}
    rec.update(steady_cpu_percent=None, roundtrip_s=None)
    from jupyter_lounge.cluster import heartbeat_for

    heartbeat = heartbeat_for(n) if args.heartbeat_ms == "auto" else int(args.heartbeat_ms)
    if kind == "ipyparallel":
        rec["heartbeat_ms"] = heartbeat
    run = Run(kind, n, args.per_process, heartbeat)
    try:
        run.start()
        rec.update(run.register(args.timeout))
        if kind == "dask":  # what the scheduler asks of its workers at this size
            from distributed.scheduler import heartbeat_interval

            rec["heartbeat_s"] = heartbeat_interval(rec["engines"])
        if rec["engines"]:
            time.sleep(args.settle)
            rec.update(run.cpu(args.cpu_seconds))
            rec.update(run.roundtrip(args.repeat))
            # still registered after all that, as the controller counts them
            rec["engines_after"] = len(run.engines.registered(run.client))
    except Exception as e:  # noqa: BLE001 - recorded: the next size still runs
        rec["limit"] = (rec.get("limit", "") + f" {type(e).__name__}: {e}").strip()[:600]
    finally:
        left = run.stop()
        if left:
            rec["left_over"] = left
    return rec


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--simulate"]:  # one simulator process
        raise_fd_limit()
        kind, target, tls_dir, proc, count = argv[1:6]
        if kind == "ipyparallel":
            simulate_ipyparallel(target, int(proc), int(count))
        else:
            asyncio.run(simulate_dask(target, tls_dir, int(proc), int(count)))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="256,1024,4096")
    ap.add_argument("--kinds", default="ipyparallel,dask")
    ap.add_argument("--per-process", type=int, default=512, help="engines per simulator")
    ap.add_argument(
        "--heartbeat-ms",
        default="auto",
        help="ipyparallel's period: auto (a cluster's of that size: 150 ms up to 256 engines, "
        "then longer) or a number of ms",
    )
    ap.add_argument("--cpu-seconds", type=float, default=10.0)
    ap.add_argument("--settle", type=float, default=3.0, help="seconds before the CPU sample")
    ap.add_argument("--repeat", type=int, default=3, help="round trips (the median is kept)")
    ap.add_argument("--timeout", type=float, default=600.0, help="for all to register")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    fds = raise_fd_limit()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # cleanup runs as for Ctrl-C
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with `&`
    records = []
    for kind in args.kinds.split(","):
        for n in [int(s) for s in args.sizes.split(",")]:
            rec = measure(kind, n, args)
            records.append(rec)
            print(json.dumps({k: v for k, v in rec.items() if k != "roundtrips_s"}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1) + "\n")

    def num(v, fmt):
        return "-" if v is None else format(v, fmt)

    head = ["kind", "engines", "asked", "register/s", "ctrl CPU %", "sims CPU %", "round trip s"]
    rows = [
        [
            r["kind"],
            str(r["engines"]),
            str(r["requested"]),
            num(r["register_per_s"], ".0f"),
            num(r["steady_cpu_percent"], ".1f"),
            num(r.get("simulators_cpu_percent"), ".1f"),
            num(r["roundtrip_s"], ".3f"),
        ]
        for r in records
    ]
    print(markdown_table(head, rows))
    # what bounds the rate here: the CPU each part spends per engine while they register
    head = ["kind", "engines", "register/s", "cores busy %", "controller", "its children"]
    head += ["busiest child", "simulators (CPU ms per engine)"]
    rows = [
        [r["kind"], str(r["engines"]), num(r["register_per_s"], ".0f")]
        + [num(r.get(f"flood_{k}"), ".1f") for k in ("cores_busy_percent",)]
        + [
            num(r.get(f"flood_{part}_cpu_ms_per_engine"), ".2f")
            for part in ("controller", "children", "busiest_child", "simulators")
        ]
        for r in records
    ]
    print()
    print(markdown_table(head, rows))
    print(
        f"\nThis machine has {os.cpu_count()} cores, shared by the simulators and the controller; "
        f"file descriptors: {fds} per process; ipyparallel heartbeat {args.heartbeat_ms} ms "
        "(auto: as a cluster of that size has it, cluster.heartbeat_for)."
    )
    for r in records:
        if r.get("limit") or r.get("left_over"):
            print(f"- {r['kind']} {r['requested']}: {r.get('limit', '')} {r.get('left_over', '')}")


if __name__ == "__main__":
    main()
