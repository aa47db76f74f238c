"""What the launch benchmarks share: bounded waits and the check of the engines' answers."""

from __future__ import annotations

import os
import threading
import time

TIMEOUT = 300.0  # seconds any one step of any way may take


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


def _is_dask(client) -> bool:
    return type(client).__module__.startswith("distributed")


def run_everywhere(client, op, n: int) -> None:
    """op() on every engine of an ipyparallel or Dask client; all ``n`` must answer 64.0.
    ``op`` comes from the calling script's ``__main__``, so it travels by value."""
    if _is_dask(client):
        check_results(with_timeout(lambda: client.run(op)).values(), n)
    else:
        check_results(client[:].apply_async(op).get(timeout=TIMEOUT), n)


def wait_for_quiet(way: str, notes: list[str], idle: float = 0.85, limit: float = 120.0) -> None:
    """Wait until this machine's CPUs are at least ``idle`` idle over a second (at most
    ``limit`` s) before a way is timed: what ran before it (a sync's tidying and writeback on
    the nodes, a stock launcher's engines that outlive its stop) is not counted in it."""
    t0 = time.monotonic()

    def idle_share() -> float:
        with open("/proc/stat") as f:
            a = [int(x) for x in f.readline().split()[1:8]]
        time.sleep(1.0)
        with open("/proc/stat") as f:
            b = [int(x) for x in f.readline().split()[1:8]]
        d = [y - x for x, y in zip(a, b)]
        return d[3] / max(sum(d), 1)

    while (share := idle_share()) < idle:
        if time.monotonic() - t0 > limit:
            notes.append(f"{way}: timed with the machine {1 - share:.0%} busy after {limit:g} s")
            return
    waited = time.monotonic() - t0
    if waited > 2:
        notes.append(f"{way}: waited {waited:.0f} s for the machine to be quiet first")


def time_ours(rec: dict, way: str, cluster, op, notes: list[str]) -> None:
    """Start one of our clusters, run ``op`` everywhere, set rec["seconds"], stop it."""
    wait_for_quiet(way, notes)
    t0 = time.perf_counter()
    try:
        cluster.start_sync()
        run_everywhere(cluster.client, op, rec["n"])
        rec["seconds"] = time.perf_counter() - t0
        notes.append(
            f"{way}: engines on {hosts(cluster.client)}; {len(cluster.agents)} node agents"
        )
    finally:
        quietly(cluster.stop_sync, way, notes)


def time_stock_ipyparallel(rec: dict, mark: str, op, notes: list[str], **options) -> None:
    """Stock ``ipyparallel.Cluster(**options)``: start, connect, run ``op``, stop."""
    import ipyparallel as ipp

    wait_for_quiet("ipyparallel", notes)
    t0 = time.perf_counter()
    cluster = ipp.Cluster(n=rec["n"], cluster_id=mark, engine_timeout=TIMEOUT, **options)
    rc = None
    try:
        rc = cluster.start_and_connect_sync()  # waits for n engines, up to engine_timeout
        run_everywhere(rc, op, rec["n"])
        rec["seconds"] = time.perf_counter() - t0
        notes.append(f"ipyparallel: engines on {hosts(rc)}")
    finally:
        if rc is not None:
            rc.close()
        quietly(cluster.stop_cluster_sync, "ipyparallel", notes)


def markdown_table(head: list[str], rows: list[list[str]]) -> str:
    """Aligned plain text that is also a markdown table (numbers right-aligned)."""
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["| " + " | ".join(c.rjust(w) for c, w in zip(r, widths)) + " |" for r in [head, *rows]]
    lines.insert(1, "|" + "|".join("-" * (w + 1) + ":" for w in widths) + "|")
    return "\n".join(lines)


def hosts(client) -> str:
    """Where a cluster's engines run, e.g. ``node1 x4, node2 x4`` (ipyparallel or Dask)."""
    import socket
    from collections import Counter

    if _is_dask(client):
        names = with_timeout(lambda: client.run(socket.gethostname), 60).values()
    else:
        names = client[:].apply_async(socket.gethostname).get(timeout=60)
    return ", ".join(f"{h} x{k}" for h, k in sorted(Counter(names).items()))


def quietly(stop, way: str, notes: list[str]) -> None:
    """stop(); an error is noted, not raised (it would hide the error that led here)."""
    try:
        stop()
    except Exception as e:  # noqa: BLE001 - noted
        notes.append(f"{way}: stopping failed: {type(e).__name__}: {str(e)[:200]}")


MAX_NODES = 8  # the testbed's node addresses are 10.77.0.11 to .18 (tests/infra/up)


def testbed_nodes() -> int:
    """How many nodes the testbed that is up has (its hosts file names node1..nodeN)."""
    path = os.path.join(os.environ.get("LOUNGE_TESTBED", "/tmp/lounge-testbed"), "net", "hosts")
    try:
        with open(path) as f:
            return sum(1 for line in f if line.split()[1:2] and line.split()[1].startswith("node"))
    except OSError:
        return 0


def node_counts(text: str) -> list[int]:
    """``--nodes 1,2,4,8``: the node counts to run, each checked against the testbed's; or
    ValueError with the sentence to print."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--nodes {text!r}: give node counts such as 3 or 1,2,4,8") from None
    have = testbed_nodes()
    if not counts or any(not 1 <= c <= MAX_NODES for c in counts):
        raise ValueError(f"--nodes {text!r}: each count must be 1 to {MAX_NODES}")
    if max(counts) > have:
        raise ValueError(
            f"--nodes {text!r}: the testbed has {have} nodes; bring up {max(counts)} with "
            f"`tests/infra/reup {max(counts)} 8 > .testbed.env` (and `tests/infra/reup 3 8` after)"
        )
    return counts
