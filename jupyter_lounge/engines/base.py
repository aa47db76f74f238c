"""The engine-kind contract: start a controller, run one engine in a forked child, and give
the cluster a client to count, map and execute with.

Methods marked *agent* run in the node agent or its forked child and must not create a
thread or a ZMQ context before the fork; methods marked *cluster* run where the cluster is
controlled.
"""

from __future__ import annotations

import re
from concurrent.futures import Future
from pathlib import Path
from typing import Any


def engine_name(node: str, rank: int, suffix: str = "") -> str:
    """The name an engine registers under: node and rank, so clients can count per node."""
    return f"{node}/{rank}" + (f"/{suffix}" if suffix else "")


def engine_ident(node: str, rank: int, nonce: str) -> str:
    """An ipyparallel engine's identity, made of ``[A-Za-z0-9_-]`` only: ipyparallel turns
    message ids that contain it into Python names on the engine (broadcast views). Every
    character of the node name outside ``[A-Za-z0-9]`` is written ``-XX`` per UTF-8 byte, so
    ``_`` separates the parts and the name comes back exactly."""
    escaped = "".join(
        c if c.isascii() and c.isalnum() else "".join(f"-{b:02x}" for b in c.encode()) for c in node
    )
    return f"{escaped}_{rank}_{nonce}"


def parse_engine_name(name: str) -> tuple[str, int] | None:
    """(node, rank) from a name ``engine_name`` or ``engine_ident`` made, else None."""
    parts = str(name).split("/")
    if len(parts) >= 2 and parts[1].isdigit():
        return parts[0], int(parts[1])
    parts = str(name).split("_")
    if len(parts) == 3 and parts[1].isdigit():
        raw = re.sub(rb"-([0-9a-f]{2})", lambda m: bytes([int(m[1], 16)]), parts[0].encode())
        return raw.decode("utf-8", "replace"), int(parts[1])
    return None


class EngineKind:
    name = ""
    # An engine that ends by itself with exit code 0 (not asked to by its agent): True, it
    # was shut down on purpose (``rc.shutdown``, ``%px exit``) and its rank is retired; False,
    # it is replaced like a crashed one but not counted as a crash (a Dask worker the
    # scheduler closed, as ``Client.restart`` does to workers without a nanny).
    clean_exit_retires = False
    # The signal the agent sends each engine to interrupt its running work.
    interrupt_signal = "SIGINT"
    interrupt_note = "each engine's running code raised KeyboardInterrupt"
    # Whether a cluster of this kind on this machine alone talks over Unix sockets in a
    # private folder (the cluster's ``socket_dir``) rather than over loopback TCP with TLS.
    local_sockets = False

    # -- agent side ------------------------------------------------------------------------
    def agent_imports(self) -> None:
        """Import the engine's own machinery before the fork, so no child pays for it."""

    def probe_address(self, connection: dict) -> tuple[str, int] | str:
        """Host and TCP port (or a Unix socket's path) the agent probes to notice that its
        controller is gone."""
        raise NotImplementedError

    def prepare(self, connection: dict, options: dict, connection_file: str) -> None:
        """Once the controller is known, before the first fork: what every engine would
        otherwise make for itself (no thread, no ZMQ context). ``connection_file`` is the
        file ``connection`` was read from."""

    def serve_node(self, connection: dict, options: dict, ready_fd: int) -> None:
        """*agent*, in a child forked before the engines: a per-node service the engines
        use (ipyparallel's nanny). Writes one JSON line of options for the engines to
        ``ready_fd``, then serves until killed. Kinds without one leave this alone."""

    has_node_service = False

    def run_engine(
        self, connection_file: str, *, rank: int, node: str, restarts: int, options: dict
    ) -> None:
        """Run one engine until it is stopped (in a freshly forked child)."""
        raise NotImplementedError

    # -- cluster side ----------------------------------------------------------------------
    def controller_command(self, cdir: Path, listen_ip: str, options: dict) -> list[str]:
        raise NotImplementedError

    def connection_files(self, cdir: Path) -> tuple[Path, Path]:
        """(file the engines read, file the client reads); both exist once it is ready."""
        raise NotImplementedError

    controller_name = "controller"

    def connect(self, cdir: Path, timeout: float) -> Any:
        """The stock client of this kind, or a LoungeTimeout naming the controller's log."""
        from ..errors import LoungeTimeout

        try:
            return self._connect(cdir, timeout)
        except (TimeoutError, OSError) as e:
            raise LoungeTimeout(
                f"could not connect to the {self.controller_name} within {timeout:g} s "
                f"({type(e).__name__}: {e}); its log is {cdir / 'controller.log'}"
            ) from None

    def _connect(self, cdir: Path, timeout: float) -> Any:
        raise NotImplementedError

    def close(self, client: Any) -> None:
        raise NotImplementedError

    def registered(self, client: Any) -> list[tuple[str, int]]:
        """(node, rank) of every engine registered now."""
        raise NotImplementedError

    # -- what the map driver (mapping.py) needs ----------------------------------------------
    def engines(self, client: Any) -> dict:
        """The engines registered now, as ``submit_to`` names them, each with its node."""
        raise NotImplementedError

    def submit_to(self, client: Any, engine: Any, fn: Any, *args: Any) -> Future:
        """Run ``fn(*args)`` on that engine alone; a future of its result."""
        raise NotImplementedError

    def wait_any(self, futures: list, timeout: float) -> None:
        """Return once one of ``futures`` is done, or after ``timeout`` seconds."""
        import concurrent.futures

        concurrent.futures.wait(futures, timeout, concurrent.futures.FIRST_COMPLETED)

    def outcome(self, future: Any) -> Any:
        """The result of a done future; raises when its engine could not give one."""
        return future.result()

    def interrupt(self, client: Any, engines: list) -> None:
        """Interrupt what these engines run now (a cancelled run's batches)."""
        raise NotImplementedError

    def execute(self, client: Any, code: str, timeout: float | None) -> None:
        """Run code on every engine, printing each engine's output as it arrives."""
        raise NotImplementedError
