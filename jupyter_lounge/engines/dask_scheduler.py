"""A cluster's Dask scheduler: ``python -m jupyter_lounge.engines.dask_scheduler``.

``--host IP --scheduler-file FILE [--tls-dir DIR] [--dashboard]``

Dask's own ``dask scheduler`` serves its HTTP routes (health, metrics, the dashboard) on every
interface and in the clear. This one listens on ``--host`` only; with ``--tls-dir`` it first
makes the cluster's CA and certificates there (the CA key never leaves this process's memory),
requires mutual TLS on its comms, and serves HTTP on the same terms; ``--dashboard`` serves the
dashboard instead in the clear on loopback only (reach it from the sidebar or an SSH tunnel).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

from .dask import make_certificates, members_only, security


async def serve(host: str, scheduler_file: str, tls_dir: str | None, dashboard: bool) -> None:
    from distributed import Scheduler

    if tls_dir:
        make_certificates(Path(tls_dir), host)
    http = "127.0.0.1:0" if dashboard else f"{host}:0"
    scheduler_class = members_only(
        Scheduler, "scheduler", http, tls=bool(tls_dir) and not dashboard
    )
    scheduler = scheduler_class(
        host=host,
        port=0,
        protocol="tls" if tls_dir else "tcp",
        security=security(tls_dir, "scheduler") if tls_dir else None,
        dashboard=dashboard,
        scheduler_file=scheduler_file,
        validate=False,
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(scheduler.close()))
    async with scheduler:
        await scheduler.finished()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m jupyter_lounge.engines.dask_scheduler")
    parser.add_argument("--host", required=True)
    parser.add_argument("--scheduler-file", required=True)
    parser.add_argument("--tls-dir")
    parser.add_argument("--dashboard", action="store_true")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.host, args.scheduler_file, args.tls_dir, args.dashboard))


if __name__ == "__main__":
    main()
