"""What the secure defaults cost at launch: N engines (default 32) on this machine, each
registered and having run a TensorFlow op, with the defaults (Dask: mutual TLS with the
cluster's own CA; ipyparallel: CurveZMQ and signed messages) and with ``--no-tls`` (the
defaults before: Dask in the clear, ipyparallel signed only), both engine kinds.

The ways are interleaved and repeated (``--repeat``, default 3), since this machine is noisy;
the table gives the median of each and the ratio secure/plain (the goal: at most 1.10). The
start-to-first-op time includes the cluster's one ``import tensorflow`` in the node agent.
Nothing is asserted.

    python bench/secure_launch.py [--n 32] [--repeat 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

from _common import markdown_table, run_everywhere

WAYS = [
    ("ipyparallel", True),
    ("ipyparallel", False),
    ("dask", True),
    ("dask", False),
]


def tf_op() -> float:
    """Runs in each engine: defined here, so it is sent by value, not imported there."""
    import tensorflow as tf

    return float(tf.reduce_sum(tf.ones((8, 8))))


def once(kind: str, tls: bool, n: int) -> float:
    from jupyter_lounge import Lounge

    t0 = time.perf_counter()
    cluster = Lounge(
        n, engines=kind, tls=tls, preload=["tensorflow"], wait=True, progress=False, timeout=600
    )
    try:
        cluster.start_sync()
        run_everywhere(cluster.client, tf_op, n)
        return time.perf_counter() - t0
    finally:
        cluster.stop_sync()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="lounge-bench-")
    os.environ["JUPYTER_LOUNGE_DIR"] = os.path.join(tmp, "lounge")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    seconds: dict[tuple[str, bool], list[float]] = {way: [] for way in WAYS}
    try:
        for r in range(args.repeat):
            for kind, tls in WAYS:
                took = once(kind, tls, args.n)
                seconds[(kind, tls)].append(took)
                label = "secure" if tls else "--no-tls"
                print(f"run {r + 1}: {kind} {label}: {took:.1f} s", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows = []
    for kind in ("ipyparallel", "dask"):
        secure = statistics.median(seconds[(kind, True)])
        plain = statistics.median(seconds[(kind, False)])
        rows.append(
            [
                kind,
                str(args.n),
                f"{secure:.1f}",
                f"{plain:.1f}",
                f"{secure / plain:.2f}",
                " ".join(f"{x:.1f}" for x in seconds[(kind, True)]),
                " ".join(f"{x:.1f}" for x in seconds[(kind, False)]),
            ]
        )
    head = ["engines", "N", "secure s", "--no-tls s", "secure/plain", "secure runs", "plain runs"]
    print(markdown_table(head, rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{k}-{'tls' if t else 'plain'}": v for (k, t), v in seconds.items()}, f)


if __name__ == "__main__":
    main()
