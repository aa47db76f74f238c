"""One background event loop per process, so the ``*_sync`` twins work inside a running kernel."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

#: How often a thread waiting for the loop looks for a Ctrl-C another thread received.
INTERRUPT_CHECK_S = 0.1
_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def _background_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None or _loop.is_closed():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(
                target=loop.run_forever, name="jupyter-lounge-loop", daemon=True
            )
            thread.start()
            _loop = loop
        return _loop


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from synchronous code, even if this thread has a loop."""
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    loop = _background_loop()
    if running is loop:
        raise RuntimeError("run_sync called from the lounge loop itself; await the coroutine")
    finished = threading.Event()

    async def runner() -> T:
        try:
            return await coro
        finally:
            finished.set()

    future = asyncio.run_coroutine_threadsafe(runner(), loop)
    done = threading.Event()
    future.add_done_callback(lambda _: done.set())
    try:
        # Waited for in short steps: a Ctrl-C (SIGINT to the process) may be received by
        # another of its threads (ZMQ's, this loop's), and then only reaches this one when
        # it next runs Python. Blocked in one long wait, it did so once the start was over.
        while not done.wait(INTERRUPT_CHECK_S):
            pass
        return future.result()
    except KeyboardInterrupt:
        # An interrupted start must not go on starting in the background: cancel it and
        # let its clean-up (which stops whatever it had started) finish first.
        future.cancel()
        finished.wait(60)
        raise
