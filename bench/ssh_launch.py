"""SSH launch benchmark: seconds until N engines on the lounge's nodes have each run a TF op.

On the testbed's SSH nodes (``set -a; . ./.testbed.env; set +a``: node1..nodeM are 10.77.0.11
to .1M, sshd as root, keys in LOUNGE_TESTBED_KEY / LOUNGE_TESTBED_KNOWN_HOSTS /
LOUNGE_TESTBED_SSH_CONFIG), with NODES nodes and PER_NODE engines each (default 3 x 4 = 12),
every way is timed from just before it creates its cluster until all N engines are registered
AND every one of them has imported TensorFlow and run ``float(tf.reduce_sum(tf.ones((8, 8))))``
(checked to be 64.0 on all N). The ways:

* ours: ``Lounge(N, engines="ipyparallel", **OURS_OPTIONS)``, i.e. ``backend="ssh"``,
  ``sync=True`` (this venv prepositioned on each node's own disk by an untimed sync first, so
  the timed start only checks it is there), ``preload=["tensorflow"]``, ``wait=True``, with
  an inventory of the NODES nodes (the content
  of tests/conftest.py's ``inventory_for_testbed``: user root, the testbed key and known_hosts,
  this venv's python, ``engines = PER_NODE``, ``local_dir = "/var/local/lounge"``), the testbed
  known_hosts, and an ``ssh_config`` that is the testbed's plus a ``SetEnv`` of this way's
  mark (see clean-up below). One SSH session per node runs the node agent, which imports
  TensorFlow once and forks its engines; the controller runs here. The op runs through
  ``client[:].apply_async``.
* ours-dask: the same with ``engines="dask"``; the op runs through ``client.run``.
* ipyparallel: stock ``ipyparallel.Cluster(engines="ssh", controller="local",
  controller_ip=CONTROLLER_IP)``: the controller runs here, listening where the nodes reach it;
  ``SSHEngineSetLauncher.engines`` asks for PER_NODE engines on each of the NODES nodes, each
  engine a ``python -m ipyparallel.engine`` of its own (``remote_python`` is this venv's python)
  that imports TensorFlow itself when the op runs. The launcher starts engines one by one, each
  with several SSH round trips of its own (shell check, python check, ``ipython profile
  create``, the start); ``ssh_args`` and ``scp_args`` are ``-F`` an ssh_config made as ours
  is (the testbed's plus this way's mark), ``-i`` the testbed key and the testbed known_hosts.
  Each node gets a ``remote_profile_dir`` of its own under the benchmark's temporary folder:
  the nodes share this file system, and the default (the local profile dir) would make the
  launcher ``scp`` the connection file onto the very file it reads, and each node rewrite one
  file that the engines started on the other nodes are reading.
* dask: stock ``dask.distributed.SSHCluster(hosts, connect_options, worker_options,
  scheduler_options, remote_python)``: ``hosts`` is the scheduler's host then one entry per
  node; ``worker_options={"n_workers": PER_NODE, "nthreads": 1}`` (one SSH session per node
  runs ``distributed.cli.dask_spec`` with PER_NODE nannies, each starting a worker process);
  ``remote_python`` is this venv's python; ``connect_options`` (asyncssh) give user root, the
  testbed key and known_hosts and this way's mark as ``env``; the dashboard is off.
  SSHCluster always starts its scheduler over SSH on ``hosts[0]``, and this host (10.77.0.1)
  runs no sshd, so the scheduler runs on node1 (DASK_SCHEDULER_HOST), where every node and
  this host reach it. TensorFlow is imported by each worker itself when ``client.run`` runs
  the op.

Clean-up: every way's SSH sessions carry ``LOUNGE_BENCH_MARK=<mark of the way>`` (the
testbed's sshd accepts it; everything started in them inherits it), and stock ipyparallel's
engines also name the way's folder on their command lines. When a way's stop has returned,
the benchmark first ends its own local descendants that the way left (controllers, relays,
ssh clients; 10 s to end by themselves, then SIGKILL), then asks every node at once over SSH
(the testbed's ssh_config, without the mark) for the processes that carry the mark in their
environment or command line, gives them GRACE (10) s to end by themselves, ends the rest
(SIGTERM, SIGKILL 5 s later), and notes both counts. A way that fails or takes over 300 s is
recorded as None with a note. ``--keep`` keeps the temporary folder (inventories,
ssh_configs, the ways' logs) and prints where it is.
Nothing is asserted.

``--nodes`` takes a list, e.g. ``--nodes 1,2,4,8 --engines-per-node 2``: every way at each
count, to show how launch time grows with nodes (one SSH session per node for ours and Dask,
several per engine for stock ipyparallel). The testbed's nodes all share this machine's cores,
so past a few nodes a run measures the overhead of more sessions and agents, not more
machines. More than 3 nodes needs a bigger testbed: ``tests/infra/reup 8 8 > .testbed.env``.

    python bench/ssh_launch.py [--ways ours,ipyparallel] [--nodes 3|1,2,4,8]
                               [--engines-per-node 4] [--json out.json] [--keep]
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
import time
from collections import Counter

import psutil
from _common import (
    MAX_NODES,
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
NODE_IPS = tuple(f"10.77.0.1{i}" for i in range(1, MAX_NODES + 1))  # node1.. of the testbed
DASK_SCHEDULER_HOST = NODE_IPS[0]  # SSHCluster starts it over SSH; this host runs no sshd
WAYS = ("ours", "ours-dask", "ipyparallel", "dask")
GRACE = 10.0  # seconds a way's processes on the nodes may take to end after its stop returned
TESTBED_ENV = ("LOUNGE_TESTBED_SSH_CONFIG", "LOUNGE_TESTBED_KEY", "LOUNGE_TESTBED_KNOWN_HOSTS")

# What ours is asked for, besides the engine kind and the per-run paths (inventory,
# known_hosts, ssh_config, name). ``sync=True``: the agents run the environment prepositioned
# on each node's own disk (``lounge sync``, done untimed before the timed start, as MIT LL
# prepositions the application); the timed start still checks it is there (one SSH round trip).
OURS_OPTIONS: dict = {
    "backend": "ssh",
    "sync": True,
    "preload": ["tensorflow"],
    "wait": True,
    "timeout": TIMEOUT,
}

# Runs on a node (its python, over SSH): the processes that carry the mark in their environment
# or command line; those still there after a grace period are ended. Prints one line per
# process found, one per process left, then how many were terminated and killed.
NODE_CLEANUP = r"""
import os, sys, psutil
mark = sys.argv[1]
me = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
found = []
for p in psutil.process_iter(["pid", "cmdline", "environ", "status"]):
    try:
        if p.pid in me or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        env = p.info["environ"] or {}
        if env.get("LOUNGE_BENCH_MARK") == mark or mark in " ".join(p.info["cmdline"] or ()):
            found.append(p)
            print("found", p.pid, " ".join(p.info["cmdline"] or ())[:150], flush=True)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass
_, found = psutil.wait_procs(found, timeout=float(sys.argv[2]))  # they may be ending
for p in found:
    print("left", p.pid, flush=True)
    try:
        p.terminate()
    except psutil.NoSuchProcess:
        pass
_, alive = psutil.wait_procs(found, timeout=5)
for p in alive:
    try:
        p.kill()
    except psutil.NoSuchProcess:
        pass
psutil.wait_procs(alive, timeout=5)
print("terminated", len(found) - len(alive), "killed", len(alive))
"""


def tf_op() -> float:
    """Runs in each engine: defined here, so it is sent by value, not imported there."""
    import tensorflow as tf

    return float(tf.reduce_sum(tf.ones((8, 8))))


def write_inventory(path: str, nodes: int, per_node: int) -> str:
    """The testbed inventory, as tests/conftest.py's ``inventory_for_testbed`` writes it."""
    text = "".join(
        f'[[node]]\nname = "node{i}"\nhost = "10.77.0.1{i}"\nuser = "root"\n'
        f'key = "{os.environ["LOUNGE_TESTBED_KEY"]}"\npython = "{sys.executable}"\n'
        f'known_hosts = "{os.environ["LOUNGE_TESTBED_KNOWN_HOSTS"]}"\n'
        f'engines = {per_node}\npools = ["gpu"]\nlocal_dir = "/var/local/lounge"\n\n'
        for i in range(1, nodes + 1)
    )
    with open(path, "w") as f:
        f.write(text)
    return path


def marked_ssh_config(path: str, mark: str) -> str:
    """The testbed's ssh_config, plus the way's mark in the environment of every session."""
    with open(path, "w") as f:
        f.write(f"SetEnv LOUNGE_BENCH_MARK={mark}\n")
        f.write(f"Include {os.environ['LOUNGE_TESTBED_SSH_CONFIG']}\n")
    return path


def ssh_args(config: str) -> list[str]:
    key, known = os.environ["LOUNGE_TESTBED_KEY"], os.environ["LOUNGE_TESTBED_KNOWN_HOSTS"]
    return ["-F", config, "-i", key, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes"] + [
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={known}",
        "-o",
        "ConnectTimeout=10",
    ]


# -- the ways: each sets rec["seconds"] once its engines have run the op, then stops --------------
def run_ours(rec: dict, mark: str, way: str, wdir: str, per_node: int, notes: list) -> None:
    from jupyter_lounge import Lounge

    n, kind = rec["n"], ("dask" if way == "ours-dask" else "ipyparallel")
    paths = dict(
        inventory=write_inventory(os.path.join(wdir, "lounge.toml"), rec["nodes"], per_node),
        known_hosts=os.environ["LOUNGE_TESTBED_KNOWN_HOSTS"],
        ssh_config=marked_ssh_config(os.path.join(wdir, "ssh_config"), mark),
    )
    os.environ["JUPYTER_LOUNGE_DIR"] = os.path.join(wdir, "lounge")
    if OURS_OPTIONS.get("sync"):  # preposition once, untimed; unchanged envs are not re-shipped
        from jupyter_lounge._loop import run_sync
        from jupyter_lounge.backends.ssh import SSHBackend

        rows = run_sync(SSHBackend(**paths).sync_env())
        notes.append(f"{way}: sync " + ", ".join(f"{r['node']} {r['status']}" for r in rows))
    time_ours(rec, way, Lounge(n, engines=kind, name=mark, **OURS_OPTIONS, **paths), tf_op, notes)


def run_ipyparallel(rec: dict, mark: str, wdir: str, per_node: int, notes: list) -> None:
    from traitlets.config import Config

    config = marked_ssh_config(os.path.join(wdir, "ssh_config"), mark)
    cfg = Config()
    cfg.SSHEngineSetLauncher.engines = {
        f"root@{ip}": {
            "n": per_node,
            "remote_profile_dir": os.path.join(wdir, f"node{i}", "profile_default"),
        }
        for i, ip in enumerate(NODE_IPS[: rec["nodes"]], 1)
    }
    cfg.SSHEngineSetLauncher.remote_python = sys.executable
    cfg.SSHEngineSetLauncher.ssh_args = ssh_args(config)
    cfg.SSHEngineSetLauncher.scp_args = ssh_args(config)
    opts = dict(engines="ssh", controller="local", controller_ip=CONTROLLER_IP, config=cfg)
    time_stock_ipyparallel(rec, mark, tf_op, notes, **opts)


def run_dask(rec: dict, mark: str, per_node: int, notes: list) -> None:
    from distributed import Client, SSHCluster

    connect = dict(
        username="root",
        client_keys=[os.environ["LOUNGE_TESTBED_KEY"]],
        known_hosts=os.environ["LOUNGE_TESTBED_KNOWN_HOSTS"],
        env={"LOUNGE_BENCH_MARK": mark},
        connect_timeout=10,
    )
    workers = {"n_workers": per_node, "nthreads": 1}
    wait_for_quiet("dask", notes)
    t0 = time.perf_counter()
    cluster = SSHCluster(
        [DASK_SCHEDULER_HOST, *NODE_IPS[: rec["nodes"]]],
        connect_options=connect,
        worker_options=workers,
        scheduler_options={"dashboard": False},
        remote_python=sys.executable,
    )
    client = None
    try:
        client = Client(cluster, timeout=TIMEOUT)
        client.wait_for_workers(rec["n"], timeout=TIMEOUT)
        run_everywhere(client, tf_op, rec["n"])
        rec["seconds"] = time.perf_counter() - t0
        notes.append(f"dask: workers on {hosts(client)}")
    finally:
        if client is not None:
            quietly(lambda: client.close(timeout=10), "dask", notes)
        quietly(lambda: cluster.close(timeout=30), "dask", notes)


# -- cleaning up and reporting -----------------------------------------------------------------
def describe(cmdlines: list[str]) -> str:
    """``ipyparallel.engine x4; -c from multiprocessing.spawn ... x2``: what processes were."""
    what = Counter(" ".join(c.split()[1:5])[:60] for c in cmdlines)
    return "; ".join(f"{k} x{v}" for k, v in what.items())


def clean_nodes(way: str, mark: str, nodes: int, notes: list[str]) -> None:
    """On every node at once: the way's processes still there GRACE s after its stop ended,
    ended; noted (those found at once, those left after the grace period)."""
    base = ssh_args(os.environ["LOUNGE_TESTBED_SSH_CONFIG"])
    procs = {
        f"node{i}": subprocess.Popen(
            ["ssh", *base, f"root@{ip}", "--", sys.executable, "-", mark, str(GRACE)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, ip in enumerate(NODE_IPS[:nodes], 1)
    }
    for node, proc in procs.items():
        try:
            out, err = proc.communicate(NODE_CLEANUP, timeout=GRACE + 60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            notes.append(f"{way}: clean-up on {node} did not answer within {GRACE + 60:g} s")
            continue
        lines = out.splitlines()
        if proc.returncode or not lines or not lines[-1].startswith("terminated"):
            notes.append(f"{way}: clean-up on {node} failed: {err.strip()[-200:]}")
            continue
        found = {ln.split(" ", 2)[1]: ln.split(" ", 2)[2] for ln in lines if ln.startswith("found")}
        left = [found[ln.split()[1]] for ln in lines if ln.startswith("left")]
        if found:
            msg = f"{way}: {node}: {len(found)} process(es) still there when stop returned"
            msg += f" ({describe(list(found.values()))}); "
            msg += f"{len(left)} left {GRACE:g} s later" + (
                f" ({describe(left)}): {lines[-1]}" if left else ""
            )
            notes.append(msg)


def clean_local(way: str, before: set[int], notes: list[str]) -> None:
    """Kill what the way left here: our own descendants that were not there before it."""
    me, procs = os.getpid(), []
    for p in psutil.Process(me).children(recursive=True):
        try:
            if p.pid in before or "resource_tracker" in " ".join(p.cmdline()):
                continue
            procs.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    _, alive = psutil.wait_procs(procs, timeout=10)
    what = Counter()
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            what[" ".join(p.cmdline()[:3])[:60]] += 1
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    if alive:
        psutil.wait_procs(alive, timeout=5)
        desc = "; ".join(f"{k} x{v}" for k, v in what.items())
        notes.append(f"{way}: killed {len(alive)} leftover local process(es) ({desc})")


def measure(way: str, nodes: int, per_node: int, tmp: str, notes: list[str]) -> dict:
    rec = {"way": way, "n": nodes * per_node, "nodes": nodes, "seconds": None}
    mark = f"bench-{secrets.token_hex(3)}-{way}"  # in the environment of the way's processes
    wdir = os.path.join(tmp, mark)
    os.makedirs(wdir)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    print(f"{way} ({nodes} nodes x {per_node}) ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    try:
        if way in ("ours", "ours-dask"):
            run_ours(rec, mark, way, wdir, per_node, notes)
        elif way == "ipyparallel":
            run_ipyparallel(rec, mark, wdir, per_node, notes)
        else:
            run_dask(rec, mark, per_node, notes)
    except Exception as e:  # noqa: BLE001 - record and keep going
        when = " after the measurement" if rec["seconds"] is not None else ""
        notes.append(f"{way} failed{when}: {type(e).__name__}: {str(e)[:300]}")
    finally:
        clean_local(way, before, notes)
        clean_nodes(way, mark, nodes, notes)
    if rec["seconds"] is not None and rec["seconds"] > TIMEOUT:
        notes.append(f"{way}: took {rec['seconds']:.0f} s, over {TIMEOUT:g} s: recorded as None")
        rec["seconds"] = None
    print(
        f"{way}: {rec} ({time.perf_counter() - t0:.0f} s with stop and clean-up)",
        file=sys.stderr,
        flush=True,
    )
    return rec


def table(records: list[dict]) -> str:
    """Aligned plain text that is also a markdown table: one row per way and node count
    (time way/ours: against ours on as many nodes)."""
    head = ["way", "N", "nodes", "seconds", "time way/ours"]
    rows = []
    for r in records:
        ours = next(
            (o["seconds"] for o in records if o["way"] == "ours" and o["nodes"] == r["nodes"]),
            None,
        )
        secs, ratio = r["seconds"], (r["seconds"] / ours if r["seconds"] and ours else None)
        rows.append([r["way"], str(r["n"]), str(r["nodes"])])
        rows[-1].append("-" if secs is None else f"{secs:.1f}")
        rows[-1].append("-" if ratio is None else f"{ratio:.2f}")
    return markdown_table(head, rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--ways", default=",".join(WAYS), help="comma-separated subset of " + ", ".join(WAYS)
    )
    ap.add_argument(
        "--nodes", default="3", help="testbed nodes to spread over (3), or a list: 1,2,4,8"
    )
    ap.add_argument("--engines-per-node", type=int, default=4, help="engines per node (4)")
    ap.add_argument("--json", metavar="FILE", help="also write the records as JSON")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (logs)")
    args = ap.parse_args(argv)
    asked = {w.strip() for w in args.ways.split(",") if w.strip()}
    if unknown := asked - set(WAYS):
        ap.error(f"unknown way(s): {', '.join(sorted(unknown))}")
    if missing := [v for v in TESTBED_ENV if not os.environ.get(v)]:
        ap.error(f"no SSH testbed here ({', '.join(missing)} unset): set -a; . ./.testbed.env")
    try:
        counts = node_counts(args.nodes)
    except ValueError as e:
        ap.error(str(e))
    out = os.path.abspath(args.json) if args.json else None

    tmp = tempfile.mkdtemp(prefix="lounge-ssh-bench-", dir="/tmp")  # the nodes see /tmp too
    os.environ["IPYTHONDIR"] = os.path.join(tmp, "ipython")  # stock ipyparallel's profile
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for name in ("distributed", "distributed.deploy.ssh"):  # the latter relays remote stderr
        logging.getLogger(name).setLevel(logging.ERROR)
    notes: list[str] = []
    try:
        records = [
            measure(w, nodes, args.engines_per_node, tmp, notes)
            for nodes in counts
            for w in WAYS
            if w in asked
        ]
    finally:
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(table(records))
    for note in notes:
        print(f"note: {note}")
    if out:
        with open(out, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
