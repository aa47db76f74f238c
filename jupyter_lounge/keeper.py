"""The keeper: stops a cluster when the process that started it dies.

``python -m jupyter_lounge.keeper CLUSTER_DIR OWNER_PID OWNER_START CREATED``

A cluster started in a kernel (or any Python process) stops with it at a normal exit, through
``atexit``; but a kernel killed by SIGKILL, the OOM killer or a crashed laptop session runs no
exit handler, and its controller, agents, engines and Slurm jobs would run on, unseen. So such a
cluster gets a keeper: a small detached process that looks at its owner once a second and, when
the owner is gone (the very process, not a later one with its pid), stops the cluster as
``lounge stop`` would, once its runs (runstore.py) have ended: a sweep outlives its notebook.
It leaves by itself once the cluster is stopped or replaced. Clusters
started with ``lounge start`` or from the sidebar are detached on purpose and have none.
"""

from __future__ import annotations

import os
import sys
import time

LOOK_EVERY_S = 1.0
STOP_TIMEOUT_S = 120.0


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 4:
        raise SystemExit("usage: python -m jupyter_lounge.keeper CLUSTER_DIR PID START CREATED")
    cdir, owner, owner_start, created = argv[0], int(argv[1]), argv[2], float(argv[3])
    os.environ["JUPYTER_LOUNGE_DIR"] = os.path.dirname(os.path.abspath(cdir))
    name = os.path.basename(os.path.abspath(cdir))

    from . import state
    from .procs import ours

    def mine() -> dict | None:
        try:
            data = state.load_state(name)
        except state.CorruptState:
            return None
        return data if data is not None and data.get("created") == created else None

    while ours(owner, owner_start):
        if mine() is None:
            return  # stopped (or another cluster took the name): nothing left to keep
        time.sleep(LOOK_EVERY_S)
    if mine() is None:
        return
    from . import runner, runstore

    waited = False
    while mine() is not None and runstore.active(name):  # a sweep outlives its notebook
        if not waited:
            print(
                f"keeper: the process {owner} that started {name!r} is gone; its runs "
                f"{', '.join(runstore.active(name))} go on, and the cluster stops once they end",
                flush=True,
            )
            waited = True
        runner.ensure(name)  # a driver that died comes back and resumes them
        time.sleep(LOOK_EVERY_S)
    data = mine()
    if data is None:
        return
    print(f"keeper: the process {owner} that started {name!r} is gone; stopping it", flush=True)
    import asyncio

    from .cluster import Cluster

    cluster = Cluster.from_state(data)
    asyncio.run(asyncio.wait_for(cluster.stop(), STOP_TIMEOUT_S))
    print(f"keeper: {name!r} stopped", flush=True)


if __name__ == "__main__":
    main()
