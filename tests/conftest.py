"""Fixtures shared by every test: a private lounge dir per test, and a process-table scan
after each test that fails it if any engine, controller or node agent of it survived."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest


def pytest_collection_modifyitems(items) -> None:
    """Tests marked fast first (seconds), then the rest, and the slow ones (marked) last: a
    failure shows in minutes. Stable: within each group, the order pytest collected."""

    def group(item) -> int:
        return 0 if item.get_closest_marker("fast") else 2 if item.get_closest_marker("slow") else 1

    items.sort(key=group)


def processes_under(path: str) -> list[psutil.Process]:
    """Live processes whose command line mentions ``path`` (agents and their forked engines
    carry the spec path; controllers carry their profile dir or scheduler file)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(path in part for part in proc.info["cmdline"] or ()):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def slurm_testbed_problem() -> str | None:
    """Why the Slurm testbed cannot be used now, or None when it can."""
    import shutil
    import subprocess

    if not os.environ.get("SLURM_CONF") or not shutil.which("sinfo"):
        return "the Slurm testbed is not up: `make test` brings it up (tests/infra/reup)"
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=30
    ).stdout.splitlines()
    if len([n for n in out if "idle" in n or "mix" in n]) < 3:
        return f"the Slurm testbed has fewer than 3 idle nodes: {out}"
    return None


def node_processes(index: int, pattern: str = "jupyter_lounge") -> list[str]:
    """Command lines of the live processes on testbed node ``index`` (its own pid namespace)
    that mention ``pattern``: agents and the engines they fork."""
    testbed = os.environ.get("LOUNGE_TESTBED", "/tmp/lounge-testbed")
    try:
        init = int(open(f"{testbed}/node{index}.pid").read())
        ns = os.readlink(f"/proc/{init}/ns/pid")
    except (OSError, ValueError):
        return []  # the node is down: nothing runs on it
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if os.readlink(f"/proc/{proc.pid}/ns/pid") != ns:
                continue
            line = " ".join(proc.info["cmdline"] or ())
            if pattern in line:
                found.append(f"{proc.pid} {line}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, OSError):
            continue
    return found


def execute_notebook(path, extra_cells=()) -> tuple[list, list[str]]:
    """Run a notebook in a real python3 kernel (cwd: its folder), with ``extra_cells`` (code)
    appended; a failing cell raises. Any cluster it left is stopped here, so a failure does not
    leak into later tests. Returns its code cells with outputs, and the names it left."""
    import nbformat
    from nbclient import NotebookClient

    from jupyter_lounge import state
    from jupyter_lounge.manager import ClusterManager

    nb = nbformat.read(path, as_version=4)
    nb.cells += [nbformat.v4.new_code_cell(code) for code in extra_cells]
    try:
        NotebookClient(
            nb,
            timeout=600,
            kernel_name="python3",
            resources={"metadata": {"path": str(Path(path).parent)}},
        ).execute()
    finally:
        left = [data["name"] for data in state.list_states()]
        for name in left:
            ClusterManager().stop(name)
    return [cell for cell in nb.cells if cell.cell_type == "code"], left


def kernel_output() -> tuple[list[str], object]:
    """A list of what a kernel printed (its streams and error tracebacks), and the
    ``output_hook`` of ``execute_interactive`` that fills it."""
    out: list[str] = []

    def keep(msg):
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append("\n".join(msg["content"]["traceback"]))

    return out, keep


def inventory_for_testbed(path) -> dict:
    """Backend options for the ssh backend on the testbed's three nodes (their sshd)."""
    import sys

    text = "".join(
        f'[[node]]\nname = "node{i}"\nhost = "10.77.0.1{i}"\nuser = "root"\n'
        f'key = "{os.environ["LOUNGE_TESTBED_KEY"]}"\npython = "{sys.executable}"\n'
        f'known_hosts = "{os.environ["LOUNGE_TESTBED_KNOWN_HOSTS"]}"\n'
        f'engines = 4\npools = ["gpu"]\nlocal_dir = "/var/local/lounge"\n\n'
        for i in (1, 2, 3)
    )
    path.write_text(text)
    return {
        "backend": "ssh",
        "inventory": str(path),
        "known_hosts": os.environ["LOUNGE_TESTBED_KNOWN_HOSTS"],
    }


@pytest.fixture(params=["local", "slurm", "ssh"])
def backend(request, tmp_path_factory):
    """The contract tests run on every backend; Slurm and ssh only where the testbed is up."""
    if request.param == "ssh":
        problem = slurm_testbed_problem()  # the same testbed runs both
        if problem:
            pytest.skip(problem)
        yield inventory_for_testbed(tmp_path_factory.mktemp("inv") / "lounge.toml")
    elif request.param == "slurm":
        problem = slurm_testbed_problem()
        if problem:
            pytest.skip(problem)
        yield {"backend": "slurm", "engines_per_node": 2}
        import subprocess

        def no_jobs():
            out = subprocess.run(["squeue", "-h"], capture_output=True, text=True, timeout=30)
            return not out.stdout.strip()

        wait_until(no_jobs, 30, "no Slurm job of the test left in squeue")
    else:
        yield {"backend": "local"}


@pytest.fixture(autouse=True)
def no_server_config_left():
    """A Jupyter server made in this process (pytest-jupyter's jp_serverapp) hands its config
    to jupyter_lounge for the process (config.use_server_config), as a real server does: it
    must not outlive the test that made it, or a value a test gave it (c.SSHBackend.pool)
    becomes every later start's default."""
    from jupyter_lounge import config

    yield
    config._server_config, config._server_files = None, []


@pytest.fixture(autouse=True)
def lounge_dir(tmp_path, monkeypatch):
    path = tmp_path / "lounge"
    monkeypatch.setenv("JUPYTER_LOUNGE_DIR", str(path))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    yield path
    deadline = time.monotonic() + 3
    left = processes_under(str(path))
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = processes_under(str(path))
    for proc in left:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    if left:
        desc = [f"{p.pid} {' '.join(p.info['cmdline'] or [])[:120]}" for p in left]
        pytest.fail(f"processes of this test survived it: {desc}")


@pytest.fixture
def pids_of():
    """Engine pids of a cluster, read from its agents' reports."""
    from jupyter_lounge import state

    def engine_pids(cluster) -> list[int]:
        pids = []
        for agent in cluster.agents:
            report = state.read_json(agent["files"]["report"]) or {}
            pids += [
                e["pid"] for e in report.get("engines", {}).values() if e.get("state") == "running"
            ]
        return pids

    return engine_pids


def map_or_show_driver_log(cluster, lounge_dir: Path, fn, items, timeout: float):
    """``cluster.map``; should it time out, the failure carries the run's driver.log (what
    the driver went through: a power-cut map stalled once with nothing else to go on)."""
    from jupyter_lounge.errors import LoungeTimeout

    try:
        return cluster.map(fn, items, progress=False, timeout=timeout)
    except LoungeTimeout as e:
        logs = "".join(p.read_text() for p in lounge_dir.glob("**/runs/driver.log"))
        raise AssertionError(f"{e}\ndriver.log:\n{logs}") from e


def wait_until(predicate, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
