"""Dask engines: a ``dask scheduler`` beside the cluster, a ``distributed.Worker`` in each child."""

from __future__ import annotations

import functools
import os
import pickle
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from ..errors import LoungeError, LoungeTimeout
from . import unix_comm
from .base import EngineKind, engine_name, parse_engine_name

#: A cluster's TLS files: its own CA's certificate, and one certificate + key per role. The
#: CA's key exists only while the scheduler starts, in memory: nothing can sign more later.
CA_FILE = "tls-ca.pem"
ROLE_FILES = {
    "scheduler": "tls-scheduler.pem",
    "worker": "tls-worker.pem",
    "client": "tls-client.pem",
}
#: What a node needs (the relay ships these to nodes without a shared file system).
NODE_FILES = (CA_FILE, ROLE_FILES["worker"])


class Interrupted(Exception):
    """Raised in a task running on a lounge worker by ``%lounge interrupt``."""


def interrupt_tasks(worker: Any) -> int:
    """Raise Interrupted in every thread that runs a task of ``worker`` now; how many.

    Python delivers it at that thread's next bytecode: a call that stays in C (a sleep, a
    TensorFlow op) finishes first. Dask has no other way to stop a running task."""
    import ctypes

    with worker.active_threads_lock:
        threads = list(worker.active_threads)
    set_async = ctypes.pythonapi.PyThreadState_SetAsyncExc
    return sum(
        set_async(ctypes.c_ulong(tid), ctypes.py_object(Interrupted)) == 1 for tid in threads
    )


def security(tls_dir: Path | str | None, role: str):
    """Dask's Security for ``role`` with the cluster's CA (mutual TLS: every side shows a
    certificate the CA signed, or the connection is refused), or None without TLS."""
    if not tls_dir:
        return None
    ca, own = str(Path(tls_dir) / CA_FILE), str(Path(tls_dir) / ROLE_FILES[role])
    return _mutual_tls()(
        tls_ca_file=ca,
        **{f"tls_{role}_cert": own, f"tls_{role}_key": own},
        require_encryption=True,
    )


@functools.cache
def _mutual_tls() -> type:
    from distributed.security import Security

    class MutualTLS(Security):
        """Dask's Security with each TLS context made once: parsing the CA and the key costs
        ~10 ms a context here and a worker needs three, so the agent makes them before it
        forks and every worker shares them. Servers issue no session tickets (Dask never
        resumes a session; each ticket is work in every handshake)."""

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self._made: dict[str, dict] = {}

        def get_connection_args(self, role):
            if "connect" not in self._made:
                self._made["connect"] = Security.get_connection_args(self, role)
            return dict(self._made["connect"])

        def get_listen_args(self, role):
            if "listen" not in self._made:
                args = Security.get_listen_args(self, role)
                args["ssl_context"].num_tickets = 0
                self._made["listen"] = args
            return dict(self._made["listen"])

    return MutualTLS


def make_certificates(tls_dir: Path, host: str) -> None:
    """A CA made for this cluster alone signs a certificate for the scheduler, the workers and
    the client; each file (0600) holds a certificate and its key. The CA key is not kept."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=3650)

    def cert(subject_cn, key, issuer, issuer_key, ca: bool, san=None):
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject_cn)]))
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), True)
        )
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), False)
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "jupyter-lounge cluster CA")])
    ca_cert = cert("jupyter-lounge cluster CA", ca_key, ca_name, ca_key, ca=True)
    pem = serialization.Encoding.PEM
    _write_private(tls_dir / CA_FILE, ca_cert.public_bytes(pem))
    try:
        san = [x509.IPAddress(ipaddress.ip_address(host))]
    except ValueError:
        san = [x509.DNSName(host)]
    for role, name in ROLE_FILES.items():
        key = ec.generate_private_key(ec.SECP256R1())
        leaf = cert(f"jupyter-lounge {role}", key, ca_name, ca_key, ca=False, san=san)
        key_pem = key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        _write_private(tls_dir / name, leaf.public_bytes(pem) + key_pem)


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def warm_tornado_tls() -> None:
    """Every TLS stream tornado makes evaluates a default context of its own first, which
    loads the system's CA store (~50 ms here, once per process, unused by us): load it once,
    in the agent before the fork, rather than in each of 32 workers, or 1.6 s of CPU."""
    try:
        from tornado.netutil import _client_ssl_defaults, _server_ssl_defaults
    except ImportError:  # another tornado: nothing to warm
        return
    _client_ssl_defaults()
    _server_ssl_defaults()


#: What an idle Dask worker does many times a second, made rarer (stock value -> ours): its
#: statistical profiler samples its threads every 10 ms (only the dashboard's Profile page
#: reads it: kept with --dashboard), its event loop ticks every 20 ms (only to warn of a loop
#: blocked for 3 s), it reads its memory every 100 ms and the system's every 500 ms. 32 idle
#: workers here: 42% of a core -> 6%; 256 of them kept both cores busy, and a map of 2,048
#: items of 50 ms took 190 s instead of seconds. Two more instruments only the dashboard shows
#: (kept with --dashboard): the system monitor's disk I/O and its GIL contention (a thread
#: polling every 1 ms where ``gilknocker`` is installed; where it is not, every worker tried
#: to import it as it started, ~2 ms each).
DASHBOARD_ONLY = (
    "distributed.worker.profile.enabled",
    "distributed.admin.system-monitor.disk",
    "distributed.admin.system-monitor.gil.enabled",
)
QUIET = {
    "distributed.worker.profile.enabled": (True, False),
    "distributed.admin.system-monitor.disk": (True, False),
    "distributed.admin.system-monitor.gil.enabled": (True, False),
    "distributed.admin.tick.interval": ("20ms", "1s"),
    "distributed.worker.memory.monitor-interval": ("100ms", "500ms"),
    "distributed.admin.system-monitor.interval": ("500ms", "2s"),
}


def quiet_workers(profile: bool = False) -> dict:
    """Set QUIET in this process's Dask config where it has the stock value (a value the
    user configured stays); what was set."""
    import dask

    changed = {}
    for key, (stock, ours) in QUIET.items():
        if key in DASHBOARD_ONLY and profile:
            continue
        if dask.config.get(key, None) == stock:
            changed[key] = ours
    dask.config.set(changed)
    return changed


def quiet_worker_logs() -> bool:
    """Dask's loggers at WARNING in the agent, and so in every worker it forks, where Dask's
    own default (INFO) is in force: a worker's start logged 13 lines of INFO (its address,
    its folder, "Registered to", ...) into its agent's log, ~5 ms a worker. Its warnings
    and errors are logged as before; a user's logging configuration of Dask is kept."""
    import logging

    import dask

    dask_logger = logging.getLogger("distributed")
    if dask.config.get("logging", None) or dask_logger.level != logging.INFO:
        return False
    dask_logger.setLevel(logging.WARNING)
    return True


def route_to(host: str) -> str:
    """This machine's address on the way to ``host`` (no packet is sent): the one address a
    worker listens on and advertises."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, 9))
        return s.getsockname()[0]


def members_only(
    base: type, role: str, http_address: str | None, tls: bool = True, unix: str | None = None
) -> type:
    """``base`` (Dask's Scheduler or Worker) with its built-in HTTP server (health, metrics,
    the dashboard) on ``http_address`` only; with ``tls``, on the terms of its comms: a
    certificate from the cluster's CA, or the handshake fails. (Dask always starts this
    server, by default on every interface and in the clear.) With ``unix`` (a socket path
    in the cluster's private folder), it listens there, and serves HTTP only where
    ``http_address`` is given (the dashboard, on loopback): no TCP port otherwise. Its
    routes (health, metrics) serve monitoring from other machines, which a cluster on this
    machine alone has none of, and each worker paid ~5 ms to set them up."""

    class MembersOnly(base):
        def start_http_server(self, routes, dashboard_address, default_port=0, ssl_options=None):
            if unix and http_address is None:
                return None
            if tls:
                ssl_options = self.security.get_listen_args(role)["ssl_context"]
            return super().start_http_server(routes, http_address, 0, ssl_options)

        if unix:

            async def listen(self, port_or_addr=None, allow_offload=True, **kwargs):
                return await super().listen(unix_comm.address(unix), allow_offload, **kwargs)

    MembersOnly.__name__ = MembersOnly.__qualname__ = f"Lounge{base.__name__}"
    return MembersOnly


class DaskEngines(EngineKind):
    name = "dask"
    interrupt_signal = "SIGUSR1"  # SIGINT would stop the worker's event loop, not its task
    interrupt_note = (
        "each task running on a worker raises Interrupted at its next Python line (a call "
        "in C, such as a sleep or a TensorFlow op, finishes first); queued tasks still run: "
        "cancel their futures to drop them"
    )
    controller_name = "Dask scheduler"
    local_sockets = True
    _security = None  # the workers' Security, made by prepare() before the fork

    def agent_imports(self) -> None:
        # The worker and what it imports as it starts (its HTTP routes): once, here.
        import importlib

        for module in (
            "distributed.worker",
            "distributed.http.worker.prometheus",
            "distributed.http.health",
            "distributed.http.statics",
            "tornado.platform.asyncio",
            "email.policy",
            "secrets",
        ):
            importlib.import_module(module)
        # What a worker tells the scheduler as it registers: nine packages' versions, each read
        # from its metadata on disk (7 to 9 ms of CPU per worker) and cached per process. Read
        # once here, every worker has them from the fork.
        from distributed.versions import get_versions

        get_versions()

    def probe_address(self, connection: dict) -> tuple[str, int] | str:
        if connection["address"].startswith(unix_comm.PREFIX):
            return unix_comm.path_of(connection["address"])
        host, port = connection["address"].split("://", 1)[1].rsplit(":", 1)
        return host, int(port)

    def prepare(self, connection: dict, options: dict, connection_file: str) -> None:
        quiet_workers(profile=bool(options.get("dashboard")))  # inherited by every fork
        quiet_worker_logs()
        # The workers' TLS contexts, made once here: each forked worker inherits them.
        if connection["address"].startswith("tls://"):
            self._security = security(options.get("tls_dir"), "worker")
            self._security.get_connection_args("worker")
            self._security.get_listen_args("worker")
            warm_tornado_tls()
        elif connection["address"].startswith(unix_comm.PREFIX):
            unix_comm.register()  # inherited by every fork

    def run_engine(self, connection_file, *, rank, node, restarts, options):
        import asyncio

        from distributed import Worker

        from ..protocol import read_json

        address = read_json(connection_file)["address"]
        tls = address.startswith("tls://")
        unix = address.startswith(unix_comm.PREFIX)
        if not (tls or unix or address.startswith("tcp://127.")):
            raise SystemExit(f"refusing an unencrypted scheduler across machines: {address}")
        name = engine_name(node, rank, f"r{restarts}" if restarts else "")
        if unix:  # beside the scheduler's socket, in the cluster's private folder
            unix_comm.register()
            host, protocol = None, unix_comm.SCHEME
            own = os.path.join(
                os.path.dirname(unix_comm.path_of(address)), f"w-{rank}-{uuid.uuid4().hex[:8]}"
            )
            worker_class = members_only(Worker, "worker", None, False, unix=own)
        else:
            host, protocol = route_to(address.split("://", 1)[1].rsplit(":", 1)[0]), None
            worker_class = members_only(Worker, "worker", f"{host}:0", tls)
        # A workspace per rank: a new worker tries the lock of every other worker's folder in
        # its workspace, to purge those of dead workers (O(N^2) for a node's N workers: ~1.5 s
        # of CPU in all at 256); alone in its own, it purges only a dead predecessor's.
        workspace = options.get("local_directory")
        if workspace:
            workspace = os.path.join(workspace, f"rank-{rank}")

        async def serve() -> None:
            async with worker_class(
                address,
                host=host,  # listen on the address it advertises, never on every interface
                protocol=protocol,
                name=name,
                nthreads=1,
                memory_limit=0,
                nanny=None,
                security=self._security if tls else None,
                local_directory=workspace,
                validate=False,
            ) as worker:
                asyncio.get_running_loop().add_signal_handler(
                    signal.SIGUSR1, interrupt_tasks, worker
                )
                await worker.finished()

        asyncio.run(serve())

    def controller_command(self, cdir: Path, listen_ip: str, options: dict) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "jupyter_lounge.engines.dask_scheduler",
            f"--host={listen_ip}",
            f"--scheduler-file={cdir / 'scheduler.json'}",
        ]
        if options.get("socket_dir"):
            cmd.append(f"--unix-dir={options['socket_dir']}")
        elif options.get("tls"):
            cmd.append(f"--tls-dir={cdir}")
        if options.get("dashboard"):
            cmd.append("--dashboard")
        return cmd

    def connection_files(self, cdir: Path) -> tuple[Path, Path]:
        return cdir / "scheduler.json", cdir / "scheduler.json"

    def _connect(self, cdir: Path, timeout: float) -> Any:
        from distributed import Client

        from ..protocol import read_json

        address = (read_json(cdir / "scheduler.json") or {}).get("address", "")
        if address.startswith(unix_comm.PREFIX):
            unix_comm.register()
        return Client(
            address,
            timeout=timeout,
            set_as_default=False,
            security=security(cdir, "client") if address.startswith("tls://") else None,
        )

    def close(self, client: Any) -> None:
        client.close(timeout=5)

    def registered(self, client: Any) -> list[tuple[str, int]]:
        workers = client.scheduler_info(n_workers=-1)["workers"].values()
        return [parse_engine_name(w.get("name", "")) or ("?", -1) for w in workers]

    def engines(self, client):
        workers = client.scheduler_info(n_workers=-1)["workers"]
        return {
            addr: (parse_engine_name(w.get("name", "")) or (addr, -1))[0]
            for addr, w in workers.items()
        }

    def submit_to(self, client, engine, fn, *args):
        # A buffer (a map's function image, 40 MB with its closure) goes to that worker on
        # its own, out of band, not in the task graph the scheduler unpickles and pickles again
        args = tuple(
            client.scatter(pickle.PickleBuffer(a), workers=[engine], hash=False)
            if isinstance(a, memoryview)
            else a
            for a in args
        )
        return client.submit(fn, *args, workers=[engine], allow_other_workers=False, pure=False)

    def wait_any(self, futures, timeout):
        # distributed.wait needs a default client, and ours is not one: look every 2 ms
        deadline = time.monotonic() + timeout
        while not any(f.done() for f in futures) and time.monotonic() < deadline:
            time.sleep(0.002)

    def outcome(self, future):
        # A finished task whose worker dies before its result is fetched goes back to pending
        # ("Couldn't gather ... rescheduling"); pinned to that worker, it would never run
        # again, and result() would wait for ever. Wait in slices; a task that is no longer
        # finished was lost with its worker.
        while True:
            try:
                return future.result(timeout=1.0)
            except TimeoutError:
                if future.status != "finished":
                    future.cancel()
                    raise LoungeError(
                        "its worker died before the batch's result could be fetched"
                    ) from None

    def interrupt(self, client, engines):
        if engines:
            client.run(interrupt_tasks, workers=list(engines), wait=False)

    def execute(self, client, code, timeout):
        from ..tasks import exec_cell

        workers = client.scheduler_info(n_workers=-1)["workers"]
        if not workers:
            raise LoungeError("No engine is registered yet; wait with `%lounge status` and retry.")
        pending = {
            client.submit(
                exec_cell, code, workers=[addr], allow_other_workers=False, pure=False
            ): info.get("name", addr)
            for addr, info in workers.items()
        }
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending:  # print each engine's output as soon as it is done
            for fut in [f for f in pending if f.done()]:
                name = pending.pop(fut)
                text = fut.result()
                if text:
                    end = "" if text.endswith("\n") else "\n"
                    print(f"[stdout:{name}] " + text, end=end, flush=True)
            if deadline is not None and time.monotonic() > deadline:
                raise LoungeTimeout(
                    f"The cell did not finish on every engine within {timeout:g} s."
                )
            time.sleep(0.02)
