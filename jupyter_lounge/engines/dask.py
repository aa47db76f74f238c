"""Dask engines: a ``dask scheduler`` beside the cluster, a ``distributed.Worker`` in each child."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from ..errors import LoungeError, LoungeTimeout
from .base import EngineKind, engine_name, parse_engine_name


def _security(tls_dir: Path | str | None):
    """Dask's Security for the cluster's own certificate, or None when TLS is off."""
    if not tls_dir or not (Path(tls_dir) / "tls-cert.pem").exists():
        return None
    from distributed.security import Security

    cert, key = str(Path(tls_dir) / "tls-cert.pem"), str(Path(tls_dir) / "tls-key.pem")
    return Security(
        tls_ca_file=cert,
        tls_client_cert=cert,
        tls_client_key=key,
        tls_worker_cert=cert,
        tls_worker_key=key,
        tls_scheduler_cert=cert,
        tls_scheduler_key=key,
        require_encryption=True,
    )


def make_certificate(cdir: Path) -> None:
    """A self-signed certificate and key (0600) that scheduler, workers and client share."""
    from ..procs import run

    key, cert = cdir / "tls-key.pem", cdir / "tls-cert.pem"
    cmd = [
        "openssl",
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "30",
        "-subj",
        "/CN=jupyter-lounge",
        "-keyout",
        str(key),
        "-out",
        str(cert),
        "-addext",
        "basicConstraints=critical,CA:TRUE",
    ]
    run(cmd, timeout=30)  # a failure quotes openssl's own words
    key.chmod(0o600)
    cert.chmod(0o600)


class DaskEngines(EngineKind):
    name = "dask"
    controller_name = "Dask scheduler"

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

    def probe_address(self, connection: dict) -> tuple[str, int]:
        host, port = connection["address"].split("://", 1)[1].rsplit(":", 1)
        return host, int(port)

    def run_engine(self, connection_file, *, rank, node, restarts, options):
        import asyncio

        from distributed import Worker

        from ..state import read_json

        address = read_json(connection_file)["address"]
        name = engine_name(node, rank, f"r{restarts}" if restarts else "")

        async def serve() -> None:
            async with Worker(
                address,
                name=name,
                nthreads=1,
                memory_limit=0,
                nanny=None,
                security=_security(options.get("tls_dir")),
                local_directory=options.get("local_directory"),
                validate=False,
            ) as worker:
                await worker.finished()

        asyncio.run(serve())

    def controller_command(self, cdir: Path, listen_ip: str, options: dict) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "distributed.cli.dask_scheduler",
            f"--host={listen_ip}",
            "--port=0",
            "--no-dashboard",
            f"--scheduler-file={cdir / 'scheduler.json'}",
        ]
        if options.get("tls"):
            make_certificate(cdir)
            cert, key = cdir / "tls-cert.pem", cdir / "tls-key.pem"
            cmd += [
                "--protocol=tls",
                f"--tls-ca-file={cert}",
                f"--tls-cert={cert}",
                f"--tls-key={key}",
            ]
        return cmd

    def connection_files(self, cdir: Path) -> tuple[Path, Path]:
        return cdir / "scheduler.json", cdir / "scheduler.json"

    def _connect(self, cdir: Path, timeout: float) -> Any:
        from distributed import Client

        return Client(
            scheduler_file=str(cdir / "scheduler.json"),
            timeout=timeout,
            set_as_default=False,
            security=_security(cdir),
        )

    def close(self, client: Any) -> None:
        client.close(timeout=5)

    def registered(self, client: Any) -> list[tuple[str, int]]:
        workers = client.scheduler_info(n_workers=-1)["workers"].values()
        return [parse_engine_name(w.get("name", "")) or ("?", -1) for w in workers]

    def submit_all(self, client, fn, payloads, retries):
        return [client.submit(fn, p, pure=False, retries=retries) for p in payloads]

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
