"""``lounge.map``: one task per item, load-balanced, retried if its engine dies, into a table."""

from __future__ import annotations

import time
from typing import Any

from .errors import LoungeError, LoungeTimeout
from .tasks import run_item


def _payloads(fn, items: list) -> list[bytes]:
    import cloudpickle

    return [
        cloudpickle.dumps((fn, (), item) if isinstance(item, dict) else (fn, (item,), {}))
        for item in items
    ]


def map_items(
    cluster, fn, items, *, retries: int = 1, timeout: float | None = None, progress: bool = True
):
    """Run ``fn`` on every item; a dict item is passed as keyword arguments (a sweep).

    Returns a DataFrame in input order: the parameters, ``result`` (and, when every result
    that did not fail is a dict, its keys as columns), ``error``, ``engine``, ``node``,
    ``host``, ``seconds``.
    """
    import pandas as pd

    if not callable(fn):
        raise LoungeError(f"map needs a function to call, not {type(fn).__name__}.")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise LoungeError(f"retries must be a whole number of 0 or more, not {retries!r}.")
    items = list(items)
    futures = cluster.kind.submit_all(cluster.client, run_item, _payloads(fn, items), retries)
    lost = _wait(futures, timeout, progress, lambda: _all_engines_gone(cluster))
    rows = []
    for i, (item, fut) in enumerate(zip(items, futures)):
        row: dict[str, Any] = dict(item) if isinstance(item, dict) else {"item": item}
        try:
            if i in lost:
                raise LoungeError(f"lost: {lost[i]}")
            out = fut.result()
        except Exception as e:  # noqa: BLE001 - the engine died more often than retried
            out = {
                "result": None,
                "error": f"{type(e).__name__}: {e}",
                "engine": -1,
                "node": "",
                "host": "",
                "seconds": float("nan"),
            }
        row.update(out)
        rows.append(row)
    df = pd.DataFrame(rows)
    results = [r["result"] for r in rows if r["error"] is None]
    if results and all(isinstance(r, dict) for r in results):
        for key in dict.fromkeys(k for r in results for k in r):
            if key not in df.columns:
                df[key] = [
                    r["result"].get(key) if isinstance(r["result"], dict) else None for r in rows
                ]
    return df


def _all_engines_gone(cluster) -> str | None:
    """Why no engine of the cluster can ever run an item again, or None while one can."""
    rows = cluster.nodes_status()
    if rows and all(r["status"] in ("lost", "failed", "stopped", "controller-lost") for r in rows):
        return "; ".join(dict.fromkeys(str(r["error"] or r["status"]) for r in rows))
    return None


def _wait(futures: list, timeout: float | None, progress: bool, gone) -> dict[int, str]:
    """Wait for every future; return {index: reason} for those given up as lost."""
    from tqdm.auto import tqdm

    pending = set(range(len(futures)))
    deadline = None if timeout is None else time.monotonic() + timeout
    next_check = time.monotonic() + 1.0
    with tqdm(total=len(futures), disable=not progress, desc="lounge.map", unit="item") as bar:
        while pending:
            done = {i for i in pending if futures[i].done()}
            if done:
                bar.update(len(done))
                pending -= done
                continue
            if time.monotonic() > next_check:
                next_check = time.monotonic() + 1.0
                reason = gone()
                if reason:  # nothing is left to run them: report them, do not hang
                    for i in pending:
                        futures[i].cancel()
                    return dict.fromkeys(pending, reason)
            if deadline is not None and time.monotonic() > deadline:
                for i in pending:
                    futures[i].cancel()
                raise LoungeTimeout(
                    f"Timed out after {timeout:g} s waiting for map results: "
                    f"{len(pending)} of {len(futures)} items unfinished."
                )
            time.sleep(0.05)
    return {}
