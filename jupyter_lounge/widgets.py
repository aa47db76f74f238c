"""Launch progress: ready/target engines per node, updated until all are in (or it stops).

In a notebook it is an ipywidgets panel; elsewhere, one line printed per change.
"""

from __future__ import annotations

import time


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        return False
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


class LaunchProgress:
    """Follows a cluster's launch (a watcher: ``cluster.watch(LaunchProgress(cluster))``): on
    each ``"placed"`` (or ``"waiting"``) event it looks at ``nodes_status`` every ``interval``
    seconds, on the lounge's own event loop, until every engine is in, the cluster stops, or
    ``timeout``."""

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
        self._following = None
        if use_widget is None:
            use_widget = _in_notebook()
        if use_widget:
            self._make_widget()

    def __call__(self, cluster, event: str) -> None:
        if event == "stopped":
            self.done = True
        elif event in ("placed", "waiting") and (self._following is None or self._following.done()):
            import asyncio

            from ._loop import _background_loop

            self.done = False
            self._following = asyncio.run_coroutine_threadsafe(self._follow(), _background_loop())

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
        from .faces import node_state

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
                label.value = f"{r['ready']}/{r['target']} {node_state(r)}"
        return (
            title
            + " ("
            + ", ".join(f"{r['node']} {r['ready']}/{r['target']} {node_state(r)}" for r in rows)
            + ")"
        )

    async def _follow(self) -> None:
        import asyncio

        deadline = time.monotonic() + self.timeout
        while not self.done and time.monotonic() < deadline:
            if self.cluster.status not in ("starting", "running"):
                break
            try:
                rows = await asyncio.to_thread(self.cluster.nodes_status)
            except Exception:  # noqa: BLE001 - the controller may still be starting
                rows = []
            if self.done:  # stopped while we looked: nothing more to show
                break
            if rows:
                text = self.render(rows)
                if self.widget is None and text != self._last:
                    print(text, flush=True)
                self._last = text
                if all(r["ready"] >= r["target"] for r in rows):
                    break
            await asyncio.sleep(self.interval)
        self.done = True
