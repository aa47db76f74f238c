"""The node side of `lounge sync` (envstore.py), run for real on this machine: the same bootstrap
command and program, the same framed stream, only bash in ssh's place. Small folders stand in
for the environment, so these take seconds (tests/test_ssh.py ships the real one to nodes)."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_lounge import envstore, sync
from jupyter_lounge.errors import LoungeError

FP = "0123456789abcdef"


class Here:
    """A 'backend' whose nodes are this machine: bash -c runs the command ssh would."""

    def __init__(self, local_dir: Path):
        node = type("Node", (), {"name": "here", "local_dir": str(local_dir)})()
        self.nodes = {"here": node}

    def ssh_command(self, name: str) -> list[str]:
        return ["bash", "-c"]


@pytest.fixture
def here(tmp_path, monkeypatch):
    monkeypatch.setattr(sync, "base_python", lambda: sys.executable)
    return Here(tmp_path / "local")


def folder(tmp_path: Path, text: str = "hello") -> Path:
    root = tmp_path / f"src-{text}"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").write_text("#!/bin/sh\n")
    (root / "bin" / "python").chmod(0o775)  # group-writable at the source: not on the node
    (root / "lib" / "pkg").mkdir(parents=True)
    (root / "lib" / "pkg" / "data.txt").write_text(text * 1000)
    (root / "lib" / "link").symlink_to("pkg")
    return root


def sender(root: Path, damage: bool = False, stop_after: int | None = None):
    """What _ship writes: ``root`` as the tar stream, hashed as it goes."""

    def write(out, tree: envstore.TreeHash) -> int:
        with sync.TarSender(out, tree) as tar:
            for i, path in enumerate(sorted(root.rglob("*"))):
                if stop_after is not None and i == stop_after:
                    raise LoungeError("every node's SSH session ended (simulated)")
                tar.add(path, str(path.relative_to(root)))
        if damage:
            tree.data(b"one byte the node never got")
        return tree.bytes

    return write


def ship(here, root, fp=FP, keep=2, **how) -> tuple[str, int]:
    return sync._ship(
        here.ssh_command, list(here.nodes.values()), fp, write=sender(root, **how), keep=keep
    )["here"]


def leftovers(local: Path) -> list[str]:
    envs = local / "envs"
    return sorted(p.name for p in envs.iterdir() if p.name.startswith(".") and p.name != ".lock")


def test_an_environment_arrives_whole_and_only_then_is_in_place(here, tmp_path):
    root = folder(tmp_path)
    status, mib = ship(here, root)
    assert status == "shipped"
    env = tmp_path / "local" / "envs" / FP
    assert (env / "lib" / "pkg" / "data.txt").read_text() == "hello" * 1000
    assert os.readlink(env / "lib" / "link") == "pkg"
    assert (env / "bin" / "python").stat().st_mode & 0o777 == 0o755  # no group write
    marker = json.loads((env / envstore.MARKER).read_text())
    assert marker["fingerprint"] == FP and len(marker["tree"]) == 64
    assert leftovers(tmp_path / "local") == []
    assert (tmp_path / "local").stat().st_mode & 0o077 == 0  # made private
    assert envstore.check(str(tmp_path / "local"), FP) == {"state": "present"}


def test_a_damaged_stream_is_refused_and_leaves_nothing(here, tmp_path):
    status, _ = ship(here, folder(tmp_path), damage=True)
    assert status.startswith("failed: jupyter_lounge on ") and "arrived damaged" in status
    assert not (tmp_path / "local" / "envs" / FP).exists()
    assert leftovers(tmp_path / "local") == []


def test_an_interrupted_sync_leaves_nothing_half_there(here, tmp_path):
    root = folder(tmp_path)
    status, _ = ship(here, root, stop_after=3)
    assert status.startswith("failed:") and "ended early" in status, status
    assert not (tmp_path / "local" / "envs" / FP).exists()
    assert leftovers(tmp_path / "local") == []
    assert ship(here, root)[0] == "shipped"  # the next one just works


def test_an_environment_an_agent_runs_is_never_removed(here, tmp_path):
    envs = tmp_path / "local" / "envs"
    for i, fp in enumerate(("a" * 16, "b" * 16)):
        assert ship(here, folder(tmp_path, f"v{i}"), fp=fp)[0] == "shipped"
        os.utime(envs / fp / envstore.MARKER, (1000 + i, 1000 + i))  # a older than b
    held = os.open(envs / ("a" * 16) / envstore.MARKER, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_SH)  # as launch() does for a running agent
    try:
        assert ship(here, folder(tmp_path, "v2"), fp="c" * 16, keep=1)[0] == "shipped"
        assert sorted(p.name for p in envs.iterdir() if not p.name.startswith(".")) == [
            "a" * 16,  # older, but in use
            "c" * 16,  # the new one
        ]
    finally:
        os.close(held)
    assert ship(here, folder(tmp_path, "v3"), fp="d" * 16, keep=1)[0] == "shipped"
    assert sorted(p.name for p in envs.iterdir() if not p.name.startswith(".")) == ["d" * 16]


def test_a_store_someone_else_owns_is_refused(here, tmp_path):
    local = tmp_path / "local"
    (local / "envs").mkdir(parents=True)
    local.chmod(0o700)
    os.chown(local / "envs", 65534, 65534)
    answer = envstore.check(str(local), FP)
    assert answer["state"] == "refused" and "belongs to nobody" in answer["problem"]
    status, _ = ship(here, folder(tmp_path))
    assert "environment store" in status and "belongs to nobody" in status
    assert list((local / "envs").iterdir()) == []


def test_launch_checks_the_environment_before_running_it(here, tmp_path):
    """The bootstrap, the program and launch() as the relay runs them; a group-writable
    environment is refused before its python runs."""
    root = folder(tmp_path)
    (root / "bin" / "python").write_text('#!/bin/sh\necho RAN "$@"\n')
    assert ship(here, root)[0] == "shipped"
    env = tmp_path / "local" / "envs" / FP

    def launch() -> subprocess.CompletedProcess:
        cmd, first = sync.launch_command(here.nodes["here"], FP)
        return subprocess.run(
            ["bash", "-c", cmd], input=first + envstore.program() + b'{"spec": {}}\n',
            capture_output=True, timeout=30,
        )  # fmt: skip

    ok = launch()
    assert ok.stdout.decode().strip() == "RAN -m jupyter_lounge.node --stdio", ok.stderr
    env.chmod(0o775)
    refused = launch()
    assert refused.returncode == 3 and b"can be changed by other users" in refused.stderr
    assert b"RAN" not in refused.stdout
    env.chmod(0o755)
    (env / envstore.MARKER).unlink()
    gone = launch()
    assert gone.returncode == 3 and b"is not complete: run lounge sync" in gone.stderr
