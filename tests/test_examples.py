"""The example notebooks 02 (a Keras sweep) and 03 (bootstrap intervals) run top to bottom in
a real kernel on their small grids (``LOUNGE_EXAMPLES_SMALL=1``), show what they promise, and
leave no cluster and no process behind."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from .conftest import execute_notebook, processes_under

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


class _Table(HTMLParser):
    """The rows of an HTML table (a DataFrame as Jupyter shows it), each a list of cell texts."""

    def __init__(self, html: str):
        super().__init__()
        self.rows: list[list[str]] = []
        self._row: list[str] | None = None
        self._cell: str | None = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self._row = []
        elif tag in ("th", "td") and self._row is not None:
            self._cell = ""

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data

    def handle_endtag(self, tag):
        if tag in ("th", "td") and self._row is not None and self._cell is not None:
            self._row.append(self._cell.strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.rows.append(self._row)
            self._row = None


def run_example(name: str, monkeypatch, lounge_dir) -> list:
    """Execute examples/NAME in a python3 kernel (cwd examples/); a failing cell raises.
    Returns its code cells with their outputs."""
    monkeypatch.setenv("LOUNGE_EXAMPLES_SMALL", "1")  # JUPYTER_LOUNGE_DIR: the lounge_dir fixture
    code, left = execute_notebook(EXAMPLES / name)
    assert left == [], f"{name} left clusters running: {left}"
    assert processes_under(str(lounge_dir)) == []
    return code


def printed(cells) -> str:
    return "".join(o.get("text", "") for c in cells for o in c.outputs if o.output_type == "stream")


def shown_table(cells, column: str) -> list[dict[str, str]]:
    """The rows of the DataFrame shown as a cell's result whose columns include ``column``."""
    for cell in cells:
        for out in cell.outputs:
            html = out.get("data", {}).get("text/html", "")
            if out.output_type == "execute_result" and "<table" in html:
                header, *body = _Table(html).rows
                if column in header:
                    return [dict(zip(header[1:], row[1:])) for row in body]  # [0]: the index
    raise AssertionError(f"no table with a {column!r} column was shown")


def images(cells) -> int:
    return sum("image/png" in o.get("data", {}) for c in cells for o in c.outputs)


# The timeouts below guard against a hang, they do not time the notebooks: nbclient allows
# each cell 600 s.
@pytest.mark.timeout(1800)
def test_cancer_model_sweep_notebook(lounge_dir, monkeypatch):
    cells = run_example("02-cancer-model-sweep.ipynb", monkeypatch, lounge_dir)
    out = printed(cells)

    trained = re.search(r"(\d+) of (\d+) models trained, (\d+) failed", out)
    assert trained, out
    done, total, failed = map(int, trained.groups())
    assert done == total == 4 and failed == 0  # the small grid: 2 rates x 2 widths x 1 dropout

    rows = shown_table(cells, "val_accuracy")
    assert len(rows) == total
    accuracy = [float(r["val_accuracy"]) for r in rows]
    assert all(0 <= a <= 1 for a in accuracy) and accuracy == sorted(accuracy, reverse=True)
    assert all(float(r["val_loss"]) > 0 and 1 <= int(r["epochs"]) <= 8 for r in rows)
    assert {(float(r["lr"]), int(r["units"])) for r in rows} == {
        (lr, units) for lr in (0.001, 0.01) for units in (8, 32)
    }
    assert {r["engine"] for r in rows} <= {"0", "1"}  # the 2 engines, none lost

    held_out = re.search(r"held-out accuracy: ([0-9.]+)", out)
    assert held_out, out
    assert 0.5 < float(held_out.group(1)) <= 1
    assert images(cells) == 2  # accuracy against the parameters, time per engine


@pytest.mark.timeout(1800)
def test_analysis_map_notebook(lounge_dir, monkeypatch):
    cells = run_example("03-analysis-map.ipynb", monkeypatch, lounge_dir)
    out = printed(cells)

    mapped = re.search(r"(\d+) of (\d+) grid points done, (\d+) failed", out)
    assert mapped, out
    done, total, failed = map(int, mapped.groups())
    assert done == total == 4 and failed == 0  # the small grid: 2 features x 2 sample sizes

    rows = shown_table(cells, "ci_low")
    assert len(rows) == total
    assert {(r["feature"], int(r["n"])) for r in rows} == {
        (f, n) for f in ("mean radius", "mean texture") for n in (60, 240)
    }
    width = {}
    for r in rows:
        low, estimate, high = float(r["ci_low"]), float(r["auc"]), float(r["ci_high"])
        assert 0.5 < low <= estimate <= high <= 1  # both features beat chance, interval ordered
        width[r["feature"], int(r["n"])] = high - low
    for feature in ("mean radius", "mean texture"):  # fewer patients, a wider interval
        assert width[feature, 60] > width[feature, 240]

    # the same seeded items on Dask workers give the same table
    assert "Dask workers reproduce every estimate and interval: True" in out
    assert images(cells) == 1  # the estimates with their intervals
