"""What the secure defaults cost at launch: N engines (default 32) on this machine, each
registered and having run a TensorFlow op, for both engine kinds, three ways in one run:

* secure: today's defaults (Dask: mutual TLS with the cluster's own CA; ipyparallel:
  CurveZMQ and signed messages; the keeper; folder and value checks);
* no-tls: today's code with ``--no-tls`` (no encryption; everything else as above);
* old: the code of ``--old REV`` (default: the last commit before secure defaults), in a git
  worktree made for the run, with its own defaults (Dask in the clear, ipyparallel signed).

Each launch runs in a fresh Python process (the same for every way); the ways are interleaved,
after one untimed warm-up launch, and repeated (``--repeat``, default 5): this machine is noisy,
so the table gives medians and every run. The goal: secure/old at most 1.10. Nothing is
asserted.

    python bench/secure_launch.py [--n 32] [--repeat 5] [--old REV] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from _common import markdown_table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OLD = "96e1b72"  # main before secure defaults (issue 10)

ONCE = r"""
import sys, time
kind, tls, n = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])

def tf_op():
    import tensorflow as tf
    return float(tf.reduce_sum(tf.ones((8, 8))))

from jupyter_lounge import Lounge
t0 = time.perf_counter()
c = Lounge(n, engines=kind, tls=tls, preload=["tensorflow"], wait=True,
           timeout=600)
try:
    c.start_sync()
    if kind == "dask":
        values = list(c.client.run(tf_op).values())
    else:
        values = c.client[:].apply_async(tf_op).get(timeout=300)
    assert values == [64.0] * n, values
    print(time.perf_counter() - t0, flush=True)
finally:
    c.stop_sync()
"""


def once(code_root: str, kind: str, tls: bool, n: int, lounge_dir: str) -> float:
    env = dict(os.environ, PYTHONPATH=code_root, JUPYTER_LOUNGE_DIR=lounge_dir)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    out = subprocess.run(
        [sys.executable, "-c", ONCE, kind, "1" if tls else "0", str(n)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=code_root,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{kind} launch failed: {out.stderr[-1500:]}")
    return float(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--old", default=OLD, help="the commit whose defaults are 'old'")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="lounge-bench-")
    old_root = os.path.join(tmp, "old")
    subprocess.run(
        ["git", "-C", ROOT, "worktree", "add", "--detach", "-q", old_root, args.old], check=True
    )
    ways = {  # name -> (code, tls)
        "secure": (ROOT, True),
        "no-tls": (ROOT, False),
        "old": (old_root, False),
    }
    seconds = {(kind, way): [] for kind in ("ipyparallel", "dask") for way in ways}
    try:
        once(ROOT, "ipyparallel", True, args.n, os.path.join(tmp, "lounge"))  # warm-up
        for r in range(args.repeat):
            order = list(ways) if r % 2 == 0 else list(ways)[::-1]  # no way always goes first
            for kind in ("ipyparallel", "dask"):
                for way in order:
                    code, tls = ways[way]
                    took = once(code, kind, tls, args.n, os.path.join(tmp, "lounge"))
                    seconds[(kind, way)].append(took)
                    print(f"run {r + 1}: {kind} {way}: {took:.1f} s", file=sys.stderr, flush=True)
    finally:
        subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", old_root])
        shutil.rmtree(tmp, ignore_errors=True)
    rows = []
    for kind in ("ipyparallel", "dask"):
        med = {way: statistics.median(seconds[(kind, way)]) for way in ways}
        rows.append(
            [kind, str(args.n)]
            + [f"{med[w]:.1f}" for w in ways]
            + [f"{med['secure'] / med['old']:.2f}", f"{med['secure'] / med['no-tls']:.2f}"]
            + [" ".join(f"{x:.1f}" for x in seconds[(kind, w)]) for w in ways]
        )
    head = ["engines", "N", "secure s", "no-tls s", "old s", "secure/old", "secure/no-tls"]
    head += [f"{w} runs" for w in ways]
    print(markdown_table(head, rows))
    print(f"note: old = {args.old}; medians of {args.repeat} runs; 2 cores, TensorFlow preloaded")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{k}-{w}": v for (k, w), v in seconds.items()}, f, indent=1)


if __name__ == "__main__":
    main()
