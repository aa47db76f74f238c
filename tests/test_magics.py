"""The magics in a real IPython shell, and the quickstart notebook in a real kernel."""

from __future__ import annotations

from pathlib import Path

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from jupyter_lounge import state

from .conftest import processes_under

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def ip():
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "jupyter_lounge")
    yield shell
    for data in state.list_states():  # a failing test must not leak its cluster
        from jupyter_lounge.manager import ClusterManager

        ClusterManager().stop(data["name"])


@pytest.mark.parametrize("kind", ["ipyparallel", "dask"])
def test_magics_start_cell_scale_status_stop(ip, capsys, kind):
    lounge = ip.run_line_magic("lounge", f"start 2 --engines {kind} --name mag --wait")
    assert lounge.name == "mag" and len(lounge.registered()) == 2
    import jupyter_lounge

    assert jupyter_lounge.current() is lounge

    capsys.readouterr()
    ip.run_cell_magic("lounge", "", "import os\nprint('rank', os.environ['LOUNGE_RANK'])")
    out = capsys.readouterr().out
    assert "rank 0" in out and "rank 1" in out

    ip.run_line_magic("lounge", "scale 3")
    lounge.wait_for_engines_sync(3, timeout=60)
    ip.run_line_magic("lounge", "status")
    out = capsys.readouterr().out
    assert "mag:" in out and "3/3 engines ready" in out

    ip.run_line_magic("lounge", "list")
    assert "mag" in capsys.readouterr().out
    ip.run_line_magic("lounge", "interrupt mag")
    out = capsys.readouterr().out
    assert "Interrupted 3 engines of 'mag': " in out, out
    ip.run_line_magic("lounge", "stop")
    assert state.list_states() == []


@pytest.mark.parametrize("kind", ["ipyparallel", "dask"])
def test_a_cell_right_after_start_runs_on_every_engine(ip, capsys, kind):
    """`%lounge start 4` returns once the first engine is in; the cell that follows at once
    waits for the other three instead of running on one."""
    ip.run_line_magic("lounge", f"start 4 --engines {kind} --name quick")
    capsys.readouterr()
    ip.run_cell_magic("lounge", "", "import os\nprint('rank', os.environ['LOUNGE_RANK'])")
    out = capsys.readouterr().out
    assert all(f"rank {r}" in out for r in range(4)), out
    assert "ran on" not in out  # it reached all of them
    ip.run_line_magic("lounge", "stop")


def test_a_cell_says_which_engines_it_could_not_reach():
    from jupyter_lounge.faces import ran

    row = {"node": "node2", "status": "lost", "why": None, "ready": 0, "target": 2}
    assert ran({"ran": 8, "target": 8, "missing": []}) is None
    assert ran({"ran": 6, "target": 8, "missing": [row]}) == "ran on 6 of 8 engines; node2 lost\n"


@pytest.mark.parametrize(
    "line, expected",
    [
        ("start 0", "whole number above 0"),
        ("start two", "whole number above 0, not 'two'"),
        ("start 2 --engines spark", "Unknown engine kind 'spark'"),
        ("start 2 --backend cloud", "Unknown backend 'cloud'"),
        ("start 2 --turbo", "Unknown option --turbo"),
        ("stop ghost", "No cluster named 'ghost' to stop"),
        ("attach ghost", "No cluster named 'ghost'"),
        ("dance", "Unknown command 'dance'"),
    ],
)
def test_bad_input_in_the_shell_is_one_line(ip, line, expected):
    with pytest.raises(UsageError, match=expected):
        ip.run_line_magic("lounge", line)
    result = ip.run_cell(f"%lounge {line}")
    assert isinstance(result.error_in_exec, UsageError)


def test_quickstart_notebook_runs_in_a_real_kernel(lounge_dir):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(ROOT / "examples" / "01-quickstart.ipynb", as_version=4)
    NotebookClient(
        nb,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(ROOT / "examples")}},
    ).execute()

    def text(cell) -> str:
        return "".join(
            o.get("text", "") + str(o.get("data", {}).get("text/plain", "")) for o in cell.outputs
        )

    code = [c for c in nb.cells if c.cell_type == "code"]
    outputs = "".join(text(c) for c in code)
    everywhere = text(next(c for c in code if c.source.startswith("%%lounge")))
    # %%lounge ran on every engine (chunks of different engines may interleave)
    assert all(f"[stdout:{rank}]" in everywhere for rank in range(2))
    assert everywhere.count("True") == 2 and "False" not in everywhere
    assert "accuracy" in outputs and "140" in outputs  # the sweep table, the Dask sum
    assert "3/3 engines ready" in outputs
    assert state.list_states() == []
    assert processes_under(str(lounge_dir)) == []
