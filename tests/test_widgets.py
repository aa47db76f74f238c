"""The launch progress display: ready/target per node, updated until every node is full."""

from __future__ import annotations

import time

from jupyter_lounge.widgets import LaunchProgress


class GrowingCluster:
    """Stands in for a cluster whose engines register one per poll (pure display logic)."""

    name, timeout, status = "demo", 10.0, "running"

    def __init__(self):
        self.ready = 0

    def nodes_status(self):
        self.ready = min(self.ready + 1, 5)
        return [
            {"node": "a", "status": "running", "ready": min(self.ready, 3), "target": 3},
            {"node": "b", "status": "running", "ready": max(self.ready - 3, 0), "target": 2},
        ]


def follow(cluster, **options) -> LaunchProgress:
    """A progress panel watching ``cluster``, told its agents were just placed."""
    progress = LaunchProgress(cluster, **options)
    progress(cluster, "placed")
    return progress


def wait_done(progress, timeout=10):
    deadline = time.monotonic() + timeout
    while not progress.done and time.monotonic() < deadline:
        time.sleep(0.01)
    assert progress.done


def test_text_progress_prints_each_change_until_full(capsys):
    progress = follow(GrowingCluster(), use_widget=False, interval=0.01)
    wait_done(progress)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "demo: 1/5 engines ready (a 1/3 running, b 0/2 running)"
    assert lines[-1] == "demo: 5/5 engines ready (a 3/3 running, b 2/2 running)"
    assert len(lines) == 5


def test_widget_progress_has_a_bar_per_node():
    progress = follow(GrowingCluster(), use_widget=True, interval=0.01)
    wait_done(progress)
    bars = {
        bar.description: (bar.value, bar.max, bar.bar_style) for bar, _ in progress._bars.values()
    }
    assert bars == {"a": (3, 3, "success"), "b": (2, 2, "success")}
    assert progress._title.value == "<b>demo: 5/5 engines ready</b>"


def test_progress_stops_when_the_cluster_stops():
    cluster = GrowingCluster()
    cluster.status = "stopped"
    progress = follow(cluster, use_widget=False, interval=0.01)
    wait_done(progress, timeout=2)
    assert cluster.ready == 0  # never polled
