"""The ssh backend's own cases on the testbed's sshd nodes (the contract suite runs it too)."""

from __future__ import annotations

import pytest

from jupyter_lounge import Lounge, state
from jupyter_lounge.errors import LoungeError

from .conftest import inventory_for_testbed, processes_under, slurm_testbed_problem


@pytest.fixture
def lounge_toml(tmp_path):
    problem = slurm_testbed_problem()
    if problem:
        pytest.skip(problem)
    options = inventory_for_testbed(tmp_path / "lounge.toml")
    # a fourth PC whose sshd does not answer (port 2 refuses at once)
    with open(options["inventory"], "a") as f:
        f.write(
            '[[node]]\nname = "pc-off"\nhost = "10.77.0.13"\nport = 2\nuser = "root"\n'
            'engines = 4\npools = ["gpu"]\n'
        )
    return options


def test_engines_on_every_node_of_the_pool(lounge_toml, lounge_dir):
    cluster = Lounge(3, nodes=3, wait=True, progress=False, **lounge_toml).start_sync()
    try:
        df = cluster.map(lambda _: __import__("socket").gethostname(), range(12), progress=False)
        assert set(df.result) == {"node1", "node2", "node3"}
    finally:
        cluster.stop_sync()
    assert processes_under(str(lounge_dir)) == []


def test_an_unreachable_node_is_skipped_with_a_warning(lounge_toml, lounge_dir):
    cluster = Lounge(16, wait=True, progress=False, **lounge_toml)
    with pytest.warns(
        UserWarning, match="Lounge node 'pc-off' skipped: the SSH session to 10.77.0.13 ended"
    ):
        cluster.start_sync()
    try:
        assert cluster.n == 12 and len(cluster.registered()) == 12
        assert {r["node"] for r in cluster.nodes_status()} == {"node1", "node2", "node3"}
    finally:
        cluster.stop_sync()
    with pytest.raises(LoungeError, match="agent pc-off of .* never started: the SSH session"):
        Lounge(16, wait=True, progress=False, strict=True, **lounge_toml).start_sync()
    assert state.list_states() == [] and processes_under(str(lounge_dir)) == []


def test_more_engines_than_the_pool_has_slots(lounge_toml):
    with pytest.raises(LoungeError, match="17 engines do not fit on 4 lounge node"):
        Lounge(17, progress=False, **lounge_toml).start_sync()
    with pytest.raises(LoungeError, match="Unknown pool 'vision'"):
        Lounge(2, progress=False, pool="vision", **lounge_toml)
