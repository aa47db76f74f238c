"""Launch progress: ready/target engines per node, updated until all are in (or it stops).

In a notebook it is an ipywidgets panel; elsewhere, one line printed per change.
"""

from __future__ import annotations

import threading
import time


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        return False
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


class LaunchProgress:
    """Watches a cluster from a background thread for at most ``timeout`` seconds."""

    def __init__(
        self,
        cluster,
        use_widget: bool | None = None,
        timeout: float | None = None,
        interval: float = 0.25,
    ):
        self.cluster = cluster
        self.timeout = timeout or cluster.timeout
        self.interval = interval
        self.done = False
        self.widget = None
        self._last = ""
        if use_widget is None:
            use_widget = _in_notebook()
        if use_widget:
            self._make_widget()
        self._thread = threading.Thread(target=self._run, name="lounge-progress", daemon=True)
        self._thread.start()

    def _make_widget(self) -> None:
        import ipywidgets as w
        from IPython.display import display

        self._title = w.HTML()
        self._bars: dict[str, tuple] = {}
        self._box = w.VBox([self._title])
        self.widget = self._box
        display(self._box)

    def _row(self, node: str):
        import ipywidgets as w

        if node not in self._bars:
            bar = w.IntProgress(
                min=0, max=1, description=node, style={"description_width": "initial"}
            )
            label = w.Label()
            self._bars[node] = (bar, label)
            self._box.children = (*self._box.children, w.HBox([bar, label]))
        return self._bars[node]

    def render(self, rows: list[dict]) -> str:
        ready = sum(r["ready"] for r in rows)
        target = sum(r["target"] for r in rows)
        title = f"{self.cluster.name}: {ready}/{target} engines ready"
        if self.widget is not None:
            self._title.value = f"<b>{title}</b>"
            for r in rows:
                bar, label = self._row(r["node"])
                bar.max = max(r["target"], 1)
                bar.value = min(r["ready"], bar.max)
                bar.bar_style = (
                    "danger"
                    if r["status"] in ("failed", "lost")
                    else ("success" if r["ready"] >= r["target"] else "info")
                )
                label.value = f"{r['ready']}/{r['target']} {r['status']}"
        text = (
            title
            + " ("
            + ", ".join(f"{r['node']} {r['ready']}/{r['target']} {r['status']}" for r in rows)
            + ")"
        )
        return text

    def _run(self) -> None:
        deadline = time.monotonic() + self.timeout
        try:
            while time.monotonic() < deadline and self.cluster.status in ("starting", "running"):
                try:
                    rows = self.cluster.nodes_status()
                except Exception:  # noqa: BLE001 - the controller may still be starting
                    rows = []
                if rows:
                    text = self.render(rows)
                    if self.widget is None and text != self._last:
                        print(text, flush=True)
                    self._last = text
                    if all(r["ready"] >= r["target"] for r in rows):
                        break
                time.sleep(self.interval)
        finally:
            self.done = True
