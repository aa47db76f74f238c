"""The Lounge sidebar in a real JupyterLab, driven in Debian's Chromium by Playwright.

A real ``jupyter lab`` server (this venv, a token, a temporary root) and a headless Chromium:
open Lab with a notebook, open the Lounge sidebar, start a 4-engine local cluster from the
dialog, see it become ready, scale it to 6, insert the connect code into the notebook and run
it, see a cluster started by ``%lounge`` in that notebook's kernel appear, stop both from the
sidebar and see them disappear. And a cluster's runs: their progress, Cancel on a long one,
and the code that loads a run's DataFrame inserted and run. Screenshots go to ``artifacts/``
(git ignores it).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from .conftest import processes_under, wait_until

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason=f"no Chromium at {CHROMIUM} (apt-get install chromium)"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def lab(tmp_path, lounge_dir):
    """A real JupyterLab server on loopback; yields (base url, token, root dir)."""
    root = tmp_path / "root"
    root.mkdir()
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": None,
                "id": "first",
                "metadata": {},
                "outputs": [],
                "source": "x = 1",
            }
        ],
        "metadata": {
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    (root / "sweep.ipynb").write_text(json.dumps(nb))
    token, port = secrets.token_hex(16), _free_port()
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(tmp_path / "config"))
    env["JUPYTERLAB_SETTINGS_DIR"] = str(tmp_path / "settings")
    news = tmp_path / "settings" / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True)  # no "get notified about Jupyter news?" toast over the page
    (news / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    env["JUPYTERLAB_WORKSPACES_DIR"] = str(tmp_path / "workspaces")
    log = open(tmp_path / "lab.log", "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ServerApp.allow_root=True",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}",
            "--ServerApp.port_retries=0",
            f"--ServerApp.root_dir={root}",
            f"--IdentityProvider.token={token}",
            "--LabApp.news_url=",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(
                f"jupyter lab exited: {(tmp_path / 'lab.log').read_text()[-2000:]}"
            )
        try:
            with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    try:
        wait_until(up, 90, "the JupyterLab server to answer /api/status")
        yield url, token, root
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
        log.close()


def _api(url: str, token: str, path: str) -> dict:
    with urllib.request.urlopen(f"{url}/jupyter-lounge/{path}?token={token}", timeout=30) as r:
        return json.loads(r.read())


@contextlib.contextmanager
def _lab_page(failure_shot: str = ""):
    """A page of headless Chromium (1400 x 900, 60 s for each step unless told); when the
    test fails in it, a screenshot ARTIFACTS/``failure_shot`` first; the browser closed after."""
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.set_default_timeout(60_000)
        try:
            yield page
        except BaseException:
            if failure_shot:
                page.screenshot(path=str(ARTIFACTS / failure_shot))
            raise
        finally:
            browser.close()


def _stop_if_left(url: str, token: str, name: str) -> None:
    """Stop a cluster a failed test left running (token auth needs no XSRF)."""
    request = urllib.request.Request(
        f"{url}/jupyter-lounge/clusters/{name}",
        method="DELETE",
        headers={"Authorization": f"token {token}"},
    )
    try:
        urllib.request.urlopen(request, timeout=120).close()
    except urllib.error.HTTPError as e:
        if e.code != 404:
            raise


@pytest.mark.slow
def test_sidebar_starts_scales_connects_and_stops_clusters(lab, lounge_dir):
    from playwright.sync_api import expect

    url, token, _ = lab
    with _lab_page("sidebar-failure.png") as page:
        sidebar = _open_sidebar(page, url, token)  # its kernel idle before we run cells in it
        expect(sidebar.locator('[data-testid="lounge-node-row"]').first).to_be_visible()

        # start a 4-engine local cluster from the dialog
        sidebar.locator('[data-testid="lounge-start"]').click()
        page.locator('[data-testid="lounge-start-n"]').fill("4")
        page.locator('[data-testid="lounge-start-backend"]').select_option("local")
        page.locator('[data-testid="lounge-start-engines"]').select_option("ipyparallel")
        page.locator('[data-testid="lounge-start-name"]').fill("from-sidebar")
        page.locator(".jp-Dialog-button.jp-mod-accept").click()
        row = sidebar.locator('[data-testid="lounge-cluster-row"][data-cluster="from-sidebar"]')
        expect(row.locator('[data-testid="lounge-cluster-ready"]')).to_have_text(
            "4/4", timeout=120_000
        )
        sidebar.screenshot(path=str(ARTIFACTS / "sidebar-ready.png"))

        # scale to 6
        row.locator('[data-testid="lounge-scale"]').click()
        page.locator('[data-testid="lounge-scale-n"]').fill("6")
        page.locator(".jp-Dialog-button.jp-mod-accept").click()
        expect(row.locator('[data-testid="lounge-cluster-ready"]')).to_have_text(
            "6/6", timeout=120_000
        )

        # insert the connect code below the active cell and run it, then use the client
        _insert_and_run(
            page, row.locator('[data-testid="lounge-insert"]'), 'Lounge.attach("from-sidebar")',
            "print('engines', len(client.ids))", "engines 6",
        )  # fmt: skip

        # work running on every engine; Interrupt stops it and the cluster stays
        busy = page.locator(".jp-Notebook .jp-Cell").nth(3)
        busy.locator(".cm-content").click()
        page.keyboard.type("r = client[:].apply_async(__import__('time').sleep, 300)")
        page.keyboard.press("Shift+Enter")
        expect(busy.locator(".jp-InputArea-prompt")).to_contain_text("[3]")
        row.locator('[data-testid="lounge-interrupt"]').click()
        expect(page.get_by_text("Interrupted 6 engines of 'from-sidebar'")).to_be_visible()
        check = page.locator(".jp-Notebook .jp-Cell").nth(4)
        check.locator(".cm-content").click()
        page.keyboard.type(
            "r.wait(30); print('interrupted', [type(x).__name__ + ('KeyboardInterrupt' in "
            "str(x)) * ':KI' for x in r.get(return_exceptions=True)])"
        )
        page.keyboard.press("Shift+Enter")
        expect(check.locator(".jp-OutputArea-output")).to_contain_text(
            "interrupted " + str(["RemoteError:KI"] * 6), timeout=60_000
        )
        expect(row.locator('[data-testid="lounge-cluster-ready"]')).to_have_text("6/6")

        # a cluster started by %lounge in the kernel shows up in the sidebar
        last = page.locator(".jp-Notebook .jp-Cell").nth(5)
        last.locator(".cm-content").click()
        page.keyboard.type("%load_ext jupyter_lounge\n%lounge start 2 --name from-kernel")
        page.keyboard.press("Shift+Enter")
        kernel_row = sidebar.locator(
            '[data-testid="lounge-cluster-row"][data-cluster="from-kernel"]'
        )
        expect(kernel_row).to_be_visible(timeout=120_000)
        expect(kernel_row.locator('[data-testid="lounge-cluster-ready"]')).to_have_text(
            "2/2", timeout=120_000
        )
        page.screenshot(path=str(ARTIFACTS / "lab-with-sidebar.png"))
        sidebar.screenshot(path=str(ARTIFACTS / "sidebar-two-clusters.png"))

        # stop both from the sidebar; they disappear
        for r in (row, kernel_row):
            r.locator('[data-testid="lounge-stop"]').click()
            page.locator(".jp-Dialog-button.jp-mod-accept").click()
            expect(r).to_have_count(0, timeout=120_000)
        expect(sidebar.locator('[data-testid="lounge-error"]')).to_have_text("")
    assert _api(url, token, "clusters")["clusters"] == []
    deadline = time.monotonic() + 15
    while processes_under(str(lounge_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_under(str(lounge_dir)) == []


def _open_sidebar(page, url: str, token: str, notebook: bool = True):
    """Lab with the notebook open and its kernel idle (``notebook``; else Lab alone); the
    Lounge sidebar shown."""
    from playwright.sync_api import expect

    if notebook:
        page.goto(f"{url}/lab/tree/sweep.ipynb?token={token}")
        page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=120_000)
        expect(page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")).to_be_visible(
            timeout=120_000
        )
    else:
        page.goto(f"{url}/lab?token={token}")
    tab = page.locator('.jp-SideBar .lm-TabBar-tab[data-id="jupyter-lounge-sidebar"]')
    tab.click(timeout=120_000)
    sidebar = page.locator("#jupyter-lounge-sidebar")
    expect(sidebar).to_be_visible()
    return sidebar


def _insert_and_run(page, button, inserted: str, code: str, output: str) -> None:
    """With the notebook's one cell active, ``button`` inserts a cell holding ``inserted``
    below it; that cell runs, then ``code`` in the cell after it, whose output has ``output``."""
    from playwright.sync_api import expect

    page.locator(".jp-Notebook .jp-Cell").first.click()
    button.click()
    cells = page.locator(".jp-Notebook .jp-Cell")
    expect(cells).to_have_count(2)
    expect(cells.nth(1)).to_contain_text(inserted)
    cells.nth(1).locator(".cm-content").click()
    page.keyboard.press("Shift+Enter")  # runs it and adds a cell below
    new = page.locator(".jp-Notebook .jp-Cell").nth(2)
    new.locator(".cm-content").click()
    page.keyboard.type(code)
    page.keyboard.press("Shift+Enter")
    expect(new.locator(".jp-OutputArea-output")).to_contain_text(output, timeout=120_000)


@pytest.mark.slow
def test_sidebar_shows_runs_cancels_one_and_inserts_its_load_code(lab):
    """A kernel's runs under its cluster: a done one with its progress, a long one cancelled
    from the sidebar, and the done one's DataFrame loaded by the code the sidebar inserts."""
    from playwright.sync_api import expect

    from jupyter_lounge import Lounge, LoungeError

    def slow(v):
        import time

        time.sleep(0.5)
        return v

    def follow_long() -> None:
        try:
            lounge.map(slow, range(1000), name="long", progress=False)
        except LoungeError as e:  # cancelled: the kernel following it is told
            ended.append(str(e))

    url, token, _ = lab
    lounge = Lounge(2, name="sweeps", wait=True).start_sync()
    ended: list[str] = []
    follower = threading.Thread(target=follow_long)
    try:
        lounge.map(lambda v: v * 2, range(10), name="r1", progress=False)
        with _lab_page("sidebar-runs-failure.png") as page:
            sidebar = _open_sidebar(page, url, token)
            row = sidebar.locator('[data-testid="lounge-cluster-row"][data-cluster="sweeps"]')
            r1 = row.locator('[data-testid="lounge-run"][data-run="r1"]')
            expect(r1.locator('[data-testid="lounge-run-progress"]')).to_have_text("10/10")
            expect(r1.locator('[data-testid="lounge-run-status"]')).to_have_text("done")
            expect(r1.locator('[data-testid="lounge-run-cancel"]')).to_have_count(0)

            # a long run shows as running; Cancel (confirmed) ends it, its rows kept
            follower.start()
            long = row.locator('[data-testid="lounge-run"][data-run="long"]')
            expect(long.locator('[data-testid="lounge-run-status"]')).to_have_text(
                "running", timeout=120_000
            )
            expect(long.locator('[data-testid="lounge-run-progress"]')).not_to_have_text(
                "0/1000", timeout=120_000
            )
            sidebar.screenshot(path=str(ARTIFACTS / "sidebar-runs.png"))
            long.locator('[data-testid="lounge-run-cancel"]').click()
            page.locator(".jp-Dialog-button.jp-mod-accept").click()
            expect(page.get_by_text("Cancelled run 'long' of 'sweeps'")).to_be_visible()
            expect(long.locator('[data-testid="lounge-run-status"]')).to_have_text(
                "cancelled", timeout=60_000
            )
            expect(long.locator('[data-testid="lounge-run-cancel"]')).to_have_count(0)
            follower.join(timeout=60)
            assert ended and "Run 'long' cancelled" in ended[0], ended

            # Insert code puts the line that loads r1's table below the active cell
            _insert_and_run(
                page, r1.locator('[data-testid="lounge-run-insert"]'),
                "run('r1', cluster='sweeps').result()",
                "print(type(df).__name__, len(df), df['result'].sum())", "DataFrame 10 90",
            )  # fmt: skip
            sidebar.screenshot(path=str(ARTIFACTS / "sidebar-runs-cancelled.png"))
            expect(sidebar.locator('[data-testid="lounge-error"]')).to_have_text("")
    finally:
        lounge.stop_sync()
        if follower.is_alive():
            follower.join(timeout=60)


def test_a_server_error_is_shown_in_the_sidebar(lab):
    """A start the server refuses (a name already in use) shows its sentence in the sidebar."""
    from playwright.sync_api import expect

    from jupyter_lounge import Lounge

    url, token, _ = lab
    taken = Lounge(1, name="taken", wait=True).start_sync()
    try:
        with _lab_page() as page:
            sidebar = _open_sidebar(page, url, token, notebook=False)
            expect(sidebar.locator('[data-cluster="taken"]')).to_be_visible()
            sidebar.locator('[data-testid="lounge-start"]').click()
            page.locator('[data-testid="lounge-start-n"]').fill("2")
            page.locator('[data-testid="lounge-start-name"]').fill("taken")
            page.locator(".jp-Dialog-button.jp-mod-accept").click()
            expect(sidebar.locator('[data-testid="lounge-error"]')).to_contain_text(
                "already in use"
            )
    finally:
        taken.stop_sync()


@pytest.fixture
def ipython_profile(tmp_path, monkeypatch):
    """An IPython profile (``$IPYTHONDIR``) whose config sets two start defaults; asked for
    before ``lab``, the server started there reads it. Yields the config file."""
    profile = tmp_path / "ipython" / "profile_default"
    profile.mkdir(parents=True)
    config = profile / "ipython_config.py"
    config.write_text('c.Lounge.preload = ["json"]\nc.Lounge.engines = "dask"\n')
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    yield config


@pytest.mark.slow
def test_start_dialog_opens_on_the_configured_defaults(ipython_profile, lab, lounge_dir):
    """The profile's c.Lounge.preload and c.Lounge.engines fill the Start dialog, which says
    which file and line set them; started as it opened, the cluster has them. A mistake in
    the profile: the dialog says it, on the built-in defaults."""
    from playwright.sync_api import expect

    url, token, _ = lab
    defaults = _api(url, token, "backends").get("defaults")
    assert defaults, "GET backends sends no 'defaults' (the server side of issue 18)"
    assert defaults["preload"]["value"] == ["json"], defaults
    assert defaults["engines"]["value"] == "dask", defaults
    assert str(ipython_profile) in defaults["preload"]["source"], defaults
    try:
        with _lab_page("start-dialog-defaults-failure.png") as page:
            sidebar = _open_sidebar(page, url, token, notebook=False)
            expect(sidebar.locator('[data-testid="lounge-node-row"]').first).to_be_visible()

            sidebar.locator('[data-testid="lounge-start"]').click()
            dialog = page.locator(".jp-Dialog")
            expect(dialog.locator('[data-testid="lounge-start-engines"]')).to_have_value("dask")
            expect(dialog.locator('[data-testid="lounge-start-preload"]')).to_have_value("json")
            expect(dialog.locator('[data-testid="lounge-start-backend"]')).to_have_value("local")
            expect(dialog.locator('[data-testid="lounge-start-pool"]')).to_have_value("")
            expect(dialog.locator('[data-testid="lounge-start-n"]')).to_have_value("4")
            where = dialog.locator('[data-testid="lounge-start-defaults"]')
            expect(where).to_contain_text("preload from ipython_config.py line 1")
            expect(where).to_contain_text("engines from ipython_config.py line 2")
            expect(where).not_to_contain_text("built-in")
            expect(where).to_have_attribute("title", re.compile(re.escape(str(ipython_profile))))
            dialog.screenshot(path=str(ARTIFACTS / "start-dialog-defaults.png"))

            # started as it opened (two engines, a name): the cluster has the defaults
            dialog.locator('[data-testid="lounge-start-n"]').fill("2")
            dialog.locator('[data-testid="lounge-start-name"]').fill("with-defaults")
            page.locator(".jp-Dialog-button.jp-mod-accept").click()
            row = sidebar.locator(
                '[data-testid="lounge-cluster-row"][data-cluster="with-defaults"]'
            )
            expect(row.locator('[data-testid="lounge-cluster-ready"]')).to_have_text(
                "2/2", timeout=120_000
            )
            expect(row).to_contain_text("dask · local · json")
            started = _api(url, token, "clusters/with-defaults")
            assert (started["engines"], started["backend"], started["preload"]) == (
                "dask",
                "local",
                "json",
            ), started

            row.locator('[data-testid="lounge-stop"]').click()
            page.locator(".jp-Dialog-button.jp-mod-accept").click()
            expect(row).to_have_count(0, timeout=120_000)
            expect(sidebar.locator('[data-testid="lounge-error"]')).to_have_text("")

            # a mistake in the profile: the dialog opens on the built-in defaults, saying why
            ipython_profile.write_text(ipython_profile.read_text() + "c.Lounge.nodes = -1\n")
            sidebar.locator('[data-testid="lounge-start"]').click()
            expect(dialog.locator('[data-testid="lounge-start-defaults-error"]')).to_have_text(
                f"{ipython_profile} line 3: c.Lounge.nodes must be a whole number above 0, not -1."
            )
            expect(dialog.locator('[data-testid="lounge-start-engines"]')).to_have_value(
                "ipyparallel"
            )
            expect(dialog.locator('[data-testid="lounge-start-preload"]')).to_have_value("")
            expect(dialog.locator('[data-testid="lounge-start-defaults"]')).to_have_count(0)
            page.locator(".jp-Dialog-button.jp-mod-reject").click()
            expect(dialog).to_have_count(0)
    finally:
        _stop_if_left(url, token, "with-defaults")
    assert _api(url, token, "clusters")["clusters"] == []
