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
  in the batch step), the scheduler here on ``scheduler_options={"host": CONTROLLER_IP}``.
  ``memory`` gives each worker a 2 GiB limit (TensorFlow fits); ``job_mem="3000M"`` because the
  default ``--mem`` (all of ``memory``) exceeds a testbed node (RealMemory=4000) and the job
  would never start; ``--exclusive`` gives each job a node of its own, as the other ways spread
  over NODES nodes (at 8 per node a job takes a whole node anyway).

Servers the nodes must reach listen on CONTROLLER_IP (ours finds it by itself). Before each way
the benchmark waits (up to 120 s) for ``squeue`` to be empty; after it, it cancels the way's
jobs left in squeue (found by a unique job name), waits for them to leave, and kills leftover
processes: its own descendants and any process whose ``SLURM_JOB_ID`` is one of those jobs. A
way that fails or takes over 300 s is recorded as None with a note. Nothing is asserted.

``--nodes`` takes a list, e.g. ``--nodes 1,2,4,8 --engines-per-node 2``: every way at each
count, to show how launch time grows with nodes (ours: one allocation, one srun step). The
testbed's nodes all share this machine's cores, so past a few nodes a run measures the overhead
of more slurmd and agents, not more machines. More than 3 nodes needs a bigger testbed:
``tests/infra/reup 8 8 > .testbed.env``.

    python bench/slurm_launch.py [--ways ours,ipyparallel] [--nodes 3|1,2,4,8]
                                 [--engines-per-node 8] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import psutil
from _common import (
    TIMEOUT,
    hosts,
    markdown_table,
    node_counts,
    quietly,
    run_everywhere,
    time_ours,
    time_stock_ipyparallel,
    wait_for_quiet,
)

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
    """Runs in each engine: defined here, so it is sent by value, not imported there."""
    import tensorflow as tf

    return float(tf.reduce_sum(tf.ones((8, 8))))


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


# -- the ways: each sets rec["seconds"] once its engines have run the op, then stops --------------
def run_ours(rec: dict, mark: str, way: str, per_node: int, notes: list[str]) -> None:
    from jupyter_lounge import Lounge

    kind = "dask" if way == "ours-dask" else "ipyparallel"
    opts = dict(engines=kind, backend="slurm", engines_per_node=per_node, name=mark)
    c = Lounge(rec["n"], preload=["tensorflow"], wait=True, timeout=TIMEOUT, **opts)
    time_ours(rec, way, c, tf_op, notes)


def run_ipyparallel(rec: dict, mark: str, nodes: int, per_node: int, notes: list[str]) -> None:
    from traitlets.config import Config

    cfg = Config()
    cfg.SlurmEngineSetLauncher.batch_template = IPP_TEMPLATE
    cfg.SlurmEngineSetLauncher.queue = "debug"
    cfg.SlurmEngineSetLauncher.namespace = {"nodes": nodes, "per_node": per_node}
    opts = dict(engines="slurm", controller="local", controller_ip=CONTROLLER_IP, config=cfg)
    time_stock_ipyparallel(rec, mark, tf_op, notes, **opts)


def run_jobqueue(rec: dict, mark: str, per_node: int, tmp: str, notes: list[str]) -> None:
    from dask_jobqueue import SLURMCluster
    from distributed import Client

    mem = dict(memory=f"{2 * per_node}GiB", job_mem="3000M")  # see the module docstring
    job = dict(queue="debug", job_name=mark, job_extra_directives=["--exclusive"])
    sched = {"host": CONTROLLER_IP, "dashboard": False}
    more = dict(log_directory=os.path.join(tmp, "dask-jobqueue"), scheduler_options=sched)
    wait_for_quiet("dask-jobqueue", notes)
    t0 = time.perf_counter()
    cluster = SLURMCluster(cores=per_node, processes=per_node, **mem, **job, **more)
    client = None
    try:
        cluster.scale(rec["n"])
        client = Client(cluster, timeout=TIMEOUT)
        client.wait_for_workers(rec["n"], timeout=TIMEOUT)
        run_everywhere(client, tf_op, rec["n"])
        rec["seconds"] = time.perf_counter() - t0
        notes.append(f"dask-jobqueue: workers on {hosts(client)}")
    finally:
        if client is not None:
            quietly(lambda: client.close(timeout=10), "dask-jobqueue", notes)
        quietly(lambda: cluster.close(timeout=30), "dask-jobqueue", notes)


# -- running, cleaning up and reporting ------------------------------------------------------
def wait_until_gone(jobs, timeout: float) -> list[str]:
    """Wait up to ``timeout`` s for squeue to list none of ``jobs`` (all if None); the rest."""
    deadline = time.monotonic() + timeout
    while True:
        left = squeue() if jobs is None else [j for j in jobs if squeue("-j", j)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def clean_up(way: str, jobs: set[str], before: set[int], notes: list[str]) -> None:
    """Make sure the way's jobs left squeue (cancel them if not), kill what they and we left."""
    if left := wait_until_gone(jobs, 30):
        subprocess.run(["scancel", *left], capture_output=True, timeout=30)
        notes.append(f"{way}: job(s) {', '.join(left)} still in squeue 30 s after stop: cancelled")
        if left := wait_until_gone(left, 60):
            notes.append(f"{way}: job(s) {', '.join(left)} still in squeue after scancel")
    me, procs = os.getpid(), []
    for p in psutil.process_iter():
        try:
            if p.pid in before or p.pid == me or "resource_tracker" in " ".join(p.cmdline()):
                continue
            if p.environ().get("SLURM_JOB_ID") in jobs or me in {q.pid for q in p.parents()}:
                procs.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    _, alive = psutil.wait_procs(procs, timeout=10)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    if alive:
        psutil.wait_procs(alive, timeout=5)
        notes.append(f"{way}: killed {len(alive)} leftover process(es)")


def measure(way: str, nodes: int, per_node: int, tmp: str, notes: list[str]) -> dict:
    if left := wait_until_gone(None, 120):
        notes.append(f"{way}: squeue not empty after 120 s, measured anyway: {left}")
    rec = {"way": way, "n": nodes * per_node, "nodes": nodes, "seconds": None, "jobs": 0,
           "steps": 0}  # fmt: skip
    mark = f"bench-{secrets.token_hex(3)}-{way}"  # in the job name(s) of this way
    before = {p.pid for p in psutil.process_iter()}
    print(f"{way} ({nodes} nodes x {per_node}) ...", file=sys.stderr, flush=True)
    watch = SlurmWatch(mark)
    try:
        if way in ("ours", "ours-dask"):
            run_ours(rec, mark, way, per_node, notes)
        elif way == "ipyparallel":
            run_ipyparallel(rec, mark, nodes, per_node, notes)
        else:
            run_jobqueue(rec, mark, per_node, tmp, notes)
    except Exception as e:  # noqa: BLE001 - record and keep going
        when = " after the measurement" if rec["seconds"] is not None else ""
        notes.append(f"{way} failed{when}: {type(e).__name__}: {str(e)[:300]}")
    finally:
        watch.stop()
        clean_up(way, watch.jobs, before, notes)
    rec.update(jobs=len(watch.jobs), steps=len(watch.steps))
    print(f"{way}: {rec}", file=sys.stderr, flush=True)
    return rec


def table(records: list[dict]) -> str:
    """Aligned plain text that is also a markdown table: one row per way and node count
    (time way/ours: against ours on as many nodes)."""
    head = ["way", "N", "nodes", "seconds", "Slurm jobs", "srun steps", "time way/ours"]
    rows = []
    for r in records:
        ours = next(
            (o["seconds"] for o in records if o["way"] == "ours" and o["nodes"] == r["nodes"]),
            None,
        )
        secs, ratio = r["seconds"], (r["seconds"] / ours if r["seconds"] and ours else None)
        rows.append([r["way"], str(r["n"]), str(r["nodes"])])
        rows[-1].append("-" if secs is None else f"{secs:.1f}")
        rows[-1] += [str(r["jobs"]), str(r["steps"]), "-" if ratio is None else f"{ratio:.2f}"]
    return markdown_table(head, rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--ways", default=",".join(WAYS), help="comma-separated subset of " + ", ".join(WAYS)
    )
    ap.add_argument(
        "--nodes", default="3", help="Slurm nodes to spread over (3), or a list: 1,2,4,8"
    )
    ap.add_argument("--engines-per-node", type=int, default=8, help="engines per node (8)")
    ap.add_argument("--json", metavar="FILE", help="also write the records as JSON")
    args = ap.parse_args(argv)
    asked = {w.strip() for w in args.ways.split(",") if w.strip()}
    if unknown := asked - set(WAYS):
        ap.error(f"unknown way(s): {', '.join(sorted(unknown))}")
    if not os.environ.get("SLURM_CONF") or not shutil.which("squeue"):
        ap.error("no Slurm here: export SLURM_CONF=/tmp/lounge-testbed/slurm/slurm.conf")
    try:
        counts = node_counts(args.nodes)
    except ValueError as e:
        ap.error(str(e))
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
            measure(w, nodes, args.engines_per_node, tmp, notes)
            for nodes in counts
            for w in WAYS
            if w in asked
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
