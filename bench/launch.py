"""Launch benchmark: seconds and memory until N engines have each run a TensorFlow op.

For every N (8, 16, 32; 64 too with ``--big``) and every way, this measures

* seconds: from just before starting the cluster until all N engines are registered AND
  every one of them has imported TensorFlow and run ``tf.reduce_sum(tf.ones((8, 8)))``;
* pss_mib: the summed PSS (``psutil...memory_full_info().pss``, MiB) of the engine
  processes at that moment, all of them still alive, plus the process they were forked
  from where there is one (our node agent, the floor's parent): PSS splits each shared
  page between the processes that share it, so leaving the parent out would hide part of
  the shared TensorFlow pages.

The ways:

* ours: ``Lounge(N, engines="ipyparallel", preload=["tensorflow"], wait=True)``; engines
  are forked from a node agent that has imported TensorFlow. Processes counted: the
  agents and all their descendants.
* ours-dask: the same with ``engines="dask"``; the op runs through ``client.run``.
* ipyparallel: stock ``ipyparallel.Cluster(n=N)``; the engines import TensorFlow when the
  op is applied. Counted: our descendants whose command line holds ``ipyparallel.engine``:
  the engines and the nanny process stock ipyparallel starts beside each (not the
  controller); a note says how much of it is in the nannies.
* dask: stock ``LocalCluster(processes=True, threads_per_worker=1, memory_limit=0)``.
  Counted: the worker processes (pids reported by the workers). The nannies live inside
  this process under LocalCluster, so there is no nanny process to count.
* floor: one fresh python imports TensorFlow, forks N children that each run the op; time
  is measured inside that python from before the import until all children are reaped,
  minus the pause in which this process samples the children's PSS (all alive, op done).

Each way starts from a fresh state and is stopped (and any leftover process killed)
before the next. A way that fails or times out is recorded as None. Nothing is asserted.

    python bench/launch.py [--sizes 8,16] [--big] [--ways ours,floor] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time

import psutil
from _common import TIMEOUT, markdown_table, run_everywhere, with_timeout

WAYS = ("ours", "ours-dask", "ipyparallel", "dask", "floor")
MIB = 2**20


def tf_op() -> float:
    """Runs in each engine: defined here, so it is sent by value, not imported there."""
    import tensorflow as tf

    return float(tf.reduce_sum(tf.ones((8, 8))))


def pss_mib(procs) -> float:
    """Summed PSS, in MiB, of processes (psutil.Process or pid); gone ones count 0."""
    total = 0
    for p in procs:
        try:
            proc = p if isinstance(p, psutil.Process) else psutil.Process(p)
            total += proc.memory_full_info().pss
        except psutil.NoSuchProcess:  # includes zombies
            pass
    return total / MIB


def descendants(pid: int | None = None) -> list[psutil.Process]:
    try:
        return psutil.Process(pid or os.getpid()).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


# -- the ways: each returns (seconds, pss_mib) and leaves nothing running ----------------------
def run_ours(n: int, way: str, notes: list[str]) -> tuple[float, float]:
    from jupyter_lounge import Lounge

    engines = "dask" if way == "ours-dask" else "ipyparallel"
    t0 = time.perf_counter()
    c = Lounge(n, engines=engines, preload=["tensorflow"], wait=True, timeout=600)
    try:
        c.start_sync()
        run_everywhere(c.client, tf_op, n)
        seconds = time.perf_counter() - t0
        agents = [a["pid"] for a in c.agents]
        pss = pss_mib(agents + [p for a in agents for p in descendants(a)])
        notes.append(f"{way} N={n}: {pss_mib(agents):.0f} MiB of it in the node agent")
        return seconds, pss
    finally:
        c.stop_sync()


def run_ipyparallel(n: int, notes: list[str]) -> tuple[float, float]:
    import ipyparallel as ipp

    t0 = time.perf_counter()
    cluster = ipp.Cluster(n=n, log_level=40, engine_timeout=TIMEOUT)
    rc = None
    try:
        rc = cluster.start_and_connect_sync()  # waits for n engines, up to engine_timeout
        run_everywhere(rc, tf_op, n)
        seconds = time.perf_counter() - t0
        procs = [p for p in descendants() if "ipyparallel.engine" in " ".join(p.cmdline())]
        nannies = [p for p in procs if "ipyparallel.engine.nanny" in " ".join(p.cmdline())]
        notes.append(
            f"ipyparallel N={n}: {len(procs) - len(nannies)} engines and "
            f"{len(nannies)} engine nannies counted, {pss_mib(nannies):.0f} MiB "
            "of it in the nannies"
        )
        return seconds, pss_mib(procs)
    finally:
        if rc is not None:
            rc.close()
        cluster.stop_cluster_sync()


def run_dask(n: int, tmp: str) -> tuple[float, float]:
    from distributed import Client, LocalCluster

    t0 = time.perf_counter()
    # memory_limit=0: no per-worker limit, as our dask engines have (24 GB / 64 workers
    # would otherwise let the nanny kill workers that import TensorFlow).
    cluster = LocalCluster(
        n_workers=n,
        threads_per_worker=1,
        processes=True,
        dashboard_address=None,
        memory_limit=0,
        local_directory=tmp,
        silence_logs=logging.ERROR,
    )
    client = None
    try:
        client = Client(cluster, timeout=TIMEOUT)
        client.wait_for_workers(n, timeout=TIMEOUT)
        run_everywhere(client, tf_op, n)
        seconds = time.perf_counter() - t0
        return seconds, pss_mib(client.run(os.getpid).values())
    finally:
        if client is not None:
            client.close(timeout=10)
        cluster.close(timeout=30)


FLOOR = r"""
import json, os, sys, time
t0 = time.perf_counter()
import tensorflow as tf  # import only: no op in the parent before forking
n = int(sys.argv[1])
ready_r, ready_w = os.pipe()
go_r, go_w = os.pipe()
pids = []
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        os.close(go_w)
        ok = float(tf.reduce_sum(tf.ones((8, 8)))) == 64.0
        os.write(ready_w, b"1" if ok else b"0")
        os.read(go_r, 1)  # wait, alive, until the parent closes go_w
        os._exit(0)
    pids.append(pid)
os.close(ready_w)
os.close(go_r)
got = b""
while len(got) < n:
    chunk = os.read(ready_r, n)
    if not chunk:  # every child gone
        break
    got += chunk
t_ready = time.perf_counter()
print(json.dumps({"pids": pids, "ok": got.count(b"1")}), flush=True)
sys.stdin.readline()  # the benchmark samples the children's PSS meanwhile
t_go = time.perf_counter()
os.close(go_w)
for pid in pids:
    os.waitpid(pid, 0)
t_end = time.perf_counter()
print(json.dumps({"seconds": (t_ready - t0) + (t_end - t_go)}), flush=True)
"""


def run_floor(n: int, notes: list[str]) -> tuple[float, float]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", FLOOR, str(n)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        first = json.loads(with_timeout(proc.stdout.readline) or "null")
        if not first or first["ok"] != n:
            raise RuntimeError(f"floor children did not all run the op: {first!r}")
        pause = time.perf_counter()
        pss = pss_mib(first["pids"] + [proc.pid])
        parent = pss_mib([proc.pid])
        pause = time.perf_counter() - pause
        proc.stdin.write("go\n")
        proc.stdin.flush()
        inside = json.loads(with_timeout(proc.stdout.readline))["seconds"]
        outside = time.perf_counter() - t0 - pause
        notes.append(
            f"floor N={n}: {inside:.2f} s inside the subprocess (reported), "
            f"{outside:.2f} s from Popen incl. interpreter start; {parent:.0f} MiB of "
            "its PSS in the parent"
        )
        return inside, pss
    finally:
        proc.kill()
        proc.wait()


# -- running and reporting -----------------------------------------------------------------------
def kill_leftovers(before: set[int]) -> None:
    """Wait a little for processes started by a way to go, then kill what is left (but not
    multiprocessing's resource tracker, which lives as long as this process)."""
    procs = []
    for p in descendants():
        try:
            if p.pid not in before and "resource_tracker" not in " ".join(p.cmdline()):
                procs.append(p)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=10)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    if alive:
        print(f"  killed {len(alive)} leftover process(es)", file=sys.stderr)
        psutil.wait_procs(alive, timeout=5)


def measure(way: str, n: int, tmp: str, notes: list[str]) -> dict:
    before = {p.pid for p in descendants()}
    print(f"N={n} {way} ...", file=sys.stderr, flush=True)
    seconds = pss = None
    try:
        if way in ("ours", "ours-dask"):
            seconds, pss = run_ours(n, way, notes)
        elif way == "ipyparallel":
            seconds, pss = run_ipyparallel(n, notes)
        elif way == "dask":
            seconds, pss = run_dask(n, tmp)
        else:
            seconds, pss = run_floor(n, notes)
    except Exception as e:  # noqa: BLE001 - record and keep going
        notes.append(f"{way} N={n} failed: {type(e).__name__}: {str(e)[:300]}")
        seconds = pss = None
    finally:
        kill_leftovers(before)
    print(f"N={n} {way}: {seconds} s, {pss} MiB", file=sys.stderr, flush=True)
    return {"n": n, "way": way, "seconds": seconds, "pss_mib": pss}


RATIOS = [
    ("time ipp/ours", "seconds", "ipyparallel", "ours"),
    ("time dask/ours", "seconds", "dask", "ours"),
    ("time ours/floor", "seconds", "ours", "floor"),
    ("mem ipp/ours", "pss_mib", "ipyparallel", "ours"),
    ("mem dask/ours", "pss_mib", "dask", "ours"),
]


def table(records: list[dict], sizes: list[int], ways: list[str]) -> str:
    """Aligned plain text that is also a markdown table: one row per N."""
    got = {(r["n"], r["way"], k): r[k] for r in records for k in ("seconds", "pss_mib")}

    def fmt(x, digits):
        return "-" if x is None else f"{x:.{digits}f}"

    ratios = [r for r in RATIOS if r[2] in ways and r[3] in ways]
    head = ["N"] + [f"{w} s" for w in ways] + [f"{w} MiB" for w in ways] + [r[0] for r in ratios]
    rows = []
    for n in sizes:
        row = [str(n)] + [fmt(got.get((n, w, "seconds")), 1) for w in ways]
        row += [fmt(got.get((n, w, "pss_mib")), 0) for w in ways]
        for _, key, a, b in ratios:
            x, y = got.get((n, a, key)), got.get((n, b, key))
            row.append(fmt(x / y if x is not None and y else None, 2))
        rows.append(row)
    return markdown_table(head, rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--big", action="store_true", help="also N=64")
    ap.add_argument("--sizes", help="comma-separated N, e.g. 8,16 (overrides --big)")
    ap.add_argument(
        "--ways", default=",".join(WAYS), help="comma-separated subset of " + ", ".join(WAYS)
    )
    ap.add_argument("--json", metavar="FILE", help="also write the records as JSON")
    args = ap.parse_args(argv)
    sizes = (
        [int(s) for s in args.sizes.split(",") if s.strip()]
        if args.sizes
        else [8, 16, 32] + ([64] if args.big else [])
    )
    asked = {w.strip() for w in args.ways.split(",") if w.strip()}
    ways = [w for w in WAYS if w in asked]
    unknown = asked - set(WAYS)
    if unknown:
        ap.error(f"unknown way(s): {', '.join(sorted(unknown))}")

    tmp = tempfile.mkdtemp(prefix="lounge-bench-")
    os.environ["JUPYTER_LOUNGE_DIR"] = os.path.join(tmp, "lounge")
    os.environ["IPYTHONDIR"] = os.path.join(tmp, "ipython")  # stock ipyparallel's profile
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    notes: list[str] = []
    records = []
    try:
        for n in sizes:
            for way in ways:
                records.append(measure(way, n, os.path.join(tmp, "dask"), notes))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(table(records, sizes, ways))
    for note in notes:
        print(f"note: {note}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
