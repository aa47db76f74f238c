"""Dask engines: a ``dask scheduler`` beside the cluster, a ``distributed.Worker`` in each child."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from ..errors import LoungeError, LoungeTimeout
from .base import EngineKind


class DaskEngines(EngineKind):
    name = "dask"

    def agent_imports(self) -> None:
        import distributed.worker  # noqa: F401

    def probe_address(self, connection: dict) -> tuple[str, int]:
        host, port = connection["address"].split("://", 1)[1].rsplit(":", 1)
        return host, int(port)

    def run_engine(self, connection_file, *, rank, node, restarts, options):
        import asyncio

        from distributed import Worker

        from ..state import read_json

        address = read_json(connection_file)["address"]
        name = f"{node}/{rank}" + (f"/r{restarts}" if restarts else "")

        async def serve() -> None:
            async with Worker(
                address, name=name, nthreads=1, memory_limit=0, nanny=None,
                local_directory=options.get("local_directory"), validate=False,
            ) as worker:
                await worker.finished()

        asyncio.run(serve())

    def controller_command(self, cdir: Path, listen_ip: str, options: dict) -> list[str]:
        return [
            sys.executable, "-m", "distributed.cli.dask_scheduler",
            f"--host={listen_ip}", "--port=0", "--no-dashboard",
            f"--scheduler-file={cdir / 'scheduler.json'}",
        ]

    def connection_files(self, cdir: Path) -> tuple[Path, Path]:
        return cdir / "scheduler.json", cdir / "scheduler.json"

    def connect(self, cdir: Path, timeout: float) -> Any:
        from distributed import Client

        try:
            return Client(scheduler_file=str(cdir / "scheduler.json"), timeout=timeout,
                          set_as_default=False)
        except (TimeoutError, OSError) as e:
            raise LoungeTimeout(
                f"could not connect to the Dask scheduler within {timeout:g} s "
                f"({type(e).__name__}: {e}); its log is {cdir / 'controller.log'}"
            ) from None

    def close(self, client: Any) -> None:
        client.close(timeout=5)

    def registered(self, client: Any) -> list[tuple[str, int]]:
        out = []
        for info in client.scheduler_info(n_workers=-1)["workers"].values():
            parts = str(info.get("name", "")).split("/")
            rank = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else -1
            out.append((parts[0], rank))
        return out

    def submit_all(self, client, fn, payloads, retries):
        return [client.submit(fn, p, pure=False, retries=retries) for p in payloads]

    def execute(self, client, code, timeout):
        from ..tasks import exec_cell

        workers = client.scheduler_info(n_workers=-1)["workers"]
        if not workers:
            raise LoungeError("No engine is registered yet; wait with `%lounge status` and retry.")
        pending = {
            client.submit(exec_cell, code, workers=[addr], allow_other_workers=False,
                          pure=False): info.get("name", addr)
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
                raise LoungeTimeout(f"The cell did not finish on every engine within "
                                    f"{timeout:g} s.")
            time.sleep(0.02)
