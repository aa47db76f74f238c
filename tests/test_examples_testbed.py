"""examples/04-slurm.ipynb and examples/05-lounge.ipynb, each executed in a real kernel on the
testbed (tests/infra/up): the Keras sweep on the Slurm backend and on the SSH lounge backend."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from jupyter_lounge import state

from .conftest import execute_notebook, node_processes, slurm_testbed_problem, wait_until

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
NODES = {"node1", "node2", "node3"}
MARK = "SWEEP-RESULTS "
# appended after the notebook's last cell: the sweep as the kernel holds it, as JSON
PROBE = f"""import json
rows = json.loads(results.to_json(orient="records"))
print({MARK!r} + json.dumps({{"grid": grid, "rows": rows}}))
"""


@pytest.fixture(autouse=True)
def testbed():
    problem = slurm_testbed_problem()
    if problem:
        pytest.skip(problem)


def text(cell) -> str:
    return "".join(
        o.get("text", "") + str(o.get("data", {}).get("text/plain", "")) for o in cell.outputs
    )


def execute(name: str) -> tuple[list, dict, list]:
    """Run the notebook (cwd examples/, this process's environment) plus the probe cell; a
    failing cell fails the test. Returns its code cells, the sweep, and the clusters the
    notebook left behind (stopped here, so a failure does not hold the shared testbed)."""
    code, left = execute_notebook(EXAMPLES / name, [PROBE])
    line = next(ln for ln in text(code[-1]).splitlines() if ln.startswith(MARK))
    return code[:-1], json.loads(line[len(MARK) :]), left


def check_sweep(sweep: dict) -> set[str]:
    """The DataFrame has one row per grid point, in order, each trained without error;
    returns the hosts the models were trained on."""
    grid, rows = sweep["grid"], sweep["rows"]
    assert len(grid) == 9 and len(rows) == len(grid)
    assert [(r["lr"], r["units"]) for r in rows] == [(g["lr"], g["units"]) for g in grid]
    assert [r["error"] for r in rows] == [None] * len(grid)
    assert all(0.0 <= r["val_accuracy"] <= 1.0 for r in rows)
    assert max(r["val_accuracy"] for r in rows) > 0.9  # a small MLP learns this data
    return {r["host"] for r in rows}


def cell(code: list, start: str):
    return next(c for c in code if c.source.startswith(start))


@pytest.mark.timeout(1200)
def test_slurm_notebook_runs_the_sweep_on_the_three_nodes(lounge_dir):
    code, sweep, left = execute("04-slurm.ipynb")
    assert left == []
    assert check_sweep(sweep) == NODES

    script = text(cell(code, "from jupyter_lounge import Lounge"))
    for directive in ("--nodes=3", "--ntasks-per-node=1", "--partition=debug", "--time=0:20:00"):
        assert f"#SBATCH {directive}\n" in script
    assert "exec srun " in script and "jupyter_lounge.node" in script
    queued = text(cell(code, "lounge = %lounge start"))
    assert " sweep RUNNING 3 " in queued  # one job of 3 nodes
    status = text(cell(code, "%lounge status"))
    assert "sweep: ipyparallel on slurm" in status and "6/6 engines ready" in status
    assert all(node in status for node in NODES)
    best = text(cell(code, "assert results.error"))
    assert "Best: lr=" in best and all(node in best for node in NODES)

    out = subprocess.run(["squeue", "-h"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.strip() == ""
    assert state.list_states() == []


@pytest.mark.timeout(1200)
def test_lounge_notebook_runs_the_sweep_on_the_ssh_pcs(lounge_dir):
    code, sweep, left = execute("05-lounge.ipynb")
    assert left == []
    hosts = check_sweep(sweep)
    assert hosts and hosts <= NODES, hosts

    inventory = text(code[0])
    assert 'local_dir = "/var/local/lounge"' in inventory and "[idle]" in inventory
    listed = text(cell(code, "%lounge nodes --inventory"))
    assert all(f"node{i}  10.77.0.1{i}  root" in listed for i in (1, 2, 3)), listed
    live = text(cell(code, "%lounge nodes --live"))
    assert all(node in live for node in NODES) and "offline" not in live, live
    status = text(cell(code, "%lounge status"))
    assert "on ssh" in status and "6/6 engines ready" in status
    assert all(node in status for node in NODES)

    wait_until(
        lambda: not any(node_processes(i) for i in (1, 2, 3)),
        30,
        "every agent and engine on the nodes to exit",
    )
    assert state.list_states() == []
