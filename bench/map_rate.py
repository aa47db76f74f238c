"""Map benchmark: items per second of ``lounge.map`` and of the stock ways, on the same engines.

One run, 8 local engines of each kind (``--engines``), TensorFlow not preloaded (the map is
measured, not the launch). The ways, each on the same lounge engines:

* ours: ``lounge.map(f, items)`` (batches sized from the time per item, the function
  shipped once per node), ipyparallel and Dask engines; a map is a run, so the time counts
  all of it: the items written to the run's store, the cluster's run driver dispatching
  them and committing every row, and the kernel reading the table back;
* ipp LBV 1: stock ``rc.load_balanced_view().map(f, items, chunksize=1)``: a task per item;
* ipp LBV best: the same with the best of chunksizes 64, 1024 and 8192, as a user who tuned it;
* dask map: stock ``client.map(f, items)`` (a task per item).

The cases: tiny items (``lambda v: v + 1``; the stock per-item ways get fewer items, as
they are slow, and are reported per second); 64 items over a closure holding 40 MB (a new
array each run, so nothing is cached on the engines);
1,000,000 tiny items into the DataFrame (ours); 64 items of 1 s each (load balance: 8 s is
the floor with 8 engines). Every timing is repeated (``--repeat``, default 3) and the table
gives the median. Results are checked; nothing is asserted. This machine has 2 cores: the
8 engines share them, so these numbers measure overhead, not parallel speed.

    python bench/map_rate.py [--engines 8] [--repeat 3] [--quick] [--json out.json]
                             [--cases tiny,closure,1s,million] [--kinds ipyparallel,dask]
                             [--ours-only]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from _common import markdown_table

TINY = 100_000  # tiny items for ours and the tuned stock way
TINY_SLOW = 5_000  # tiny items for the stock ways that send one task per item
MILLION = 1_000_000
CASES = {  # --cases names
    "tiny": "tiny items",
    "closure": "64 items, 40 MB closure",
    "1s": "64 items of 1 s",
    "million": "1,000,000 tiny items",
}


def timed(fn, check) -> float:
    t0 = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - t0
    check(out)
    return seconds


def expect(values, wanted) -> None:
    values = list(values)
    if values != list(wanted):
        raise RuntimeError(f"wrong results: {values[:5]}... (expected {list(wanted)[:5]}...)")


def cases(lounge, args):
    """(case, way, items, seconds-callable) for this cluster's kind."""
    import numpy as np

    def with_closure(mapper):
        """A run over a closure holding a new 40 MB array (nothing of it cached anywhere)."""

        def run():
            big = np.random.rand(5_000_000)

            def closure(i):
                return float(big[i])

            return timed(lambda: mapper(closure), lambda r: expect(r, big[:64].tolist()))

        return run

    def second(i):
        import time

        time.sleep(1.0)
        return i

    def tiny(v):
        return v + 1

    kind = lounge.kind.name
    ours = f"ours ({kind})"
    n_tiny = TINY // 10 if args.quick else TINY

    def ours_map(f, n: int, wanted):
        return lambda: timed(
            lambda: lounge.map(f, range(n), progress=False).result, lambda r: expect(r, wanted)
        )

    out = [
        ("tiny items", ours, n_tiny, ours_map(tiny, n_tiny, range(1, n_tiny + 1))),
        (
            "64 items, 40 MB closure",
            ours,
            64,
            with_closure(lambda f: lounge.map(f, range(64), progress=False).result),
        ),
        ("64 items of 1 s", ours, 64, ours_map(second, 64, range(64))),
    ]
    if not args.quick:
        million = ours_map(tiny, MILLION, range(1, MILLION + 1))
        out.append(("1,000,000 tiny items", ours, MILLION, million))
    client = lounge.client
    wanted = {CASES[c] for c in args.cases.split(",")}
    if args.ours_only:
        return [c for c in out if c[0] in wanted]
    if kind == "ipyparallel":
        view = client.load_balanced_view()

        def lbv(f, items, chunksize):
            return lambda: view.map(f, items, chunksize=chunksize, block=True)

    if kind == "ipyparallel" and "tiny items" in wanted:  # (the best chunksize is timed now)
        out.append(
            (
                "tiny items",
                "ipp LBV 1",
                TINY_SLOW,
                lambda: timed(
                    lbv(tiny, range(TINY_SLOW), 1), lambda r: expect(r, range(1, TINY_SLOW + 1))
                ),
            )
        )
        best = min(
            (64, 1024, 8192),
            key=lambda c: timed(lbv(tiny, range(TINY // 10), c), lambda r: None),
        )
        out.append(
            (
                "tiny items",
                f"ipp LBV {best}",
                n_tiny,
                lambda: timed(
                    lbv(tiny, range(n_tiny), best), lambda r: expect(r, range(1, n_tiny + 1))
                ),
            )
        )
    if kind == "ipyparallel":
        out.append(
            (
                "64 items, 40 MB closure",
                "ipp LBV 1",
                64,
                with_closure(lambda f: lbv(f, range(64), 1)()),
            )
        )
    else:

        def dask_map(f, items):
            return lambda: client.gather(client.map(f, items, pure=False))

        out.append(
            (
                "tiny items",
                "dask map",
                TINY_SLOW,
                lambda: timed(
                    dask_map(tiny, range(TINY_SLOW)),
                    lambda r: expect(r, range(1, TINY_SLOW + 1)),
                ),
            )
        )
        out.append(
            (
                "64 items, 40 MB closure",
                "dask map",
                64,
                with_closure(lambda f: dask_map(f, range(64))()),
            )
        )
    return [c for c in out if c[0] in wanted]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engines", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="fewer items, no million")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument(
        "--cases", default=",".join(CASES), help=f"which, comma separated: {','.join(CASES)}"
    )
    ap.add_argument("--kinds", default="ipyparallel,dask", help="engine kinds, comma separated")
    ap.add_argument("--ours-only", action="store_true", help="lounge.map only, no stock way")
    args = ap.parse_args()
    unknown = set(args.cases.split(",")) - set(CASES)
    if unknown:
        ap.error(f"unknown case(s) {', '.join(sorted(unknown))}; known: {', '.join(CASES)}")

    from jupyter_lounge import Lounge

    rows = []
    for kind in args.kinds.split(","):
        lounge = Lounge(args.engines, engines=kind, wait=True, timeout=300).start_sync()
        try:
            for case, way, items, run in cases(lounge, args):
                row = {"kind": kind, "case": case, "way": way, "items": items}
                try:
                    runs = [run() for _ in range(args.repeat)]
                except Exception as e:  # noqa: BLE001 - a stock way that cannot do it
                    why = str(e).splitlines()[-1] if str(e) else ""
                    rows.append({**row, "seconds": "", "items/s": 0, "runs": f"fails: {why}"})
                    print(rows[-1], flush=True)
                    continue
                seconds = statistics.median(runs)
                rows.append(
                    {
                        **row,
                        "seconds": round(seconds, 2),
                        "items/s": round(items / seconds),
                        "runs": " ".join(f"{r:.2f}" for r in runs),
                    }
                )
                print(rows[-1], flush=True)
        finally:
            lounge.stop_sync()
    for row in rows:  # how many times the items/s of ours (same kind) is this way's
        ours = next(
            (
                r
                for r in rows
                if (r["kind"], r["case"]) == (row["kind"], row["case"])
                and r["way"].startswith("ours")
            ),
            None,
        )
        row["ours/this"] = (
            "" if ours is None or not row["items/s"] else f"{ours['items/s'] / row['items/s']:.2f}"
        )
    print()
    print(
        f"{args.engines} local engines per kind; medians of {args.repeat}; 2 cores shared by "
        "every engine (overhead, not parallel speed)"
    )
    head = ["case", "way", "items", "seconds", "items/s", "ours/this", "runs"]
    print(markdown_table(head, [[str(r[c]) for c in head] for r in rows]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
