"""Windows lounge PCs, simulated on the testbed's sshd nodes: their engines in "WSL2", their
presence seen from "Windows".

No Windows machine exists here. A node plays a Windows PC through stand-ins at the paths WSL
interop gives (tests/infra/windows/: ``wsl.exe`` runs its program with no shell; ``quser.exe``,
``tasklist.exe`` and ``nvidia-smi.exe`` print output recorded from Microsoft's and NVIDIA's
documentation and real samples, see tests/data/windows/SOURCES.md), driven by the files this
test writes in the node's own /var/local/winsim: a person logs on at the console, a game
starts, the GPU gets busy, the person leaves. What a real PC would add (Windows OpenSSH's
cmd.exe in front of wsl.exe, WSL's own VM and NAT) is not exercised here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from jupyter_lounge import Lounge, state
from jupyter_lounge.backends import make_backend
from jupyter_lounge.errors import LoungeError

from .conftest import processes_under, slurm_testbed_problem, wait_until
from .test_ssh import nothing_left_on_the_nodes

WINDOWS = Path(__file__).parent / "infra" / "windows"
TESTBED = Path(os.environ.get("LOUNGE_TESTBED", "/tmp/lounge-testbed"))
DISTRO = "Ubuntu-22.04"
#: what cmd.exe (% ^ & | < > ( ) ") or PowerShell ($ ` ' ; , { } @ # ~) would interpret
SHELL_CHARS = set("%^&|<>()\"'$`;,{}@#~!*?[]\\\n\r\t")


def winsim(node: int) -> Path:
    return TESTBED / "local" / f"node{node}" / "winsim"


def pc(node: int, **files: str) -> None:
    """Set what "Windows" shows on testbed node ``node``: console_user, games, gpu_util, ..."""
    folder = winsim(node)
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        path = folder / name
        if text is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(text)


def write_inventory(tmp_path: Path, idle_after: int = 4) -> dict:
    """node1 and node2 Windows PCs, node3 a Linux PC, all in pool "gpu"."""
    key = os.environ.get("LOUNGE_TESTBED_KEY", "/testbed/is/down/key")  # not read unless up
    known = os.environ.get("LOUNGE_TESTBED_KNOWN_HOSTS", "/testbed/is/down/known_hosts")
    text = f"[idle]\nfor_seconds = 1\nidle_after_seconds = {idle_after}\n\n"
    for i in (1, 2, 3):
        text += (
            f'[[node]]\nname = "node{i}"\nhost = "10.77.0.1{i}"\nuser = "root"\nkey = "{key}"\n'
            f'python = "{sys.executable}"\nknown_hosts = "{known}"\nengines = 4\n'
            'pools = ["gpu"]\nlocal_dir = "/var/local/lounge"\n'
        )
        if i < 3:
            text += f'os = "windows"\nwsl_distro = "{DISTRO}"\n'
        text += "\n"
    inventory = tmp_path / "lounge.toml"
    inventory.write_text(text)
    return {"backend": "ssh", "inventory": str(inventory), "known_hosts": known}


def on_path(node: int, mount: bool) -> None:
    """Put the wsl.exe stand-in on node ``node``'s PATH, as System32 is on a Windows PC's: a
    bind mount over /usr/local/sbin in that node's own mount namespace (no other sees it)."""
    init = (TESTBED / f"node{node}.pid").read_text().strip()
    argv = ["mount", "--bind", str(WINDOWS), "/usr/local/sbin"] if mount else [
        "umount", "/usr/local/sbin"]  # fmt: skip
    subprocess.run(["nsenter", f"--mount=/proc/{init}/ns/mnt", *argv], check=mount)


@pytest.fixture
def windows_lounge(tmp_path):
    problem = slurm_testbed_problem()
    if problem:
        pytest.skip(problem)
    for i in (1, 2):
        pc(i, distros=DISTRO + "\n", console_user=None, games=None, gpu_util="0\n", gpu_apps=None)
        pc(i, samples=str(Path(__file__).parent / "data" / "windows"))  # the recorded outputs
        on_path(i, True)
    try:
        yield write_inventory(tmp_path)
    finally:
        for i in (1, 2):
            on_path(i, False)
            pc(i, console_user=None, games=None, gpu_util="0\n", gpu_apps=None)


def test_a_windows_pcs_commands_hold_nothing_a_windows_shell_would_interpret(tmp_path):
    from jupyter_lounge import sync

    options = write_inventory(tmp_path)
    backend = make_backend("ssh", inventory=options["inventory"])
    node = backend.nodes["node1"]
    commands = [
        sync.wsl_command(node, node.python, "-m", "jupyter_lounge.node", "--stdio"),
        sync.node_program(node, "check", node.local_dir, "f" * 16)[0],
        sync.launch_command(node, "f" * 16)[0],
    ]
    for command in commands:
        assert command.startswith(f"wsl.exe -d {DISTRO} --exec ")
        assert not SHELL_CHARS & set(command), command
    first = sync.launch_command(node, "f" * 16)[1].decode()
    assert first.startswith("/") and first.endswith("\n") and first.count("\n") > 1  # bash's
    with pytest.raises(LoungeError, match="cannot be a word of its command line"):
        sync.wsl_command(node, "python3", "-c", "print(1)")


@pytest.mark.parametrize(
    "entry, sentence",
    [
        ('os = "windows"', 'os = "windows" needs wsl_distro'),
        ('os = "windows"\nwsl_distro = "Ubuntu"\nlocal_dir = "~/x"', "an absolute path inside"),
        ('os = "windows"\nwsl_distro = "Ub untu"', "'wsl_distro' 'Ub untu' cannot be a word"),
        ('os = "macos"', "'os' must be one of linux, windows, not 'macos'"),
        ('wsl_distro = "Ubuntu"', 'is for os = "windows" nodes only'),
    ],
)
def test_windows_inventory_mistakes_are_one_sentence(tmp_path, entry, sentence):
    from jupyter_lounge import inventory

    path = tmp_path / "lounge.toml"
    path.write_text(f'[[node]]\nname = "pc1"\nhost = "10.0.0.1"\n{entry}\n')
    with pytest.raises(LoungeError, match=re.escape(sentence)):
        inventory.load(path)


def test_engines_only_on_idle_pcs_eviction_mid_map_and_return(windows_lounge, lounge_dir):
    """ana at node1's console: no engine there. A game starts on node2 mid-map: its engines
    go within 10 s and no item is lost. Both PCs quiet again: engines come back."""
    pc(1, console_user="ana\n")
    cluster = Lounge(12, wait=False, timeout=60, preload="pandas", **windows_lounge).start_sync()
    try:
        rows = wait_until(
            lambda: (
                (r := {x["node"]: x for x in cluster.nodes_status()})
                and r["node1"]["status"] == "in use"
                and r["node2"]["ready"] == 4
                and r["node3"]["ready"] == 4
                and r
            ),
            90,
            "node1 in use, node2 and node3 running",
        )
        assert rows["node1"]["why"] == "ana logged in" and rows["node1"]["ready"] == 0

        def slow(x):
            import socket
            import time

            time.sleep(0.3)
            return x, socket.gethostname()

        started = {}

        def game():
            wait_until(lambda: cluster.runs() and cluster.runs()[0]["done"] >= 8, 60, "rows")
            started["at"] = time.monotonic()
            pc(2, games="cs2.exe\n")

        threading.Thread(target=game, daemon=True).start()
        df = cluster.map(slow, range(60), progress=False, timeout=180)
        assert df.error.isna().all(), df.error.dropna().tolist()
        assert [r[0] for r in df.result] == list(range(60))  # none lost, none twice
        assert "node1" not in set(df.node)
        row = wait_until(
            lambda: next(
                (x for x in cluster.nodes_status() if x["node"] == "node2" and x["ready"] == 0),
                None,
            ),
            10,
            "node2's engines to go",
        )
        assert row["status"] == "in use" and row["why"] == "cs2.exe running"
        assert time.monotonic() - started["at"] < 30
        # the PC gets its memory back: the agent rests lean (a fifth of a running one with pandas)
        node2 = lambda: next(x for x in cluster.nodes_status() if x["node"] == "node2")  # noqa: E731
        running = next(x for x in rows.values() if x["node"] == "node3")["agent_mib"]
        wait_until(lambda: node2()["agent_mib"] < running / 2, 15, "node2's agent to rest lean")
        pc(1, console_user=None)
        pc(2, games=None)
        wait_until(lambda: len(cluster.registered()) == 12, 60, "all 12 engines back")
    finally:
        cluster.stop_sync()
    assert state.list_states() == [] and processes_under(str(lounge_dir)) == []
    nothing_left_on_the_nodes()


def test_lounge_nodes_live_sees_windows_presence(windows_lounge):
    from jupyter_lounge.faces import node_rows

    pc(1, console_user="ana\n")
    pc(2, gpu_util="87\n", gpu_apps="C:\\Games\\cs2\\cs2.exe\n")
    _, rows = node_rows(windows_lounge["inventory"], None, live=True)
    by = {r["name"]: r for r in rows}
    assert (by["node1"]["state"], by["node1"]["why"]) == ("in use", "ana logged in")
    assert by["node2"]["state"] == "in use" and "87% GPU" in by["node2"]["why"]
    assert by["node3"]["state"] == "idle"
    pc(2, gpu_apps="C:\\Windows\\System32\\vmmemWSL\n")  # only WSL's VM: our own engines
    _, rows = node_rows(windows_lounge["inventory"], None, live=True)
    assert {r["name"]: r["state"] for r in rows}["node2"] == "idle"


def test_an_unknown_distro_is_skipped_with_windows_own_words(windows_lounge, lounge_dir):
    pc(2, distros="Debian\n")  # wsl.exe answers in UTF-16, on stdout, as the real one does
    with pytest.warns(UserWarning, match="Lounge node 'node2' skipped: .*There is no distrib"):
        cluster = Lounge(8, wait=True, timeout=60, **windows_lounge).start_sync()
    try:
        assert {r["node"] for r in cluster.nodes_status()} == {"node1", "node3"}
    finally:
        cluster.stop_sync()
    assert processes_under(str(lounge_dir)) == []


def test_doctor_asks_a_windows_pc_and_a_linux_pc_the_same_questions(windows_lounge):
    from jupyter_lounge._loop import run_sync
    from jupyter_lounge.doctor import diagnose

    options = {k: v for k, v in windows_lounge.items() if k != "backend"}
    backend = make_backend("ssh", **options)
    pc(1, console_user="ana\n")
    rows = run_sync(diagnose(backend, tensorflow=True))
    by = {(r["node"], r["check"]): r for r in rows}
    checks = ["ssh", "os", "python", "environment", "disk", "gpus", "controller", "presence"]
    checks.append("tensorflow")  # in an engine forked as the agent forks them
    assert [r["check"] for r in rows if r["node"] == "node1"] == checks
    assert by["node1", "os"]["detail"].startswith(f"WSL2 distro {DISTRO} on Windows")
    assert by["node1", "os"]["status"] == by["node3", "os"]["status"] == "ok"
    assert by["node1", "presence"]["detail"] == "in use (ana logged in)"
    assert by["node2", "presence"] == {**by["node2", "presence"], "status": "ok", "detail": "idle"}
    assert all(by[f"node{i}", "controller"]["status"] == "ok" for i in (1, 2, 3))
    assert by["node3", "gpus"]["status"] == "skipped"  # gpus = 0 in the inventory
    for i in (1, 3):
        assert by[f"node{i}", "tensorflow"]["status"] == "ok"
        assert by[f"node{i}", "tensorflow"]["detail"].endswith(
            "in a forked engine sees 0 GPU(s) and ran an op on /CPU:0"
        )
    pc(2, distros="Debian\n")  # the distro the inventory names is not on that PC
    rows = run_sync(diagnose(backend, tensorflow=False))
    ssh = next(r for r in rows if r["node"] == "node2")
    assert ssh["check"] == "ssh" and ssh["status"] == "problem"
    assert "There is no distribution with the supplied name" in ssh["detail"]


@pytest.mark.slow
def test_sync_into_a_windows_pcs_distro_then_its_agent_runs_the_synced_python(
    windows_lounge, lounge_dir
):
    """`lounge sync` through wsl.exe: WSL's bash reads the line that starts the node program
    from stdin, and the program and the shipment after it reach Python whole."""
    import shutil

    from jupyter_lounge._loop import run_sync

    for folder in ("envs", "store"):  # nothing of it there: all of it travels
        shutil.rmtree(TESTBED / "local" / "node1" / "lounge" / folder, ignore_errors=True)
    options = {k: v for k, v in windows_lounge.items() if k != "backend"}
    backend = make_backend("ssh", **options)
    rows = {r["node"]: r for r in run_sync(backend.sync_env(["node1"]))}
    assert rows["node1"]["status"] == "shipped" and rows["node1"]["MiB"] > 100, rows
    again = run_sync(backend.sync_env(["node1"]))
    assert again[0]["status"] == "present"
    env = rows["node1"]["env"]
    cluster = Lounge(2, nodes=1, sync=True, wait=True, timeout=90, **windows_lounge)
    cluster.start_sync()  # nodes=1: node1, the first of the pool
    try:
        df = cluster.map(lambda _: __import__("sys").executable, range(4), progress=False)
        assert set(df.result) == {env + "/bin/python"}
    finally:
        cluster.stop_sync()
    nothing_left_on_the_nodes()
