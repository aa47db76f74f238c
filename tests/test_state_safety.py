"""State that cannot be spoofed or lost, and no orphans: pid reuse, corrupt state files, two
starts of one name, a kernel killed with SIGKILL, a full disk during stop, and the limits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from traitlets.config import Config

from jupyter_lounge import Lounge, state
from jupyter_lounge.errors import LoungeError
from jupyter_lounge.manager import ClusterManager
from jupyter_lounge.procs import alive

from .conftest import processes_under, slurm_testbed_problem, wait_until


def lounge(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "jupyter_lounge.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=os.environ,
    )


def test_a_reused_pid_is_never_signalled(lounge_dir):
    """After a reboot a stored pid may belong to anyone: `lounge stop` must not signal it."""
    cluster = Lounge(1, name="old", wait=True).start_sync()
    data = state.load_state("old")
    cluster.stop_sync()
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        # the state as a dead cluster left it, its pids now taken by a stranger's process
        data["controller_pid"] = stranger.pid
        data["keeper"] = [stranger.pid, data["keeper"][1]]
        for agent in data["agents"]:
            agent["pid"] = stranger.pid
        state.cluster_dir("old")
        state.save_state("old", data)
        rows = {r["name"]: r for r in ClusterManager().list()}
        assert rows["old"]["status"] == "dead"
        out = lounge("stop", "old")
        assert out.returncode == 0, out.stderr
        time.sleep(0.5)
        assert alive(stranger.pid) and stranger.poll() is None
        assert state.load_state("old") is None
        # a start of that name is not blocked by the stranger either
        Lounge(1, name="old").start_sync().stop_sync()
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_a_corrupt_state_file_is_listed_and_forgotten_with_what_it_left(lounge_dir):
    cluster = Lounge(2, name="mangled", wait=True).start_sync()
    left = processes_under(str(cluster.dir))
    assert left  # its controller, agent, engines, keeper
    path = state.state_path("mangled")
    path.write_text('{"name": "mangled", "status": "runn')  # a crash mid-write by hand
    listing = lounge("list")
    assert listing.returncode == 0, listing.stderr
    line = next(x for x in listing.stdout.splitlines() if x.startswith("mangled"))
    assert "corrupt" in line and str(path) in line and "lounge stop mangled --forget" in line
    with pytest.raises(LoungeError, match=f"state file of cluster 'mangled' \\({path}\\)"):
        Lounge(1, name="mangled").start_sync()
    plain = lounge("stop", "mangled")
    assert plain.returncode == 2 and "--forget" in plain.stderr
    forgot = lounge("stop", "mangled", "--forget")
    assert forgot.returncode == 0, forgot.stderr
    assert "Forgot mangled." in forgot.stdout and "Stopped what was left of it" in forgot.stdout
    wait_until(lambda: not processes_under(str(lounge_dir)), 15, "its processes to stop")
    assert not path.exists() and not (lounge_dir / "mangled").exists()
    unreadable = state.state_path("locked")
    unreadable.write_text("{}")  # not a state file at all
    assert {r["name"]: r["status"] for r in ClusterManager().list()} == {"locked": "corrupt"}
    assert lounge("stop", "locked", "--forget").returncode == 0
    assert ClusterManager().list() == []


def test_two_starts_of_one_name_one_wins(lounge_dir):
    """Two shells start `twin` at the same moment: one cluster, one 'already in use'."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "jupyter_lounge.cli", "start", "1", "--name", "twin"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=os.environ,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=180) for p in procs]
    codes = sorted(p.returncode for p in procs)
    logs = {  # what the cluster's processes said, should the winner's start fail
        str(f.relative_to(lounge_dir)): f.read_text(errors="replace")[-2000:]
        for f in sorted((lounge_dir / "twin").rglob("*.log"))
    }
    try:
        assert codes == [0, 2], (outs, logs)
        loser = next(err for p, (_, err) in zip(procs, outs) if p.returncode == 2)
        assert "A cluster named 'twin' is already in use" in loser, outs
        assert [d["name"] for d in state.list_states()] == ["twin"], outs
        controllers = processes_under(str(lounge_dir / "twin" / "profile"))
        assert controllers, outs  # the winner's
    finally:
        assert lounge("stop", "twin").returncode == 0


def test_a_cluster_started_in_a_shell_runs_until_stopped(lounge_dir):
    """`lounge start` is detached on purpose: the command ends, the cluster runs on."""
    out = lounge("start", "2", "--name", "detached")
    assert out.returncode == 0, out.stderr
    time.sleep(3)  # a keeper would have stopped it by now
    data = state.load_state("detached")
    assert data["keeper"] is None and data["status"] == "running"
    assert Lounge.attach("detached").map(lambda x: x, [1], progress=False).result[0] == 1
    assert lounge("stop", "detached").returncode == 0


KERNEL_CODE = """
%load_ext jupyter_lounge
%lounge start 2 --wait --name {name} {flags}
import os; print("KERNEL", os.getpid(), flush=True)
"""


def start_in_a_kernel(name: str, flags: str = "") -> tuple[object, int]:
    """A real IPython kernel that starts a cluster, as a notebook would; (manager, pid)."""
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", env=dict(os.environ))
    reply = kc.execute_interactive(KERNEL_CODE.format(name=name, flags=flags), timeout=240)
    assert reply["content"]["status"] == "ok", reply["content"]
    kc.stop_channels()
    return km, km.provisioner.process.pid


@pytest.mark.parametrize("where", ["local", "slurm"])
def test_a_killed_kernel_leaves_no_cluster_behind(where, lounge_dir):
    """SIGKILL runs no exit handler: the keeper stops the cluster, Slurm job included, within
    30 s of the kernel's death."""
    flags = ""
    if where == "slurm":
        problem = slurm_testbed_problem()
        if problem:
            pytest.skip(problem)
        flags = "--backend slurm --engines-per-node 1"
    km, pid = start_in_a_kernel("orphan", flags)
    data = state.load_state("orphan")
    assert data["status"] == "running" and data["keeper"]
    job = next((a["job"] for a in data["agents"] if a.get("job")), None)
    assert (job is not None) == (where == "slurm")
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    try:
        wait_until(lambda: state.load_state("orphan") is None, 30, "the keeper to stop it")
        wait_until(lambda: not processes_under(str(lounge_dir)), 30 - (time.monotonic() - t0),
                   "every process of the cluster to exit")  # fmt: skip
        if job:
            squeue = subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True)
            assert job not in squeue.stdout
    finally:
        km.cleanup_resources()


def test_a_full_disk_does_not_keep_stop_from_stopping(tmp_path, monkeypatch):
    disk = tmp_path / "small-disk"
    disk.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(disk)],
                   check=True)  # fmt: skip
    try:
        monkeypatch.setenv("JUPYTER_LOUNGE_DIR", str(disk / "lounge"))
        cluster = Lounge(2, engines="dask", name="full", wait=True).start_sync()
        subprocess.run(["dd", "if=/dev/zero", f"of={disk}/filler", "bs=1M"], capture_output=True)
        with pytest.raises(OSError):  # the disk is full indeed
            state.save_state("probe", {"name": "probe", "created": 0})
        cluster.stop_sync()
        assert not processes_under(str(disk))
        assert state.list_states() == []
    finally:
        for proc in processes_under(str(disk)):
            proc.kill()
        subprocess.run(["umount", "-l", str(disk)], check=False)


# -- limits ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "line, sentence",
    [
        ("start 5000", "The number of engines is 5000, above the limit of 4096"),
        ("start 4 --nodes 5", "5 nodes for 4 engines would leave nodes empty"),
        ("start 2 --timeout inf", "--timeout must be a finite number, not 'inf'"),
        ("start 2 --timeout nan", "--timeout must be a finite number, not 'nan'"),
        ("start 2 --backend ssh --no-tls", "--no-tls is allowed only with --backend local"),
    ],
)
def test_limits_in_the_magic_and_the_cli(line, sentence, tmp_path, monkeypatch):
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell

    inv = tmp_path / "lounge.toml"
    inv.write_text('[[node]]\nname = "pc1"\nhost = "10.77.0.11"\n')
    monkeypatch.setenv("JUPYTER_LOUNGE_INVENTORY", str(inv))
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "jupyter_lounge")
    with pytest.raises(UsageError, match=sentence.replace("(", "\\(")):
        shell.run_line_magic("lounge", line)
    out = lounge(*line.split())
    assert out.returncode == 2 and sentence in out.stderr
    assert state.list_states() == []


def test_the_engine_limit_is_configurable(monkeypatch):
    from jupyter_lounge import config

    monkeypatch.setattr(config, "_server_config", Config({"Lounge": {"max_engines": 3}}))
    with pytest.raises(LoungeError, match="above the limit of 3"):
        Lounge(4)
    assert Lounge(3).n == 3
