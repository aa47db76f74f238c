"""Slurm launch benchmark: seconds until N engines on several nodes have each run a TF op.

On a Slurm cluster (the testbed: ``export SLURM_CONF=/tmp/lounge-testbed/slurm/slurm.conf``),
with NODES nodes and PER_NODE engines each (default 3 x 8 = 24), every way is timed from just
before it creates its cluster until all N engines are registered AND every one of them has
imported TensorFlow and run ``float(tf.reduce_sum(tf.ones((8, 8))))`` (checked to be 64.0 on
all N). A thread polls ``squeue`` (jobs and ``-s`` steps) meanwhile to count the Slurm jobs the
way submitted and the srun job steps in them (numbered steps; batch and extern steps are not
counted). The ways:

* ours: ``Lounge(N, engines="ipyparallel", backend="slurm", engines_per_node=PER_NODE,
  preload=["tensorflow"], wait=True)``: one sbatch; inside it one srun task per node runs the
  node agent, which imports TensorFlow once and forks its engines. The op runs through
  ``client[:].apply_async``.
* ours-dask: the same with ``engines="dask"``; the op runs through ``client.run``.
* ipyparallel: stock ``ipyparallel.Cluster(engines="slurm", controller="local",
  controller_ip=CONTROLLER_IP)``: the controller runs here; the engines are one sbatch whose
  ``srun`` starts N ``ipyparallel.engine`` processes. Its default batch template asks only for
  ``--ntasks=N``, which Slurm may pack onto fewer nodes, so ``batch_template`` is set to the
  default plus ``--partition``, ``--nodes=NODES`` and ``--ntasks-per-node=PER_NODE``.
* dask-jobqueue: ``SLURMCluster(cores=PER_NODE, processes=PER_NODE, queue="debug")`` scaled to
  N workers: one sbatch per PER_NODE workers, no srun (``dask worker --nworkers PER_NODE`` runs
  in the batch step). ``job_mem`` is set to fit the testbed nodes (RealMemory=4000), since the
  default ``--mem`` (all of ``memory``) exceeds a node; ``memory`` gives each worker 2 GiB.

Servers the nodes must reach listen on CONTROLLER_IP (ours finds it by itself). Before each way
the benchmark waits (up to 120 s) for ``squeue`` to be empty; after it, it cancels the way's
jobs left in squeue (found by a unique job name), waits for them to leave, and kills leftover
processes: its own descendants and any process whose ``SLURM_JOB_ID`` is one of those jobs. A
way that fails or takes over 300 s is recorded as None with a note. Nothing is asserted.

    python bench/slurm_launch.py [--ways ours,ipyparallel] [--nodes 3] [--engines-per-node 8]
                                 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter

import psutil

TIMEOUT = 300.0  # seconds each way may take
CONTROLLER_IP = "10.77.0.1"  # the address of this host that the testbed nodes reach
WAYS = ("ours", "ours-dask", "ipyparallel", "dask-jobqueue")
IPP_TEMPLATE = """#!/bin/sh
#SBATCH --export=ALL
#SBATCH --job-name=ipengine-{cluster_id}
#SBATCH --partition={queue}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node={per_node}
#SBATCH --output={output_file}
srun {program_and_args}
"""


def tf_op() -> float:
    import tensorflow as tf

    return float(tf.reduce_sum(tf.ones((8, 8))))


def with_timeout(fn, timeout: float = TIMEOUT):
    """fn() in a daemon thread; raise TimeoutError if it takes longer than ``timeout``."""
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        raise TimeoutError(f"no answer within {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def check_results(values, n: int) -> None:
    values = list(values)
    if len(values) != n or any(v != 64.0 for v in values):
        raise RuntimeError(f"expected {n} results of 64.0, got {values!r}")


def hosts(client) -> str:
    """Where the engines run, e.g. ``node1 x8, node2 x8``."""
    if type(client).__module__.startswith("distributed"):
        names = with_timeout(lambda: client.run(socket.gethostname), 60).values()
    else:
        names = client[:].apply_async(socket.gethostname).get(timeout=60)
    return ", ".join(f"{h} x{k}" for h, k in sorted(Counter(names).items()))


def squeue(*args: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", *args], capture_output=True, text=True, timeout=30)
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


class SlurmWatch:
    """Polls squeue in a thread: every job whose name holds ``mark``, and its srun steps."""

    def __init__(self, mark: str):
        self.mark, self.jobs, self.steps = mark, set(), set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def poll(self) -> None:
        for line in squeue("-o", "%i %j"):
            job, _, name = line.partition(" ")
            if self.mark in name:
                self.jobs.add(job)
        for line in squeue("-s", "-o", "%i"):
            job, _, step = line.partition(".")
            if job in self.jobs and step.isdigit():
                self.steps.add(line)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except (OSError, subprocess.SubprocessError):
                pass
            self._stop.wait(0.5)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


# -- the ways: each returns the seconds and stops what it started -----------------------------
def run_ours(way: str, nodes: int, per_node: int, mark: str, notes: list[str]) -> float:
    from jupyter_lounge import Lounge

    n, engines = nodes * per_node, ("dask" if way == "ours-dask" else "ipyparallel")
    t0 = time.perf_counter()
    c = Lounge(
        n,
        name=mark,
        engines=engines,
        backend="slurm",
        engines_per_node=per_node,
        preload=["tensorflow"],
        progress=False,
        wait=True,
        timeout=TIMEOUT,
    )
    try:
        c.start_sync()
        if engines == "dask":
            check_results(with_timeout(lambda: c.client.run(tf_op)).values(), n)
        else:
            check_results(c.client[:].apply_async(tf_op).get(timeout=TIMEOUT), n)
        seconds = time.perf_counter() - t0
        notes.append(f"{way}: engines on {hosts(c.client)}; {len(c.agents)} node agents")
        return seconds
    finally:
        c.stop_sync()


def run_ipyparallel(nodes: int, per_node: int, mark: str, notes: list[str]) -> float:
    import ipyparallel as ipp
    from traitlets.config import Config

    n, cfg = nodes * per_node, Config()
    cfg.SlurmEngineSetLauncher.batch_template = IPP_TEMPLATE
    cfg.SlurmEngineSetLauncher.queue = "debug"
    cfg.SlurmEngineSetLauncher.namespace = {"nodes": nodes, "per_node": per_node}
    t0 = time.perf_counter()
    cluster = ipp.Cluster(
        engines="slurm",
        controller="local",
        controller_ip=CONTROLLER_IP,
        n=n,
        cluster_id=mark,
        engine_timeout=int(TIMEOUT),
        log_level=40,
        config=cfg,
    )
    rc = None
    try:
        rc = cluster.start_and_connect_sync()  # waits for n engines, up to engine_timeout
        check_results(rc[:].apply_async(tf_op).get(timeout=TIMEOUT), n)
        seconds = time.perf_counter() - t0
        notes.append(f"ipyparallel: engines on {hosts(rc)}")
        return seconds
    finally:
        if rc is not None:
            rc.close()
        cluster.stop_cluster_sync()


def run_jobqueue(nodes: int, per_node: int, mark: str, tmp: str, notes: list[str]) -> float:
    from dask_jobqueue import SLURMCluster
    from distributed import Client

    n = nodes * per_node
    t0 = time.perf_counter()
    cluster = SLURMCluster(
        cores=per_node,
        processes=per_node,
        memory=f"{2 * per_node}GiB",
        job_mem="3000M",
        queue="debug",
        job_name=mark,
        log_directory=os.path.join(tmp, "dask-jobqueue"),
        scheduler_options={"host": CONTROLLER_IP, "dashboard": False},
    )
    client = None
    try:
        cluster.scale(n)
        client = Client(cluster, timeout=TIMEOUT)
        client.wait_for_workers(n, timeout=TIMEOUT)
        check_results(with_timeout(lambda: client.run(tf_op)).values(), n)
        seconds = time.perf_counter() - t0
        notes.append(f"dask-jobqueue: workers on {hosts(client)}")
        return seconds
    finally:
        if client is not None:
            client.close(timeout=10)
        cluster.close(timeout=30)


# -- running, cleaning up and reporting ------------------------------------------------------
def wait_for_idle_slurm(way: str, notes: list[str], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while (left := squeue()) and time.monotonic() < deadline:
        time.sleep(1)
    if left:
        notes.append(f"{way}: squeue not empty after {timeout:g} s, measured anyway: {left}")


def kill(procs: list[psutil.Process]) -> int:
    _, alive = psutil.wait_procs(procs, timeout=10)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
    return len(alive)


def clean_up(way: str, jobs: set[str], before: set[int], notes: list[str]) -> None:
    """Cancel the way's jobs still queued, wait for them to go, kill what they and we left."""
    if left := [j for j in jobs if squeue("-j", j)]:
        subprocess.run(["scancel", *left], capture_output=True, timeout=30)
        notes.append(f"{way}: job(s) {', '.join(left)} still in squeue after stop: cancelled")
    deadline = time.monotonic() + 60
    while any(squeue("-j", j) for j in jobs) and time.monotonic() < deadline:
        time.sleep(0.5)
    procs = []
    for p in psutil.process_iter():
        try:
            if p.pid in before or p.pid == os.getpid():
                continue
            in_job = p.environ().get("SLURM_JOB_ID") in jobs
            if in_job or (
                os.getpid() in {q.pid for q in p.parents()}
                and "resource_tracker" not in " ".join(p.cmdline())
            ):
                procs.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    if killed := kill(procs):
        notes.append(f"{way}: killed {killed} leftover process(es)")


def measure(way: str, nodes: int, per_node: int, tmp: str, notes: list[str]) -> dict:
    wait_for_idle_slurm(way, notes)
    mark = f"bench-{secrets.token_hex(3)}-{way}"
    before = {p.pid for p in psutil.process_iter()}
    print(f"{way} ({nodes} x {per_node}) ...", file=sys.stderr, flush=True)
    watch = SlurmWatch(mark)
    seconds = None
    try:
        if way in ("ours", "ours-dask"):
            seconds = run_ours(way, nodes, per_node, mark, notes)
        elif way == "ipyparallel":
            seconds = run_ipyparallel(nodes, per_node, mark, notes)
        else:
            seconds = run_jobqueue(nodes, per_node, mark, tmp, notes)
    except Exception as e:  # noqa: BLE001 - record and keep going
        notes.append(f"{way} failed: {type(e).__name__}: {str(e)[:300]}")
        seconds = None
    finally:
        watch.stop()
        clean_up(way, watch.jobs, before, notes)
    jobs, steps = len(watch.jobs), len(watch.steps)
    print(f"{way}: {seconds} s, {jobs} job(s), {steps} step(s)", file=sys.stderr, flush=True)
    return {"way": way, "n": nodes * per_node, "seconds": seconds, "jobs": jobs, "steps": steps}


def table(records: list[dict]) -> str:
    """Aligned plain text that is also a markdown table: one row per way."""
    ours = next((r["seconds"] for r in records if r["way"] == "ours"), None)
    head = ["way", "N", "seconds", "Slurm jobs", "srun steps", "time way/ours"]
    rows = [
        [
            r["way"],
            str(r["n"]),
            "-" if r["seconds"] is None else f"{r['seconds']:.1f}",
            str(r["jobs"]),
            str(r["steps"]),
            f"{r['seconds'] / ours:.2f}" if r["seconds"] is not None and ours else "-",
        ]
        for r in records
    ]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["| " + " | ".join(c.rjust(w) for c, w in zip(r, widths)) + " |" for r in [head, *rows]]
    lines.insert(1, "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--ways", default=",".join(WAYS), help="comma-separated subset of " + ", ".join(WAYS)
    )
    ap.add_argument("--nodes", type=int, default=3, help="Slurm nodes to spread over (3)")
    ap.add_argument("--engines-per-node", type=int, default=8, help="engines per node (8)")
    ap.add_argument("--json", metavar="FILE", help="also write the records as JSON")
    args = ap.parse_args(argv)
    asked = {w.strip() for w in args.ways.split(",") if w.strip()}
    if unknown := asked - set(WAYS):
        ap.error(f"unknown way(s): {', '.join(sorted(unknown))}")
    if not os.environ.get("SLURM_CONF") or not shutil.which("squeue"):
        ap.error("no Slurm here: export SLURM_CONF=/tmp/lounge-testbed/slurm/slurm.conf")
    out = os.path.abspath(args.json) if args.json else None

    tmp = tempfile.mkdtemp(prefix="lounge-slurm-bench-", dir="/tmp")  # shared with the nodes
    os.environ["JUPYTER_LOUNGE_DIR"] = os.path.join(tmp, "lounge")
    os.environ["IPYTHONDIR"] = os.path.join(tmp, "ipython")  # stock ipyparallel's profile
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    logging.getLogger("distributed").setLevel(logging.ERROR)
    cwd = os.getcwd()
    os.chdir(tmp)  # batch scripts and Slurm output files of the stock ways land here
    notes: list[str] = []
    try:
        records = [
            measure(w, args.nodes, args.engines_per_node, tmp, notes) for w in WAYS if w in asked
        ]
    finally:
        os.chdir(cwd)
        shutil.rmtree(tmp, ignore_errors=True)
    print(table(records))
    for note in notes:
        print(f"note: {note}")
    if out:
        with open(out, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
