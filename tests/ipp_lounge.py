"""A pytest plugin that runs ipyparallel's own tests (its installed ``ipyparallel.tests``
modules, never copies) against lounge engines:

    python -m pytest -p tests.ipp_lounge --pyargs ipyparallel.tests.test_view

Their suite starts one ``ipcontroller`` per test module and adds ``ipengine`` processes with
``ipyparallel.tests.setup``, ``add_engines`` and ``teardown``. This plugin puts one lounge
cluster (local backend, our controller, engines forked by a node agent) in their place, scaled
with ``Cluster.scale``, and leaves its client connection file where their tests look for it
(profile ``iptest`` in the module's IPython dir).

Where a stock expectation is deliberately different on lounge engines, the test is listed in
``DIFFERENT`` with the reason and skipped; nothing else is. A stock test that bounds what
happens within a wall-clock time is listed in ``TIMED`` with that bound: when it fails it is
run once more: the first try's failure is printed, the second try is the one reported (a
loaded machine can miss such a bound with stock engines too).
"""

from __future__ import annotations

import os
import shutil
import time

import pytest

#: test id (module::class::test) -> why lounge engines deliberately differ there.
DIFFERENT: dict[str, str] = {
    "test_client.py::TestClient::test_warning_on_hostname_match": (
        "a local lounge cluster's controller listens on Unix sockets (ipc://), not on a "
        "localhost port, so the warning for a client on another host than a localhost "
        "controller does not apply: a Unix socket is reached from its own machine only"
    ),
}

#: test id -> the wall-clock bound in it that a loaded machine can miss.
TIMED: dict[str, str] = {
    "test_lbview.py::TestLoadBalancedView::test_imap_max_outstanding": (
        "5 to 10 tasks submitted by its first and second results, tasks of 0.1 s each that "
        "the client's threads submit as others finish"
    ),
}

_cluster = None


class _EngineHandle:
    """What their suite keeps of an engine it added (a launcher with ``poll``): here the
    engine's rank, alive while its node agent reports it running."""

    def __init__(self, rank: int):
        self.rank = rank

    def poll(self):
        for row in _cluster.engines() if _cluster is not None else ():
            if row["rank"] == self.rank and row["state"] == "running":
                return None
        return 0


def _count() -> int:
    """Engines the controller has registered now, through a client of our own (their tests
    destroy the global ZMQ context after each test, and with it any client on it)."""
    import ipyparallel as ipp
    import zmq

    context = zmq.Context()
    try:
        client = ipp.Client(str(_cluster.kind.connection_files(_cluster.dir)[1]), context=context)
        try:
            return len(client.ids)
        finally:
            client.close(linger=0)
    finally:
        context.term()


def _running() -> frozenset:
    """(rank, pid) of every engine the node agents report running."""
    from jupyter_lounge import protocol
    from jupyter_lounge.cluster import _report

    _cluster.reload()
    return frozenset(
        (rank, e.get("pid"))
        for a in _cluster.agents
        for rank, e in (_report(a) or protocol.Report()).engines.items()
        if e.get("state") == "running"
    )


_settled_as: frozenset | None = None


def _settle(timeout: float = 60.0) -> None:
    """Before each test: when the engines the agents run changed since the last look (an
    engine that crashed in the test before was replaced: stock engines are not), wait until
    the controller has exactly those registered, so that no engine registers in the middle of
    the next test (seen: test_push_pull_function pushed to 3 engines, then pulled from 4)."""
    global _settled_as
    if _cluster is None or (running := _running()) == _settled_as:
        return
    deadline = time.monotonic() + timeout
    while (count := _count()) != len(running):
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"lounge engines: the controller has {count} engines registered, the node "
                f"agent runs {len(running)}, after {timeout:g} s"
            )
        time.sleep(0.1)
        running = _running()
    _settled_as = running


def _wait_for(n: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while _count() < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"lounge engines: fewer than {n} registered after {timeout:g} s")
        time.sleep(0.1)


def lounge_setup() -> None:
    """One lounge cluster with one engine; its client file where ``Client(profile='iptest')``
    looks."""
    global _cluster
    from ipyparallel import error
    from ipyparallel.tests import RemoteErrorWithTB
    from IPython.paths import get_ipython_dir

    from jupyter_lounge import Lounge

    error.RemoteError = RemoteErrorWithTB
    # their engines run with --InteractiveShell.colors=nocolor (tracebacks are matched as
    # text): the same setting, from the engines' profile in the module's IPython dir
    default = os.path.join(get_ipython_dir(), "profile_default")
    os.makedirs(default, exist_ok=True)
    with open(os.path.join(default, "ipengine_config.py"), "w") as f:
        f.write('c.InteractiveShell.colors = "nocolor"\n')
    # their tests expect a quick heartbeat (their controller runs with --ping=250)
    _cluster = Lounge(1, engines="ipyparallel", wait=True, heartbeat_ms=250)
    _cluster.start_sync()
    security = os.path.join(get_ipython_dir(), "profile_iptest", "security")
    os.makedirs(security, exist_ok=True)
    engine_file, client_file = _cluster.kind.connection_files(_cluster.dir)
    shutil.copy(client_file, os.path.join(security, "ipcontroller-client.json"))
    shutil.copy(engine_file, os.path.join(security, "ipcontroller-engine.json"))


def lounge_add_engines(n: int = 1, profile: str = "iptest", total: bool = False) -> list:
    base = _count()
    if total:
        n = max(n - base, 0)
    if n == 0:
        return []
    _cluster.reload()
    before = {row["rank"] for row in _cluster.engines()}
    _cluster.scale_sync(max(_cluster.n, base) + n)
    _wait_for(base + n)
    return [_EngineHandle(r["rank"]) for r in _cluster.engines() if r["rank"] not in before]


def lounge_teardown() -> None:
    global _cluster, _settled_as
    if _cluster is not None:
        _cluster.stop_sync()
        _cluster = None
    _settled_as = None


def pytest_configure(config) -> None:
    # Before their conftest and clienttest import these names from ipyparallel.tests.
    import ipyparallel.tests as stock

    stock.setup, stock.add_engines, stock.teardown = (
        lounge_setup,
        lounge_add_engines,
        lounge_teardown,
    )


def pytest_runtest_setup(item) -> None:
    _settle()


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        test_id = item.nodeid.split("/")[-1]
        if test_id in DIFFERENT:
            item.add_marker(pytest.mark.skip(reason=f"lounge engines: {DIFFERENT[test_id]}"))


def pytest_runtest_protocol(item, nextitem):
    """A ``TIMED`` test that fails is run once more; the first try's failure is printed, the
    second try is the one reported."""
    test_id = item.nodeid.split("/")[-1]
    if test_id not in TIMED:
        return None
    from _pytest.runner import runtestprotocol

    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    reports = runtestprotocol(item, nextitem=item, log=False)  # its class and module stay
    if any(r.failed for r in reports):
        first = "\n".join(str(r.longrepr) for r in reports if r.failed)
        print(f"\n{test_id} failed once ({TIMED[test_id]}); run again. It said:\n{first}")
        item._initrequest()  # a fresh request for the second try
        reports = runtestprotocol(item, nextitem=nextitem, log=False)
    else:
        item.session._setupstate.teardown_exact(nextitem)  # what the next test does not use
    for r in reports:
        item.ihook.pytest_runtest_logreport(report=r)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True
