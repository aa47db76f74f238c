"""The run driver: one small process per cluster that dispatches its runs (see runstore.py).

``python -m jupyter_lounge.runner CLUSTER_DIR CREATED``

Started with the cluster (detached, like its controller) and stopped with it. It holds the
lock ``runs/.driver.lock``: of two drivers of one cluster, the second leaves at once, so any
process that finds the driver gone may start another (``ensure``). It looks for new runs in
the cluster's ``runs/`` folder, steps the map driver of each (``mapping._Driver``) over one
client, and commits each run's finished rows at most ``runstore.FLUSH_S`` after they came back.
A kernel that made a run wakes it (``SIGWINCH``, which a process not listening ignores), so a
new run is taken up at once, not at the next look.
A run it finds ``running`` (its driver died) is resumed: the items not yet in the store are
sent again. It leaves when its cluster is stopped or replaced.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
import traceback
from pathlib import Path

from .runstore import FLUSH_S

LOOK_S = 0.2  # how often the runs folder is read for new runs and cancels
STATE_S = 1.0  # how often the cluster's state is read (scaled? stopped?)
WAKE = getattr(signal, "SIGWINCH", None)  # "look for runs now"; ignored unless listened to
PIDFILE = "driver.json"
LOCK = ".driver.lock"


# -- for the cluster and the followers ---------------------------------------------------------
def _pid(cluster: str) -> list | None:
    from .protocol import read_json
    from .runstore import runs_dir

    data = read_json(runs_dir(cluster, make=False) / PIDFILE)
    return data if isinstance(data, list) and len(data) == 2 else None


def alive(cluster: str) -> bool:
    from .procs import ours

    pid = _pid(cluster)
    return bool(pid) and ours(pid[0], pid[1])


def runs(cluster: str) -> list[dict]:
    """The cluster's runs (runstore.runs); one that waits for a driver gets it started, so
    listing the runs also resumes them."""
    from . import runstore

    found = runstore.runs(cluster)
    if any(r["status"] in runstore.NEEDS_DRIVER for r in found):
        ensure(cluster)
    return found


def ensure(cluster: str) -> None:
    """Start the cluster's run driver unless it runs (or its cluster does not)."""
    from . import state
    from .cluster import in_use
    from .procs import ours, spawn, started
    from .protocol import write_json
    from .runstore import runs_dir

    pid = _pid(cluster)
    if pid and ours(pid[0], pid[1]):
        if WAKE is not None:  # a run may have just been made: look now
            try:
                os.kill(pid[0], WAKE)
            except OSError:
                pass
        return
    data = state.load_state(cluster)
    if data is None or not in_use(data):
        return
    folder = runs_dir(cluster)
    cmd = [sys.executable, "-m", "jupyter_lounge.runner", str(folder.parent), repr(data["created"])]
    proc = spawn(cmd, folder / "driver.log")
    # recorded now, not only once it holds the lock: a stop right after this finds it (a
    # driver that loses the lock to another leaves at once; the winner records itself)
    write_json(folder / PIDFILE, [proc.pid, started(proc.pid)])


async def stop(cluster: str) -> None:
    """Stop the cluster's run driver (its runs stay in their stores)."""
    from .procs import kill_group

    pid = _pid(cluster)
    if pid:
        await kill_group(pid[0], pid[1], grace=2.0)


# -- the process -------------------------------------------------------------------------------
class _Active:
    def __init__(self, store, driver):
        self.store, self.driver = store, driver
        self.flushed = time.monotonic()


class Runner:
    def __init__(self, name: str, created: float):
        self.name, self.created = name, created
        self.cluster = None
        self.active: dict[str, _Active] = {}
        self.seen: set[str] = set()
        self.looked = self.stated = 0.0
        self.wake_fd: int | None = None  # readable once woken (signal.set_wakeup_fd)
        from .procs import started

        self.me = [os.getpid(), started(os.getpid())]

    def _state(self) -> bool:
        """Take on the cluster's state; False once it is stopped or replaced."""
        from . import state
        from .cluster import Cluster

        try:
            data = state.load_state(self.name)
        except state.CorruptState:
            return False
        if data is None or data.get("created") != self.created:
            return False
        if self.cluster is None:
            self.cluster = Cluster.from_state(data)
        else:
            self.cluster.reload(data)
        return data.get("status") not in ("stopping", "stopped")

    def _connect(self) -> None:
        """Connect to the controller once the cluster runs, before the first map needs it."""
        if self.cluster.status == "running" and self.cluster._client is None:
            try:
                self.cluster.client  # noqa: B018 - connects
            except Exception:  # noqa: BLE001 - a run that needs it will say why
                pass

    def _look(self) -> None:
        from . import runstore

        for name in runstore.names(self.name):
            if name not in self.seen:
                self.seen.add(name)
                self._take_up(name)
        for name, a in list(self.active.items()):
            try:
                cancel = a.store.cancel_asked()
            except Exception:  # noqa: BLE001 - deleted under us
                cancel = True
            if cancel:
                self._cancel(name, a)

    def _take_up(self, name: str) -> None:
        import cloudpickle

        from . import runstore
        from .mapping import _Driver

        store = runstore.Store(runstore.store_path(self.name, name))
        meta = store.meta()
        if meta["status"] not in runstore.ACTIVE:
            store.close()
            return
        if meta["cancel"]:
            store.finish("cancelled")
            store.close()
            return
        print(f"driver: {'resuming' if meta['status'] == 'running' else 'starting'} {name}")
        store.take(self.me)
        try:
            key, image, blob, source = store.job()  # the kernel's key: not hashed again here
            items = cloudpickle.loads(blob)
            done = store.done()
            todo = [i for i in range(len(items)) if i not in done]
            nodes = json.loads(meta["nodes"]) if meta["nodes"] else None
            driver = _Driver(
                self.cluster,
                image,
                items,
                meta["retries"],
                None,
                todo=todo,
                nodes=nodes,
                key=key,
                source=source,
            )
        except Exception as e:  # noqa: BLE001 - this run cannot start; the others go on
            self._fail(name, store, e)
            return
        self.active[name] = _Active(store, driver)

    def _cancel(self, name: str, a: _Active) -> None:
        others = {
            e for n, b in self.active.items() if n != name for e, _ in b.driver.flying.values()
        }
        mine = {e for e, _ in a.driver.flying.values()} - others
        a.driver.stop()
        try:
            self.cluster.kind.interrupt(self.cluster.client, sorted(mine, key=str))
        except Exception:  # noqa: BLE001 - engines gone: nothing left to interrupt
            pass
        self._flush(a)
        a.store.finish("cancelled")
        a.store.close()
        del self.active[name]
        print(f"driver: cancelled {name}", flush=True)

    def _fail(self, name: str, store, e: BaseException) -> None:
        from .errors import LoungeError

        traceback.print_exc()
        why = (
            str(e)
            if isinstance(e, LoungeError)
            else f"the run driver failed: {type(e).__name__}: {e}"
        )
        try:
            store.finish("failed", why)
            store.close()
        except Exception:  # noqa: BLE001
            pass
        self.active.pop(name, None)

    def _flush(self, a: _Active) -> None:
        fresh, a.driver.fresh = a.driver.fresh, []
        if fresh:
            a.store.add(a.driver.rows(fresh), a.driver.sent)
        a.flushed = time.monotonic()

    def step(self) -> None:
        for name, a in list(self.active.items()):
            try:
                a.driver.poke()
            except Exception as e:  # noqa: BLE001 - this run fails; the others go on
                self._flush(a)
                self._fail(name, a.store, e)
        futures = [f for a in self.active.values() for f in a.driver.flying]
        if futures:
            self.cluster.kind.wait_any(futures, 0.05)
        elif self.active or self.wake_fd is None:
            time.sleep(0.05 if self.active else LOOK_S)
        else:  # idle: until the next look, or a kernel wakes it
            select.select([self.wake_fd], [], [], LOOK_S)
        now = time.monotonic()
        for name, a in list(self.active.items()):
            try:
                a.driver.collect()
                if a.driver.fresh and (not a.driver.left or now - a.flushed >= FLUSH_S):
                    self._flush(a)
                if not a.driver.left:
                    a.store.finish("done")
                    a.store.close()
                    del self.active[name]
                    print(f"driver: {name} done", flush=True)
            except Exception as e:  # noqa: BLE001
                self._fail(name, a.store, e)

    def listen(self) -> None:
        """Be woken by ``WAKE``: the signal writes to a pipe that an idle driver waits on."""
        if WAKE is None:
            return
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        signal.signal(WAKE, lambda *_: None)
        self.wake_fd = r

    def _woken(self) -> bool:
        if self.wake_fd is None:
            return False
        try:
            return bool(os.read(self.wake_fd, 512))
        except BlockingIOError:
            return False

    def run(self) -> None:
        while True:
            now = time.monotonic()
            if now - self.stated >= STATE_S:
                self.stated = now
                if not self._state():
                    return
                self._connect()
            if self._woken() or now - self.looked >= LOOK_S:
                self.looked = now
                self._look()
            self.step()


def main(argv: list[str] | None = None) -> None:
    import fcntl

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        raise SystemExit("usage: python -m jupyter_lounge.runner CLUSTER_DIR CREATED")
    cdir, created = Path(argv[0]).absolute(), float(argv[1])
    os.environ["JUPYTER_LOUNGE_DIR"] = str(cdir.parent)
    from .protocol import write_json
    from .runstore import runs_dir

    folder = runs_dir(cdir.name)
    fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return  # another driver runs this cluster's runs
    runner = Runner(cdir.name, created)
    runner.listen()
    write_json(folder / PIDFILE, runner.me)
    print(f"driver: up for {cdir.name} (pid {os.getpid()})", flush=True)
    runner.run()
    print("driver: the cluster is stopped; leaving", flush=True)
    os._exit(0)  # no teardown of the client's threads: nothing is left to say


if __name__ == "__main__":
    main()
