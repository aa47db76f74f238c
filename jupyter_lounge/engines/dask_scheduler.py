"""A cluster's Dask scheduler: ``python -m jupyter_lounge.engines.dask_scheduler``.

``--host IP --scheduler-file FILE [--tls-dir DIR | --unix-dir DIR] [--dashboard]``

Dask's own ``dask scheduler`` serves its HTTP routes (health, metrics, the dashboard) on every
interface and in the clear. This one listens on ``--host`` only; with ``--tls-dir`` it first
makes the cluster's CA and certificates there (the CA key never leaves this process's memory),
requires mutual TLS on its comms, and serves HTTP on the same terms; ``--dashboard`` serves the
dashboard instead in the clear on loopback only (reach it from the sidebar or an SSH tunnel).
With ``--unix-dir`` (a cluster on this machine alone) it listens on a Unix socket in that
folder (see unix_comm) and on no TCP port, but the dashboard's when asked.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

from . import unix_comm
from .dask import make_certificates, members_only, security


def versions_checked_once_per_kind(error_message):
    """Dask's ``versions.error_message`` (what the scheduler warns of as a worker registers),
    given each distinct set of worker versions once. The scheduler calls it for every new
    worker with the versions of every worker it has, and it walks them all ~13 times in
    Python: ~5 ms per registration at 4,096 workers, so a cluster's registrations cost O(N^2)
    in all. Its answer depends only on which distinct versions there are (it compares sets of
    them), and a cluster's workers mostly have one: this passes one worker of each on, and
    looks at the others only as their ids (passes in C: ~0.4 ms per registration at 4,096)."""
    held: dict[int, object] = {}  # id(a worker's versions) -> them (held, so the id stays theirs)
    kinds: dict[tuple, set[int]] = {}  # distinct versions -> the ids of workers' that are them

    def key_of(versions) -> tuple:
        packages = versions.get("packages") if versions else "UNKNOWN"
        if isinstance(packages, dict):
            return tuple(sorted(packages.items(), key=lambda item: item[0]))
        return ("", repr(packages))

    def checked(scheduler, workers, source, source_name="Client"):
        ids = set(map(id, workers.values()))
        if len(held) > 2 * len(ids) + 64:  # many workers gone: forget theirs
            for gone in held.keys() - ids:
                del held[gone]
            for members in kinds.values():
                members &= ids
        new = ids.difference(held)
        if new:  # the registering worker's, as a rule: ``source`` is its versions
            found = (
                {id(source): source}
                if new == {id(source)}
                else {id(v): v for v in workers.values() if id(v) in new}
            )
            for i, versions in found.items():
                held[i] = versions
                kinds.setdefault(key_of(versions), set()).add(i)
        some = {}
        for members in kinds.values():
            for i in members:
                if i in ids:
                    some[f"worker {len(some)}"] = held[i]
                    break
        return error_message(scheduler, some, source, source_name=source_name)

    return checked


async def serve(
    host: str,
    scheduler_file: str,
    tls_dir: str | None,
    dashboard: bool,
    unix_dir: str | None = None,
) -> None:
    from distributed import Scheduler, versions

    versions.error_message = versions_checked_once_per_kind(versions.error_message)
    if tls_dir:
        make_certificates(Path(tls_dir), host)
    unix = None
    if unix_dir:
        unix_comm.register()
        unix = str(Path(unix_dir) / "scheduler")
    http = "127.0.0.1:0" if dashboard else None if unix else f"{host}:0"
    scheduler_class = members_only(
        Scheduler, "scheduler", http, tls=bool(tls_dir) and not dashboard, unix=unix
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
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--tls-dir")
    where.add_argument("--unix-dir")
    parser.add_argument("--dashboard", action="store_true")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.host, args.scheduler_file, args.tls_dir, args.dashboard, args.unix_dir))


if __name__ == "__main__":
    main()
