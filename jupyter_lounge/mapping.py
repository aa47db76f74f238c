"""``lounge.map``: items sent in batches to every engine, the function shipped once, into a table.

The map driver runs in the cluster's run driver (``runner.py``), not in the kernel: a map is
a run (``runstore.py``), and outlives the kernel that started it. The function (and its closure)
is pickled once, its large buffers out of band (``tasks.pack``: an image the driver maps from
the run's folder), and sent with the first batch to one engine per node, as one buffer (Dask:
scattered to that worker, not in the task graph), which keeps it by the hash of that image
and leaves a copy in its agent's private folder for the engines beside it
(``tasks.run_batch``); later batches carry only items. On the local backend every agent's
folder is the cluster's, beside the run's: the driver links the run's image there before the
first batch, so no engine waits for it to cross the network (``_place``).

Batches are sized from the measured time per item: about ``TARGET_S`` of work each, so the
round trip is amortised over tiny items while slow ones go one by one, and never more than a
fair share of what is left, so every engine stays busy to the end. Each engine has
``IN_FLIGHT`` batches at most: one running, one waiting, never a pile. A batch whose engine
died (its future fails, or the engine is no longer registered) puts its items back at the
front of the queue, to run elsewhere, up to ``retries`` times each; an item's own error is
its row, never retried.

The result is a DataFrame in input order, one row per item: the parameters (a dict item's
keys, else ``item``), ``result`` and, when every result is a dict, its keys, then ``error``,
``engine``, ``node``, ``host``, ``seconds``.
"""

from __future__ import annotations

import math
import os
import pickle
import time
from collections import deque
from typing import Any

from .errors import LoungeError, LoungeTimeout
from .tasks import frame, key_of, pack, run_batch

TARGET_S = 0.1  # seconds of work one batch should hold, once the time per item is known
FIRST_BATCH = 1  # items in a batch before any item was timed
MAX_BATCH = 20_000  # items in one batch, however tiny they are
IN_FLIGHT = 2  # batches per engine at once: one running, one on its way
LOOK_EVERY_S = 0.5  # how often the driver asks which engines are registered
NODES_EVERY_S = 2.0  # how often it reads the agents' states (on Slurm: one squeue)
GONE = ("lost", "failed", "stopped", "controller-lost")  # a node's states with no engine
SHAKY_S = 3.0  # a node that just lost a batch gets none for this long, if others can take it
SHARE_WAIT_S = 30.0  # how long an engine waits for the copy of the function its sibling got


class _Driver:
    """One map's dispatch: which items are where, what came back. The run driver
    (``runner.py``) steps several at once over one client: ``poke`` sends what can be sent,
    ``collect`` takes what came back, and ``fresh`` holds the positions finished since it was
    last emptied (the rows to store)."""

    def __init__(
        self,
        cluster,
        fn,
        items: list,
        retries: int,
        timeout: float | None,
        *,
        todo=None,
        nodes=None,
        key: str | None = None,
        source: str | None = None,
    ):
        self.kind, self.client, self.cluster = cluster.kind, cluster.client, cluster
        self.items, self.retries = items, retries
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.timeout = timeout
        if key is None:  # a function, not its image (stored with its key by the run's kernel)
            pieces = frame(pack(fn))
            fn, key = b"".join(pieces), key_of(pieces)
        self.key = key
        self.function = memoryview(fn)  # the image, to one engine per node (_function_for)
        self.placed = source is not None and self._place(source)  # every engine reads it
        self.nodes = None if nodes is None else set(nodes)  # a pool's: only engines there
        n = len(items)
        self.todo: deque[int] = deque(range(n) if todo is None else todo)
        self.left = len(self.todo)
        self.fresh: list[int] = []  # finished since the run driver last stored rows
        self.result: list[Any] = [None] * n  # each pickled, as the engine sent it
        self.error: list[str | None] = [None] * n
        self.engine = [-1] * n
        self.node = [""] * n
        self.host = [""] * n
        self.seconds = [math.nan] * n
        self.tries = [0] * n
        self.flying: dict[Any, tuple[Any, list[int]]] = {}  # future -> (engine, item indices)
        self.has_function: set = set()  # engines that have the function, or are getting it
        self.holder: dict[str, Any] = {}  # node -> the engine that was sent the function
        self.direct: set = set()  # engines that found no sibling's copy: send it to them
        self.sent = 0  # batches that carried the function
        self.ready: set = set()  # engines that finished a batch: they have the function
        self.dead: set = set()  # engines that lost a batch: none is sent another
        self.shaky: dict[str, float] = {}  # node -> until when it gets no batch (it lost one)
        self.per_item: float | None = None  # seconds of work per item, smoothed
        self.engines: dict = {}  # engine -> its node
        self.looked = 0.0  # when the engines were last asked for
        self.states: list[dict] = []  # the nodes' states (nodes_status), read by _node_rows
        self.states_read = -math.inf  # when
        self.gone: dict[str, str] = {}  # node -> why it is gone (its agent's state)

    # -- the loop ------------------------------------------------------------------------------
    def run(self, bar) -> None:
        """Dispatch every item (this driver alone; the run driver steps several)."""
        while self.left:
            if not self.poke():
                time.sleep(0.05)
                continue
            self.kind.wait_any(list(self.flying), 0.05)
            bar.update(self.collect())

    def poke(self) -> bool:
        """Send what can be sent; whether a batch is out (if none is, the items' engines may
        all be gone: then their rows say so)."""
        self._look()
        self._fill()
        if not self.flying:
            self._idle()
        self._check_deadline()
        return bool(self.flying)

    def collect(self) -> int:
        """Take the batches that came back; how many items they finished."""
        return sum(self._take(f) for f in [f for f in self.flying if f.done()])

    def stop(self) -> None:
        """Cancel what is out (a cancelled run)."""
        for future in self.flying:
            try:
                future.cancel()
            except Exception:  # noqa: BLE001 - its engine is gone already
                pass
        self.flying.clear()

    def rows(self, indices: list[int]) -> list[tuple]:
        """The store's rows of these items: (idx, result, error, engine, node, host, s)."""
        return [
            (
                i,
                self.result[i],
                self.error[i],
                self.engine[i],
                self.node[i],
                self.host[i],
                None if math.isnan(self.seconds[i]) else self.seconds[i],
            )
            for i in indices
        ]

    def _look(self) -> None:
        """Which engines are registered; the batches of any that left go back in the queue."""
        now = time.monotonic()
        if now - self.looked < LOOK_EVERY_S and self.engines:
            return
        self.looked = now
        # A node that is lost (its SSH session ended, it stopped reporting, its Slurm job
        # ended) takes its engines with it, whether or not the controller has noticed: its
        # heartbeat is slow on purpose (cluster.heartbeat_for), a Dask comm to a powered-off
        # PC stays open until TCP gives up.
        self.gone = _gone_nodes(self._node_rows(NODES_EVERY_S))
        found = self.kind.engines(self.client)
        found = {e: node for e, node in found.items() if node not in self.gone}
        if found and set(found) <= self.dead:  # every engine registered now lost a batch:
            self.dead -= set(found)  # they are alive (a dead one leaves), so try them again
        before = self.engines
        self.engines = {
            e: node
            for e, node in found.items()
            if e not in self.dead and (self.nodes is None or node in self.nodes)
        }
        here = set(self.engines)
        self.holder = {node: e for node, e in self.holder.items() if e in here}
        self.ready &= here
        self.has_function &= here
        for future, (engine, indices) in list(self.flying.items()):
            if engine not in here and not future.done():
                del self.flying[future]
                future.cancel()
                node = before.get(engine)
                why = (
                    f"its node ({node}) was lost: {self.gone[node]}"
                    if node in self.gone
                    else f"its engine ({engine}) left the cluster"
                )
                self._lost(indices, why, engine)

    def _node_rows(self, max_age: float) -> list[dict]:
        """The cluster's ``nodes_status`` rows, read again when older than ``max_age`` s (each
        read is every agent's report, and on Slurm a squeue)."""
        if time.monotonic() - self.states_read >= max_age:
            self.states, self.states_read = self.cluster.nodes_status(), time.monotonic()
        return self.states

    def _fill(self) -> None:
        """Give each engine batches until it has ``IN_FLIGHT`` (one until its first is back:
        a second could run first, before the function arrived, as Dask may order them)."""
        busy: dict[Any, int] = {}
        for engine, _ in self.flying.values():
            busy[engine] = busy.get(engine, 0) + 1
        now = time.monotonic()
        steady = [e for e, node in self.engines.items() if self.shaky.get(node, 0) < now]
        for _ in range(IN_FLIGHT):
            for engine in steady or list(self.engines):
                if not self.todo:
                    return
                if busy.get(engine, 0) < (IN_FLIGHT if engine in self.ready else 1):
                    self._send(engine, self._batch())
                    busy[engine] = busy.get(engine, 0) + 1

    def _batch(self) -> list[int]:
        left = len(self.todo)
        fair = math.ceil(left / (max(1, len(self.engines)) * 4))
        want = FIRST_BATCH if self.per_item is None else TARGET_S / max(self.per_item, 1e-7)
        size = max(1, min(int(want), fair, MAX_BATCH))
        return [self.todo.popleft() for _ in range(min(size, left))]

    def _send(self, engine, indices: list[int]) -> None:
        import cloudpickle

        first, last = indices[0], indices[-1]
        if last - first == len(indices) - 1:  # the usual: a run of the queue
            items = self.items[first : last + 1]
        else:  # items put back after a lost batch
            items = [self.items[i] for i in indices]
        batch = cloudpickle.dumps(items, protocol=5)
        function, wait_s = self._function_for(engine)
        try:
            future = self.kind.submit_to(
                self.client, engine, run_batch, self.key, batch, function, wait_s
            )
        except Exception:  # noqa: BLE001 - it left since the last look: not a try of these
            self.todo.extendleft(reversed(indices))
            self.engines.pop(engine, None)
            self.holder = {n: e for n, e in self.holder.items() if e != engine}
            self.looked = 0.0
            return
        self.has_function.add(engine)
        self.sent += function is not None
        self.flying[future] = (engine, indices)

    def _place(self, source: str) -> bool:
        """On the local backend, link the run's image (``source``) where every engine looks
        for its siblings' copy (the cluster's folder: owner-only, the link made whole at once);
        whether it is there."""
        from .tasks import prune, shared_path

        backend = getattr(self.cluster, "backend", None)
        if getattr(backend, "name", "") != "local":
            return False
        path = shared_path(str(self.cluster.dir), self.key)
        try:
            os.link(source, path)
        except FileExistsError:
            pass
        except OSError:  # another file system: the first batch carries it, as elsewhere
            return False
        prune(str(self.cluster.dir))
        return True

    def _function_for(self, engine) -> tuple[Any, float]:
        """What a batch to ``engine`` carries of the function: nothing once it has it (or
        when the driver placed it beside every engine); the function itself to one engine
        per node; to the others, how long to wait for the copy that engine leaves on the
        node."""
        if engine in self.has_function:
            return None, 0.0
        if self.placed and engine not in self.direct:
            return None, 0.0
        node = self.engines.get(engine)
        holder = self.holder.get(node)
        if holder is None or engine in self.direct:
            self.holder.setdefault(node, engine)
            return self.function, 0.0
        return None, SHARE_WAIT_S

    def _take(self, future) -> int:
        """Record a finished batch; the number of items it finished."""
        engine, indices = self.flying.pop(future)
        try:
            out = self.kind.outcome(future)
        except Exception as e:  # noqa: BLE001 - the engine died or could not send it back
            self._lost(indices, f"{type(e).__name__}: {e}", engine)
            return 0
        if "missing" in out:  # no sibling's copy, or a new engine behind an old id
            self.has_function.discard(engine)
            self.direct.add(engine)
            self.todo.extendleft(reversed(indices))
            return 0
        self.ready.add(engine)
        results = pickle.loads(out["results"])  # each still pickled: no user type here
        first, last, k = indices[0], indices[-1], len(indices)
        if last - first == k - 1:  # a run: whole slices at once (a million items stay cheap)
            self.result[first : last + 1] = results
            self.seconds[first : last + 1] = out["seconds"]
            self.engine[first : last + 1] = [out["engine"]] * k
            self.node[first : last + 1] = [out["node"]] * k
            self.host[first : last + 1] = [out["host"]] * k
        else:
            for i, result, seconds in zip(indices, results, out["seconds"]):
                self.result[i], self.seconds[i] = result, seconds
                self.engine[i], self.node[i], self.host[i] = out["engine"], out["node"], out["host"]
        for position, error in out["errors"].items():
            self.error[indices[int(position)]] = error
        work = sum(out["seconds"]) / len(indices)
        self.per_item = work if self.per_item is None else 0.5 * (self.per_item + work)
        self.left -= len(indices)
        self.fresh.extend(indices)
        return len(indices)

    def _lost(self, indices: list[int], why: str, engine) -> None:
        """Items whose batch was lost: back to the front of the queue, or, after ``retries``
        tries each, a row saying so. The engine that lost it gets no other batch (an engine
        id is never reused: a replacement registers anew), so the items go elsewhere."""
        self.dead.add(engine)
        node = self.engines.pop(engine, None)
        if node is not None:  # its siblings may be going too (an eviction, a power cut)
            self.shaky[node] = time.monotonic() + SHAKY_S
        again = []
        for i in indices:
            self.tries[i] += 1
            if self.tries[i] > self.retries:
                self.error[i] = f"lost: {why}"
                self.fresh.append(i)
                self.left -= 1
            else:
                again.append(i)
        self.todo.extendleft(reversed(again))
        # in the run's driver.log: what a map that stalls or loses items went through
        print(
            f"driver: lost a batch on engine {engine} ({why}): items back in the queue "
            f"{len(again)}, given up {len(indices) - len(again)}",
            flush=True,
        )

    def _idle(self) -> None:
        """No batch is out: no engine yet, or none left. Wait for one, or say why not (the
        agents' reports are read at most once per look, not on every pass)."""
        reason = _all_engines_gone(self._node_rows(LOOK_EVERY_S), self.nodes)
        if reason:  # nothing is left to run them: report them, do not hang
            self._lost_all(reason)

    def _lost_all(self, reason: str) -> None:
        for i in self.todo:
            self.error[i] = f"lost: {reason}"
        self.fresh.extend(self.todo)
        self.left -= len(self.todo)
        self.todo.clear()

    def _check_deadline(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            for future in self.flying:
                future.cancel()
            raise LoungeTimeout(
                f"Timed out after {self.timeout:g} s waiting for map results: "
                f"{self.left} of {len(self.items)} items unfinished."
            )

    # -- the table -----------------------------------------------------------------------------
    def table(self):
        results = [None if r is None else pickle.loads(r) for r in self.result]
        df = make_table(
            self.items, results, self.error, self.engine, self.node, self.host, self.seconds
        )
        df.attrs["function_sent"] = self.sent  # batches that carried the function (tests)
        return df


def make_table(items, result, error, engine, node, host, seconds, index=None):
    """The map's DataFrame: a row per item, parameters first (a dict item's keys, else
    ``item``), then ``result`` and, when every result is a dict, its keys, then ``error``,
    ``engine``, ``node``, ``host``, ``seconds``; indexed by each item's position."""
    import pandas as pd

    n = len(items)
    if n and not any(isinstance(item, dict) for item in items):
        columns: dict[str, list] = {"item": list(items)}
    else:
        params = [dict(item) if isinstance(item, dict) else {"item": item} for item in items]
        keys = list(dict.fromkeys(k for p in params for k in p))
        columns = {k: [p.get(k) for p in params] for k in keys}
    columns["result"] = result
    results = [r for r, e in zip(result, error) if e is None]
    if results and all(isinstance(r, dict) for r in results):
        for key in dict.fromkeys(k for r in results for k in r):
            if key not in columns:
                columns[key] = [r.get(key) if isinstance(r, dict) else None for r in result]
    columns.update(error=error, engine=engine, node=node, host=host, seconds=seconds)
    return pd.DataFrame(columns, index=range(n) if index is None else list(index))


def map_items(
    cluster,
    fn,
    items,
    *,
    retries: int = 1,
    timeout: float | None = None,
    progress: bool = True,
    name: str | None = None,
    pool: str | None = None,
):
    """Run ``fn`` on every item; a dict item is passed as keyword arguments (a sweep).

    The map is a run (see runstore.py): its function and items go to the run's store, the
    cluster's run driver dispatches them, and this follows the store until the run is done.
    Returns a DataFrame in input order (see the module's docstring for its columns). A
    ``timeout`` ends the wait, not the run; an interrupt (Ctrl-C) cancels the run.
    """
    from . import runner, runstore

    if not callable(fn):
        raise LoungeError(f"map needs a function to call, not {type(fn).__name__}.")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise LoungeError(f"retries must be a whole number of 0 or more, not {retries!r}.")
    items = list(items)
    nodes = None
    if pool is not None:
        nodes = pool_nodes(cluster, pool)
    function = pack(fn)
    name = runstore.create(
        cluster.name, name, function, items, retries=retries, pool=pool, nodes=nodes
    )
    runner.ensure(cluster.name)
    run = runstore.Run(cluster.name, name)
    try:
        return run.wait(timeout, progress)
    except KeyboardInterrupt:  # Ctrl-C on the cell: the researcher wants this map stopped
        run.cancel()
        raise


def pool_nodes(cluster, pool: str) -> list[str]:
    """The nodes of ``pool`` that run engines of this cluster; a sentence when none does."""
    if not isinstance(pool, str) or not pool:
        raise LoungeError(f"pool must be a pool's name, not {pool!r}.")
    members = set(cluster.backend.pool_nodes(pool))
    placed = {r["node"] for r in cluster.nodes_status() if r["status"] not in ("lost", "failed")}
    here = sorted(members & placed)
    if not here:
        raise LoungeError(
            f"Pool {pool!r} has no engine in cluster {cluster.name!r}: its nodes "
            f"({', '.join(sorted(members)) or 'none'}) run none of its engines (they are on "
            f"{', '.join(sorted(placed)) or 'no node'}); scale the cluster or map on another pool."
        )
    return here


def _gone_nodes(rows: list[dict]) -> dict[str, str]:
    """The nodes of these ``nodes_status`` rows whose agent is gone, and why (its status, as
    ``lounge status`` shows it)."""
    return {r["node"]: str(r["error"] or r["status"]) for r in rows if r["status"] in GONE}


def _all_engines_gone(rows: list[dict], nodes: set | None = None) -> str | None:
    """Why no engine of the cluster (these are its ``nodes_status`` rows; on ``nodes``, a
    pool's) can ever run an item again, or None while one can."""
    if nodes is not None:
        rows = [r for r in rows if r["node"] in nodes]
        if not rows:
            return f"no node of its pool ({', '.join(sorted(nodes))}) is in the cluster now"
    if rows and all(r["status"] in GONE for r in rows):
        return "; ".join(dict.fromkeys(str(r["error"] or r["status"]) for r in rows))
    return None
