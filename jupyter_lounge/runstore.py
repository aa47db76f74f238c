"""Runs: a map that outlives the notebook that started it.

A run is a name, its items, its function (pickled once) and a store of rows: one SQLite file
per run in the cluster's folder (``runs/NAME.sqlite``, mode 0600 in a 0700 folder), and the
function's image beside it (``runs/NAME@TOKEN.fn``, see ``tasks.frame``; ``@`` is in no run
name): written once, synced once, and named with its key in the store's ``job``, so a 40 MB
closure never goes through SQLite's log and the driver maps it rather than reads it. The
kernel that maps writes the run's function and items there and follows it; the cluster's run
driver (``runner.py``, one process per cluster, started and stopped with it) dispatches the
batches and appends each finished row, committed at most ``FLUSH_S`` after it finished. So a
kernel that dies loses nothing: the driver goes on, and any process reads the rows.

Rows are keyed by the item's position: a row is written once, whatever happens (a driver that
died and came back sends again only the items not yet in the store).

A run's ``status``: ``submitted`` (no driver took it yet), ``running``, ``done``,
``cancelled``, ``failed`` (``error`` says why), and, as read, ``stalled`` (``running`` but its
driver is gone while the cluster runs: following the run, or listing the cluster's runs,
restarts the driver, which resumes it).

The store's runs are kept with the cluster's folder: ``lounge stop`` keeps them readable,
``lounge stop --forget`` or ``Run.delete()`` removes them.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import time
import warnings
from pathlib import Path
from typing import Any

from .errors import LoungeError, LoungeTimeout, NoSuchRun
from .paths import lounge_dir
from .state import NAME_RE, check_name, load_state

ACTIVE = ("submitted", "running")  # as stored: a driver has it, or will
UNDER_WAY = ACTIVE + ("stalled",)  # as read: not ended (a stalled one waits for its driver)
NEEDS_DRIVER = ("submitted", "stalled")  # as read: no driver has it now
FLUSH_S = 0.2  # a finished row is committed at most this long after the driver got it
FOLLOW_S = 0.2  # how often a follower reads the store (more often in a run's first seconds)
BUSY_MS = 10_000  # a writer waits this long for another one (SQLite's busy timeout)

SCHEMA = """
CREATE TABLE run (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    name TEXT NOT NULL, cluster TEXT NOT NULL, status TEXT NOT NULL, error TEXT,
    total INTEGER NOT NULL, done INTEGER NOT NULL DEFAULT 0, errors INTEGER NOT NULL DEFAULT 0,
    started REAL NOT NULL, finished REAL, retries INTEGER NOT NULL, pool TEXT,
    nodes TEXT, cancel INTEGER NOT NULL DEFAULT 0, driver TEXT, function_sent INTEGER
);
CREATE TABLE job (id INTEGER PRIMARY KEY CHECK (id = 1), function BLOB,
    items BLOB NOT NULL, function_file TEXT, function_key TEXT);
CREATE TABLE rows (idx INTEGER PRIMARY KEY, result BLOB, error TEXT, engine INTEGER,
    node TEXT, host TEXT, seconds REAL);
"""


class PartialResult(UserWarning):
    """A run's table read before it finished: only the rows done so far."""


warnings.simplefilter("always", PartialResult)  # each read says so, not only the first


# -- where runs live ---------------------------------------------------------------------------
def runs_dir(cluster: str, make: bool = True) -> Path:
    """The folder of a cluster's runs (made 0700 when ``make``)."""
    from .trust import UntrustedPath, private_dir

    path = lounge_dir() / check_name(cluster) / "runs"
    if make:
        try:
            private_dir(str(lounge_dir() / cluster), "cluster folder")
            private_dir(str(path), "runs folder")
        except UntrustedPath as e:
            raise LoungeError(str(e)) from None
    return path


def check_run_name(name: str) -> str:
    return check_name(name, "Run")


def store_path(cluster: str, name: str) -> Path:
    return runs_dir(cluster, make=False) / f"{check_run_name(name)}.sqlite"


def _connect(path: Path, write: bool = False) -> sqlite3.Connection:
    """A connection to a run's store; the file is in WAL mode from its creation, so readers
    never wait for the driver, nor it for them."""
    db = sqlite3.connect(path, timeout=BUSY_MS / 1000, isolation_level=None)
    if write:
        db.execute("PRAGMA synchronous=FULL")  # a committed row survives a power cut too
    return db


def cluster_names() -> list[str]:
    """Every cluster folder that holds runs (running clusters and stopped ones alike)."""
    root = lounge_dir()
    return sorted(
        p.parent.name
        for p in root.glob("*/runs")
        if NAME_RE.match(p.parent.name) and not p.parent.is_symlink()
    )


def names(cluster: str) -> list[str]:
    folder = runs_dir(cluster, make=False)
    return sorted(p.stem for p in folder.glob("*.sqlite") if NAME_RE.match(p.stem))


def function_files(cluster: str, name: str) -> list[Path]:
    """The function images of a run (one; more only while a kernel that chose that name
    lost the race for it)."""
    return list(runs_dir(cluster, make=False).glob(f"{check_run_name(name)}@*.fn"))


# -- writing (the kernel that maps; the driver) ------------------------------------------------
def create(
    cluster: str,
    name: str | None,
    function: list,
    items: list,
    *,
    retries: int,
    pool: str | None = None,
    nodes: list[str] | None = None,
) -> str:
    """Write a new run's store (status ``submitted``) and its function's image (``function``:
    ``tasks.pack``'s parts); its name, made when not given."""
    import secrets

    import cloudpickle

    from .tasks import frame, key_of, write_image

    folder = runs_dir(cluster)
    if name is not None:
        check_run_name(name)
    blob = cloudpickle.dumps(items, protocol=5)
    pieces = frame(function)
    key, token = key_of(pieces), secrets.token_hex(4)
    image = folder / f".{os.getpid()}.{token}.fn"
    write_image(str(image), pieces, sync=True)  # on disk before a store names it
    tries = 0
    try:
        while True:
            chosen = name or _free_name(cluster)
            function_file = f"{chosen}@{token}.fn"
            os.replace(image, folder / function_file)  # named for its run before it exists
            image = folder / function_file
            if _store(folder, chosen, cluster, retries, pool, nodes, len(items), blob, image, key):
                return chosen
            tries += 1
            if name is not None:
                raise LoungeError(
                    f"Cluster {cluster!r} already has a run named {name!r}: choose another "
                    f"name=, or delete it with `lounge.run({name!r}).delete()`."
                )
            if tries > 100:
                raise LoungeError(f"No free run name in {folder}.")
    except BaseException:
        image.unlink(missing_ok=True)
        raise


def _store(folder, chosen, cluster, retries, pool, nodes, n, blob, image, key) -> bool:
    """Make the store of run ``chosen``; False when a run of that name exists."""
    final = folder / f"{chosen}.sqlite"
    tmp = folder / f".{chosen}.{os.getpid()}.tmp"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    os.close(fd)
    db = sqlite3.connect(tmp, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=WAL")  # kept by the file: every later opener's
        db.executescript(SCHEMA)
        db.execute("BEGIN")
        db.execute(
            "INSERT INTO run (id, name, cluster, status, total, started, retries, pool, nodes)"
            " VALUES (1, ?, ?, 'submitted', ?, ?, ?, ?, ?)",
            (chosen, cluster, n, time.time(), retries, pool, _json(nodes)),
        )
        db.execute(
            "INSERT INTO job (id, items, function_file, function_key) VALUES (1, ?, ?, ?)",
            (blob, image.name, key),
        )
        db.execute("COMMIT")
    finally:
        db.close()
    try:
        os.link(tmp, final)  # all or nothing, and never over a run of the same name
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)


def _free_name(cluster: str) -> str:
    taken = set(names(cluster))
    i = 1
    while f"run-{i}" in taken:
        i += 1
    return f"run-{i}"


def _json(value) -> str | None:
    return None if value is None else json.dumps(value)


def _meta(db: sqlite3.Connection) -> dict:
    """The run's one row of ``run``, by column."""
    cur = db.execute("SELECT * FROM run WHERE id = 1")
    return dict(zip([c[0] for c in cur.description], cur.fetchone()))


class Store:
    """One run's SQLite file, as the driver writes it."""

    def __init__(self, path: Path):
        self.path = path
        self.db = _connect(path, write=True)

    def close(self) -> None:
        self.db.close()

    def meta(self) -> dict:
        return _meta(self.db)

    def job(self) -> tuple[str, Any, bytes, str | None]:
        """The function's key and image (mapped from its file), the pickled items, and the
        image's file."""
        from .tasks import frame, key_of, map_image

        columns = {r[1] for r in self.db.execute("PRAGMA table_info(job)")}
        if "function_file" in columns:
            file, key, items = self.db.execute(
                "SELECT function_file, function_key, items FROM job WHERE id = 1"
            ).fetchone()
            if file:
                if "/" in file or not file.endswith(".fn"):
                    raise LoungeError(f"Run store {self.path} names no function file: {file!r}.")
                path = str(self.path.parent / file)
                return key, map_image(path), items, path
        function, items = self.db.execute("SELECT function, items FROM job WHERE id = 1").fetchone()
        pieces = frame([function])  # a run stored before the images: its function in the store
        return key_of(pieces), b"".join(pieces), items, None

    def done(self) -> set[int]:
        return {i for (i,) in self.db.execute("SELECT idx FROM rows")}

    def take(self, driver: list) -> None:
        """Mark the run as this driver's (``[pid, start]``), counting what is stored."""
        done, errors = self.db.execute("SELECT count(*), count(error) FROM rows").fetchone()
        self.db.execute(
            "UPDATE run SET status = 'running', driver = ?, done = ?, errors = ? WHERE id = 1",
            (json.dumps(driver), done, errors),
        )

    def add(self, rows: list[tuple], function_sent: int) -> None:
        """Append finished rows ``(idx, result, error, engine, node, host, seconds)`` in one
        transaction; a row already there stays as it was."""
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            before = db.total_changes
            db.executemany("INSERT OR IGNORE INTO rows VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
            added = db.total_changes - before
            errors = sum(1 for r in rows if r[2] is not None) if added == len(rows) else None
            if errors is None:  # some were there already: count exactly
                db.execute(
                    "UPDATE run SET done = (SELECT count(*) FROM rows), "
                    "errors = (SELECT count(error) FROM rows), function_sent = ? WHERE id = 1",
                    (function_sent,),
                )
            else:
                db.execute(
                    "UPDATE run SET done = done + ?, errors = errors + ?, function_sent = ? "
                    "WHERE id = 1",
                    (added, errors, function_sent),
                )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def finish(self, status: str, error: str | None = None) -> None:
        self.db.execute(
            "UPDATE run SET status = ?, error = ?, finished = ? WHERE id = 1",
            (status, error, time.time()),
        )

    def cancel_asked(self) -> bool:
        return bool(self.db.execute("SELECT cancel FROM run WHERE id = 1").fetchone()[0])


# -- reading (any process) ---------------------------------------------------------------------
def _driver_alive(meta: dict) -> bool:
    from .procs import ours

    driver = json.loads(meta["driver"]) if meta.get("driver") else None
    return bool(driver) and ours(driver[0], driver[1])


def _cluster_running(cluster: str) -> bool:
    """Whether the cluster the run belongs to still runs (the one it was started on, or a
    later one of the same name: its driver would take the run up)."""
    from .cluster import in_use

    try:
        data = load_state(cluster)
    except LoungeError:
        return False
    return data is not None and in_use(data)


class Run:
    """A handle on one run: ``summary()``, ``result()``, ``wait()``, ``cancel()``,
    ``delete()``. Any process can hold one; nothing of the run lives in it."""

    def __init__(self, cluster: str, name: str):
        self.cluster, self.name = check_name(cluster), check_run_name(name)
        self.path = store_path(cluster, name)
        if not self.path.exists():
            known = ", ".join(names(cluster)) if runs_dir(cluster, make=False).is_dir() else ""
            raise NoSuchRun(
                f"Cluster {cluster!r} has no run named {name!r} (its runs: {known or 'none'}); "
                f"see `lounge runs {cluster}`."
            )

    def __repr__(self) -> str:
        s = self.summary()
        return f"<Run {self.name!r} of {self.cluster!r}: {s['status']}, {s['done']}/{s['total']}>"

    def _meta(self) -> dict:
        db = _connect(self.path)
        try:
            return _meta(db)
        finally:
            db.close()

    def summary(self) -> dict:
        """name, cluster, status, error, done, total, errors, started, finished, pool; and
        ``load_code``: the line that loads its table in a notebook."""
        meta = self._meta()
        status, error = meta["status"], meta["error"]
        if status == "running" and not _driver_alive(meta):
            if _cluster_running(self.cluster):
                status = "stalled"
                error = (
                    "its driver is gone; it resumes once the driver is back (following the "
                    f"run or `lounge runs {self.cluster}` restarts it)"
                )
            else:
                status, error = "failed", f"its cluster {self.cluster!r} is gone"
        return {
            "name": self.name,
            "cluster": self.cluster,
            "status": status,
            "error": error,
            "done": meta["done"],
            "total": meta["total"],
            "errors": meta["errors"],
            "started": meta["started"],
            "finished": meta["finished"],
            "pool": meta["pool"],
            "load_code": (
                "from jupyter_lounge import run\n"
                f"df = run({self.name!r}, cluster={self.cluster!r}).result()"
            ),
        }

    def result(self):
        """The run's table: one row per item in input order (see mapping.py for the
        columns). Read while the run is not done, it holds the rows done so far, and a
        ``PartialResult`` warning says so."""
        import cloudpickle

        db = _connect(self.path)
        try:
            db.execute("BEGIN")  # one snapshot: the rows and the count agree
            meta = _meta(db)
            items = cloudpickle.loads(db.execute("SELECT items FROM job").fetchone()[0])
            rows = db.execute("SELECT * FROM rows ORDER BY idx").fetchall()
            db.execute("COMMIT")
        finally:
            db.close()
        from .mapping import make_table

        n = meta["total"]
        complete = len(rows) == n
        index = range(n) if complete else [r[0] for r in rows]
        columns = list(zip(*rows)) if rows else [[]] * 7
        results = [_unpack(blob) for blob in columns[1]]
        df = make_table(
            [items[i] for i in index] if not complete else items,
            results,
            list(columns[2]),
            list(columns[3]),
            list(columns[4]),
            list(columns[5]),
            [math.nan if s is None else s for s in columns[6]],
            index=index,
        )
        status = self.summary()["status"] if not complete else meta["status"]
        df.attrs.update(
            run=self.name,
            cluster=self.cluster,
            status=status,
            done=len(rows),
            total=n,
            function_sent=meta["function_sent"] or 0,
        )
        if not complete:
            warnings.warn(
                PartialResult(
                    f"Run {self.name!r} is {status}: {len(rows)} of {n} items done; this table "
                    "holds those rows only."
                ),
                stacklevel=2,
            )
        return df

    def wait(self, timeout: float | None = None, progress: bool = True):
        """Follow the run until it ends; its table. A driver found gone is started again
        (the run resumes); a run that failed or was cancelled raises, saying so."""
        from . import runner

        deadline = None if timeout is None else time.monotonic() + timeout
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=self._meta()["total"], desc=self.name, unit="item")
        shown, looked, began = 0, 0.0, time.monotonic()
        try:
            while True:
                s = self.summary()
                if bar is not None and s["done"] > shown:
                    bar.update(s["done"] - shown)
                    shown = s["done"]
                if s["status"] not in UNDER_WAY:
                    break
                if s["status"] in NEEDS_DRIVER and time.monotonic() - looked > 1:
                    looked = time.monotonic()
                    runner.ensure(self.cluster)
                if deadline is not None and time.monotonic() > deadline:
                    raise LoungeTimeout(
                        f"Timed out after {timeout:g} s waiting for run {self.name!r} "
                        f"({s['done']} of {s['total']} items done); it goes on: follow it with "
                        f"run({self.name!r}, cluster={self.cluster!r}).wait(), or .cancel() it."
                    )
                # often at first (a short run ends soon), then every FOLLOW_S
                time.sleep(min(FOLLOW_S, max(0.01, (time.monotonic() - began) / 20)))
        finally:
            if bar is not None:
                bar.close()
        if s["status"] == "done":
            return self.result()
        raise LoungeError(
            f"Run {self.name!r} {s['status']}"
            + (f": {s['error']}" if s["error"] else "")
            + f" ({s['done']} of {s['total']} items done); its rows so far: "
            f"run({self.name!r}, cluster={self.cluster!r}).result()."
        )

    def cancel(self) -> None:
        """Stop the run: no more batches go out, those out are interrupted; the rows done so
        far stay readable."""
        db = _connect(self.path, write=True)
        try:
            db.execute("BEGIN IMMEDIATE")
            status = db.execute("SELECT status FROM run WHERE id = 1").fetchone()[0]
            db.execute("UPDATE run SET cancel = 1 WHERE id = 1")
            if status == "submitted" or (
                status == "running" and not _driver_alive(_meta(db))
            ):  # no driver will see the flag: cancel it here
                db.execute(
                    "UPDATE run SET status = 'cancelled', finished = ? WHERE id = 1",
                    (time.time(),),
                )
            db.execute("COMMIT")
        finally:
            db.close()

    def delete(self) -> None:
        """Remove the run and its rows (not while it is running: cancel it first)."""
        if self.summary()["status"] in UNDER_WAY:
            raise LoungeError(
                f"Run {self.name!r} is still running: cancel it first "
                f"(run({self.name!r}, cluster={self.cluster!r}).cancel())."
            )
        for suffix in ("", "-wal", "-shm"):
            try:
                os.unlink(f"{self.path}{suffix}")
            except FileNotFoundError:
                pass
        for path in function_files(self.cluster, self.name):
            path.unlink(missing_ok=True)


def _unpack(blob: bytes | None) -> Any:
    import pickle

    return None if blob is None else pickle.loads(blob)


def run(name: str, cluster: str | None = None) -> Run:
    """The run called ``name``: of ``cluster``, or of whichever cluster has one of that name
    (running or stopped, as long as its folder is kept)."""
    check_run_name(name)
    if cluster is not None:
        return Run(cluster, name)
    holders = [c for c in cluster_names() if store_path(c, name).exists()]
    if len(holders) == 1:
        return Run(holders[0], name)
    if not holders:
        raise NoSuchRun(f"No run named {name!r} in any cluster; see `lounge runs`.")
    raise LoungeError(
        f"Clusters {', '.join(holders)} each have a run named {name!r}: say which, e.g. "
        f"run({name!r}, cluster={holders[0]!r})."
    )


def runs(cluster: str | None = None) -> list[dict]:
    """The summary of every run of ``cluster`` (all clusters when None), oldest first."""
    clusters = [check_name(cluster)] if cluster is not None else cluster_names()
    out = []
    for c in clusters:
        if not runs_dir(c, make=False).is_dir():
            continue
        for name in names(c):
            try:
                out.append(Run(c, name).summary())
            except (LoungeError, sqlite3.Error):
                continue  # deleted meanwhile, or a store still being written
    return sorted(out, key=lambda s: s["started"])


def active(cluster: str) -> list[str]:
    """Names of the cluster's runs not yet ended (what a stop would cut short)."""
    return [s["name"] for s in runs(cluster) if s["status"] in UNDER_WAY]


def fail_unfinished(cluster: str, why: str) -> None:
    """Mark every run of the cluster still under way failed (its cluster is stopping)."""
    if not runs_dir(cluster, make=False).is_dir():
        return
    for name in names(cluster):
        try:
            db = _connect(store_path(cluster, name), write=True)
        except sqlite3.Error:
            continue
        try:
            db.execute(
                "UPDATE run SET status = 'failed', error = ?, finished = ? "
                "WHERE id = 1 AND status IN ('submitted', 'running')",
                (why, time.time()),
            )
        except sqlite3.Error:
            pass
        finally:
            db.close()
