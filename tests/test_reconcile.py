"""The cluster's reconcile logic against a fake backend and a fake engine kind (tests/fakes.py):
start, scale up and down, placement, lost and failed agents, retired engines, interrupt,
releasing allocations and stop. Real Cluster code paths, no engine: each test takes well
under a second, and the module runs first in the suite (tests/conftest.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import psutil
import pytest

import jupyter_lounge.cluster as cluster_module
from jupyter_lounge import state
from jupyter_lounge.cluster import Cluster
from jupyter_lounge.errors import LoungeError
from jupyter_lounge.procs import alive

from .fakes import FakeBackend, FakeKind, agent_io

pytestmark = pytest.mark.fast


@pytest.fixture
def make(monkeypatch):
    """make(n, backend=FakeBackend(...), gate=None, **Cluster options) -> an unstarted
    Cluster on that backend with a FakeKind (so is every Cluster made in the test, attached
    ones too); stopped after the test if it still runs."""
    made = []

    def make_cluster(n, backend=None, gate=None, **options):
        backend = backend or FakeBackend()
        kind = FakeKind(backend, gate)
        monkeypatch.setattr(cluster_module, "make_backend", lambda name, **o: backend)
        monkeypatch.setattr(cluster_module, "engine_kind", lambda name: kind)
        options = {"stop_at_exit": False, "wait": True, "timeout": 10, **options}
        c = Cluster(n, **options)
        made.append(c)
        return c

    yield make_cluster
    for c in made:
        if c.status in ("starting", "running", "stopping"):
            asyncio.run(c.stop(forget=True))


def started(make, n, **options) -> tuple[Cluster, FakeBackend]:
    c = make(n, **options)
    asyncio.run(c.start())
    return c, c.backend


def ranks(c: Cluster) -> dict[str, list[int]]:
    return {a["key"]: list(a["ranks"]) for a in c.agents}


def controls(c: Cluster) -> dict[str, list[int] | None]:
    """The ranks each agent's control file says now."""
    return {a["key"]: agent_io(a)[0]["ranks"] for a in c.agents}


def registered_ranks(c: Cluster) -> list[int]:
    return sorted(rank for _, rank in c.registered())


# -- start and placement ---------------------------------------------------------------------
def test_start_places_one_allocation_as_the_plan_says(make):
    c, b = started(make, 5, backend=FakeBackend(slots=2))
    assert c.status == "running"
    assert b.placed() == [[("0.0", "n0", [0, 1]), ("0.1", "n1", [2, 3]), ("0.2", "n2", [4])]]
    assert controls(c) == {"0.0": [0, 1], "0.1": [2, 3], "0.2": [4]}
    assert registered_ranks(c) == [0, 1, 2, 3, 4]
    assert (c.next_rank, c.next_alloc) == (5, 1)
    saved = state.load_state(c.name)
    assert saved["status"] == "running" and saved["n"] == 5
    assert [a["ranks"] for a in saved["agents"]] == [[0, 1], [2, 3], [4]]
    assert [(r["node"], r["status"], r["ready"], r["target"]) for r in c.nodes_status()] == [
        ("n0", "running", 2, 2),
        ("n1", "running", 2, 2),
        ("n2", "running", 1, 1),
    ]


def test_nodes_option_spreads_the_engines_over_that_many_nodes(make):
    c, b = started(make, 5, nodes=2)
    assert b.placed() == [[("0.0", "n0", [0, 1, 2]), ("0.1", "n1", [3, 4])]]
    assert registered_ranks(c) == [0, 1, 2, 3, 4]


def test_more_nodes_than_engines_is_refused_before_anything_starts(make):
    with pytest.raises(LoungeError) as info:
        make(2, nodes=3)
    assert str(info.value) == (
        "3 nodes for 2 engines would leave nodes empty: ask for at most 2 nodes."
    )
    assert state.list_states() == []


# -- scale on a backend that grows in place (local, ssh) -------------------------------------
def test_scale_up_in_place_adds_ranks_to_the_smallest_agents_and_nudges_each(make):
    c, b = started(make, 3, backend=FakeBackend(slots=2))
    assert ranks(c) == {"0.0": [0, 1], "0.1": [2]}
    asyncio.run(c.scale(6))
    assert ranks(c) == {"0.0": [0, 1, 4], "0.1": [2, 3, 5]}
    assert controls(c) == ranks(c)
    assert len(b.placed()) == 1 and b.released() == []  # no new agent, none released
    assert sorted(key for key, _ in b.nudged()) == ["0.0", "0.1"]  # each once
    assert {key: control["ranks"] for key, control in b.nudged()} == ranks(c)
    assert all(control["size"] == 6 for _, control in b.nudged())
    assert registered_ranks(c) == [0, 1, 2, 3, 4, 5]
    assert (c.n, c.next_rank) == (6, 6)
    assert [a["ranks"] for a in state.load_state(c.name)["agents"]] == [[0, 1, 4], [2, 3, 5]]


def test_scale_down_removes_the_highest_ranks(make):
    c, b = started(make, 6, backend=FakeBackend(slots=2))
    asyncio.run(c.scale(8))
    assert ranks(c) == {"0.0": [0, 1, 6], "0.1": [2, 3, 7], "0.2": [4, 5]}
    asyncio.run(c.scale(5))
    assert ranks(c) == {"0.0": [0, 1], "0.1": [2, 3], "0.2": [4]}
    assert controls(c) == ranks(c)
    assert registered_ranks(c) == [0, 1, 2, 3, 4]
    asyncio.run(c.scale(1))
    assert ranks(c) == {"0.0": [0], "0.1": [], "0.2": []}  # emptied agents stay in place
    assert b.released() == [] and len(b.placed()) == 1
    assert registered_ranks(c) == [0]
    assert c.n == 1 and state.load_state(c.name)["n"] == 1


def test_scale_to_the_same_n_twice_is_harmless(make):
    c, b = started(make, 4, backend=FakeBackend(slots=2))
    for n in (4, 7):
        asyncio.run(c.scale(n))
        once = (ranks(c), c.next_rank, c.n, registered_ranks(c))
        asyncio.run(c.scale(n))
        assert (ranks(c), c.next_rank, c.n, registered_ranks(c)) == once
    assert ranks(c) == {"0.0": [0, 1, 4, 6], "0.1": [2, 3, 5]}
    assert controls(c) == ranks(c)
    assert len(b.placed()) == 1 and b.released() == []
    assert registered_ranks(c) == list(range(7))


def test_scale_of_a_stopped_cluster_is_refused(make):
    c, _ = started(make, 2)
    asyncio.run(c.stop())
    with pytest.raises(LoungeError, match=f"Cluster '{c.name}' is stopped, not running"):
        asyncio.run(c.scale(3))


# -- scale on a backend that allocates anew for each scale-up (Slurm) ------------------------
def test_scale_up_places_one_new_allocation(make):
    c, b = started(make, 2, backend=FakeBackend(slots=2, grows_in_place=False))
    asyncio.run(c.scale(7))
    assert b.placed() == [
        [("0.0", "n0", [0, 1])],
        [("1.0", "n0", [2, 3]), ("1.1", "n1", [4, 5]), ("1.2", "n2", [6])],
    ]
    assert c.next_alloc == 2 and c.next_rank == 7
    assert [a["alloc"] for a in c.agents] == [0, 1, 1, 1]
    assert b.nudged() == [("0.0", {"ranks": [0, 1], "size": 7, "interrupt": None, "stop": False})]
    assert controls(c) == ranks(c)
    assert registered_ranks(c) == list(range(7))
    assert b.released() == []


def test_scale_down_releases_exactly_the_allocations_it_empties(make):
    c, b = started(make, 2, backend=FakeBackend(slots=2, grows_in_place=False))
    asyncio.run(c.scale(5))  # alloc 1: [2, 3], [4]
    asyncio.run(c.scale(8))  # alloc 2: [5, 6], [7]
    assert ranks(c) == {"0.0": [0, 1], "1.0": [2, 3], "1.1": [4], "2.0": [5, 6], "2.1": [7]}
    asyncio.run(c.scale(6))  # alloc 2 keeps rank 5: nothing to release
    assert b.released() == []
    assert ranks(c) == {"0.0": [0, 1], "1.0": [2, 3], "1.1": [4], "2.0": [5], "2.1": []}
    asyncio.run(c.scale(4))  # alloc 2 empty, alloc 1 not
    assert b.released() == [["2.0", "2.1"]]
    assert ranks(c) == {"0.0": [0, 1], "1.0": [2, 3], "1.1": []}
    assert [a["key"] for a in state.load_state(c.name)["agents"]] == ["0.0", "1.0", "1.1"]
    asyncio.run(c.scale(2))
    assert b.released() == [["2.0", "2.1"], ["1.0", "1.1"]]
    assert ranks(c) == {"0.0": [0, 1]}
    assert registered_ranks(c) == [0, 1]
    asyncio.run(c.scale(3))  # grows again in a new allocation, never reusing a rank
    assert b.placed()[-1] == [("3.0", "n0", [8])]


# -- lost and failed agents ------------------------------------------------------------------
async def _start_past_a_gate(c: Cluster, gate, lost_key: str) -> None:
    """Start ``c``; its controller comes up only once the agent ``lost_key`` was dropped."""
    task = asyncio.create_task(c.start())

    async def dropped():
        while any(a["key"] == lost_key for a in c.agents) or not c.agents:
            assert not task.done(), task.exception()
            await asyncio.sleep(0.01)

    await asyncio.wait_for(dropped(), 10)
    gate.touch()
    await task


def test_unreachable_node_is_skipped_with_a_warning_where_the_backend_may_skip(make, tmp_path):
    why = "ssh: connect to host n1 port 22: Connection refused"
    backend = FakeBackend(slots=2, may_skip_nodes=True, unreachable={"n1": why})
    c = make(6, backend=backend, gate=tmp_path / "go")
    with pytest.warns(UserWarning, match=f"Lounge node 'n1' skipped: {why}"):
        asyncio.run(_start_past_a_gate(c, tmp_path / "go", "0.1"))
    assert c.status == "running" and c.n == 4
    assert ranks(c) == {"0.0": [0, 1], "0.2": [4, 5]}
    assert registered_ranks(c) == [0, 1, 4, 5]
    assert state.load_state(c.name)["n"] == 4


class LostOnceTheControllerRuns(FakeBackend):
    """Its unreachable agents are "pending" until the controller has written its files."""

    def agent_state(self, agent: dict) -> tuple[str, str]:
        client_file = Path(agent["files"]["spec"]).parent / "fake-client.json"
        if agent["node"] in self.unreachable and not client_file.exists():
            return "pending", "connecting"
        return super().agent_state(agent)


def test_unreachable_node_found_while_engines_register_is_skipped_too(make):
    why = "ssh: connect to host n1 port 22: Connection refused"
    backend = LostOnceTheControllerRuns(slots=2, may_skip_nodes=True, unreachable={"n1": why})
    c = make(6, backend=backend, timeout=1)
    with pytest.warns(UserWarning, match="Lounge node 'n1' skipped"):
        asyncio.run(c.start())
    assert c.status == "running" and c.n == 4
    assert registered_ranks(c) == [0, 1, 4, 5]


def test_unreachable_node_stops_the_start_where_the_backend_is_strict(make):
    why = "ssh: connect to host n1 port 22: Connection refused"
    c = make(6, backend=FakeBackend(slots=2, unreachable={"n1": why}))
    with pytest.raises(LoungeError) as info:
        asyncio.run(c.start())
    assert str(info.value) == f"The node agent n1 of {c.name!r} never started: {why}."
    assert c.backend.released() == [["0.0", "0.1", "0.2"]]  # the start cleaned up
    assert c.status == "stopped" and state.load_state(c.name) is None
    assert not alive(c.controller_pid)


def test_an_agent_that_reports_failed_raises_its_error(make):
    error = "CUDA error: no CUDA-capable device is detected"
    c = make(4, backend=FakeBackend(slots=2, failing={"n1": error}))
    with pytest.raises(LoungeError) as info:
        asyncio.run(c.start())
    assert str(info.value) == error
    assert c.backend.released() == [["0.0", "0.1"]]
    assert c.status == "stopped" and state.load_state(c.name) is None


def test_lost_and_pending_agents_show_in_nodes_status_and_engines(make):
    c, b = started(make, 4, backend=FakeBackend(slots=2))
    b.set_state("0.0", "lost", "node agent process 4242 is gone")
    b.set_state("0.1", "pending", "Slurm job 7 pending: Resources")
    rows = {r["node"]: r for r in c.nodes_status()}
    assert (rows["n0"]["status"], rows["n0"]["error"]) == (
        "lost",
        "node agent process 4242 is gone",
    )
    assert (rows["n1"]["status"], rows["n1"]["why"]) == (
        "pending",
        "Slurm job 7 pending: Resources",
    )
    assert {e["rank"]: e["state"] for e in c.engines()} == {
        0: "lost",
        1: "lost",
        2: "running",
        3: "running",
    }


def test_retired_engines_lower_the_target(make):
    c, b = started(make, 4, backend=FakeBackend(slots=2))
    b.retire(c.agents[1], 3)
    assert c.n == 4
    c.absorb_retired()
    assert c.n == 3 and ranks(c) == {"0.0": [0, 1], "0.1": [2]}
    assert state.load_state(c.name)["n"] == 3
    c.absorb_retired()  # once only
    assert c.n == 3
    asyncio.run(c.scale(4))  # a retired rank is never given out again
    assert ranks(c) == {"0.0": [0, 1], "0.1": [2, 4]}
    assert registered_ranks(c) == [0, 1, 2, 4]


def test_retired_engines_are_absorbed_by_nodes_status_and_scale(make):
    c, b = started(make, 4, backend=FakeBackend(slots=2))
    b.retire(c.agents[0], 0)
    assert [r["target"] for r in c.nodes_status()] == [1, 2]
    assert c.n == 3
    b.retire(c.agents[1], 2)
    asyncio.run(c.scale(1))  # absorbs rank 2 first (n 2), then drops the highest: 3
    assert ranks(c) == {"0.0": [1], "0.1": []}


# -- interrupt and stop ----------------------------------------------------------------------
def test_interrupt_writes_a_fresh_token_to_every_control_file(make):
    c, b = started(make, 5, backend=FakeBackend(slots=2))
    assert asyncio.run(c.interrupt()) == 5  # engines that were running
    first = {a["key"]: agent_io(a)[0] for a in c.agents}
    asyncio.run(c.interrupt())
    second = {a["key"]: agent_io(a)[0] for a in c.agents}
    for seen in (first, second):
        assert set(seen) == {"0.0", "0.1", "0.2"}
        assert len({control["interrupt"] for control in seen.values()}) == 1  # one per call
        assert all(control["interrupt"] for control in seen.values())
    assert first["0.0"]["interrupt"] != second["0.0"]["interrupt"]
    assert {k: control["ranks"] for k, control in second.items()} == ranks(c)  # ranks kept
    assert [key for key, _ in b.nudged()] == ["0.0", "0.1", "0.2"] * 2
    assert registered_ranks(c) == [0, 1, 2, 3, 4]


def test_stop_releases_every_agent_and_leaves_nothing(make):
    c, b = started(make, 3, backend=FakeBackend(slots=2, grows_in_place=False))
    asyncio.run(c.scale(6))
    controller, cdir = c.controller_pid, str(c.dir)
    assert alive(controller)
    client = c._client
    asyncio.run(c.stop())
    assert b.released() == [["0.0", "0.1", "1.0", "1.1"]]
    stops = b.calls[-1][2]
    assert all(control["stop"] for control in stops.values()) and len(stops) == 4
    assert c.status == "stopped" and client.closed
    assert state.load_state(c.name) is None and not state.state_path(c.name).exists()
    assert not alive(controller)
    left = [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if any(cdir in part for part in p.info["cmdline"] or ())
    ]
    assert left == []
    asyncio.run(c.stop())  # twice is harmless
    assert len(b.released()) == 1


# -- more lost agents, and handles that another process scaled ---------------------------------
def test_no_reachable_node_at_all_says_so(make):
    why = "ssh: connect to host n0 port 22: No route to host"
    backend = FakeBackend(slots=2, may_skip_nodes=True, unreachable={"n0": why})
    c = make(2, backend=backend)
    with pytest.raises(LoungeError) as info:
        asyncio.run(c.start())
    assert str(info.value) == f"No lounge node could be reached; the last: n0 ({why})."
    assert c.status == "stopped" and state.load_state(c.name) is None


def test_an_agent_lost_after_start_stops_the_wait_naming_its_node(make):
    c, b = started(make, 4, backend=FakeBackend(slots=2))
    b.set_state("0.1", "lost", "node agent process 4242 is gone")
    with pytest.raises(LoungeError) as info:
        asyncio.run(c.wait_for_engines(5, 10))
    assert str(info.value) == "The node agent on n1 is gone: node agent process 4242 is gone."
    assert c.status == "running"  # the cluster itself is not stopped by a failed wait


def test_scale_up_in_place_gives_no_engine_to_a_lost_agent(make):
    c, b = started(make, 4, backend=FakeBackend(slots=2))
    b.set_state("0.1", "lost", "node agent process 4242 is gone")
    asyncio.run(c.scale(6))
    assert {4, 5} <= set(registered_ranks(c))  # the new engines run somewhere


def test_scale_up_with_every_agent_lost_says_so(make):
    c, b = started(make, 4, backend=FakeBackend(slots=2))
    b.set_state("0.0", "lost", "gone")
    b.set_state("0.1", "lost", "gone")
    with pytest.raises(LoungeError, match=f"Every node agent of {c.name!r} is lost"):
        asyncio.run(c.scale(6))


def test_a_cluster_stopped_elsewhere_is_not_scaled(make):
    c, _ = started(make, 2, backend=FakeBackend(slots=2))
    asyncio.run(attached(c).stop())
    with pytest.raises(LoungeError, match=f"Cluster {c.name!r} is stopped, not running"):
        asyncio.run(c.scale(3))


def attached(c: Cluster) -> Cluster:
    """Another handle on ``c``, as another process (the sidebar, another kernel) holds."""
    other = Cluster.attach(c.name)
    return other


def test_a_handle_on_the_same_cluster_scales_it_after_a_reload(make):
    c, b = started(make, 4, backend=FakeBackend(slots=2, grows_in_place=False))
    asyncio.run(attached(c).scale(6))
    c.reload()
    asyncio.run(c.scale(7))
    assert sorted(r for a in c.agents for r in a["ranks"]) == list(range(7))
    assert [k for k, *_ in sum(b.placed(), [])] == ["0.0", "0.1", "1.0", "2.0"]
    asyncio.run(c.stop())
    assert b.live == {}  # every agent placed was released


def test_a_stale_handle_scales_what_the_state_file_says(make):
    c, b = started(make, 4, backend=FakeBackend(slots=2, grows_in_place=False))
    asyncio.run(attached(c).scale(6))
    asyncio.run(c.scale(7))  # no reload: what `%lounge scale 7` does in the first kernel
    assert sorted(r for a in c.agents for r in a["ranks"]) == list(range(7))
    asyncio.run(c.stop())
    assert b.live == {}


def test_a_stale_handles_interrupt_keeps_every_engine(make):
    c, b = started(make, 4, backend=FakeBackend(slots=2))
    asyncio.run(attached(c).scale(6))
    asyncio.run(c.interrupt())  # no reload: what `%lounge interrupt` does in the first kernel
    assert registered_ranks(c) == list(range(6))
