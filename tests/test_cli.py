"""The shell face: a cluster started by `lounge start` outlives the command, other processes
attach to it by name, `lounge stop` ends it; bad input is one line and exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jupyter_lounge import Lounge, state

from .conftest import processes_under

LOUNGE = [sys.executable, "-m", "jupyter_lounge.cli"]


def lounge(*args, timeout=120):
    return subprocess.run(
        [*LOUNGE, *args], capture_output=True, text=True, timeout=timeout, env=os.environ
    )


@pytest.mark.parametrize("kind", ["ipyparallel", "dask"])
def test_start_list_attach_stop(kind, lounge_dir):
    out = lounge("start", "3", "--engines", kind, "--name", "shell", "--preload", "json", "--wait")
    assert out.returncode == 0, out.stderr
    assert "Started shell: 3/3 ready" in out.stdout
    # the command has ended; the cluster has not
    listing = lounge("list")
    assert "shell" in listing.stdout and "running" in listing.stdout
    cluster = Lounge.attach("shell")
    assert len(cluster.registered()) == 3
    df = cluster.map(abs, [-1, -2], progress=False)
    assert list(df.result) == [1, 2]
    status = lounge("status", "shell")
    assert "3/3 engines ready" in status.stdout
    assert lounge("scale", "4", "--name", "shell").returncode == 0
    cluster.wait_for_engines_sync(4, timeout=60)
    interrupted = lounge("interrupt", "shell")
    assert interrupted.returncode == 0, interrupted.stderr
    assert interrupted.stdout.startswith("Interrupted 4 engines of 'shell': ")
    stopped = lounge("stop", "shell")
    assert stopped.returncode == 0 and "Stopped shell." in stopped.stdout
    assert state.list_states() == []
    assert processes_under(str(lounge_dir)) == []


@pytest.mark.parametrize(
    "args, expected",
    [
        (["start", "-2"], "whole number above 0"),
        (["start", "many"], "not 'many'"),
        (["start", "2", "--bogus"], "Unknown option --bogus: see `lounge help`"),
        (["stop", "ghost"], "No cluster named 'ghost' to stop"),
        (["stop"], "Say which cluster to stop"),
        (["interrupt"], "Say which cluster to interrupt"),
        (["interrupt", "ghost"], "No cluster named 'ghost'"),
        (["teleport"], "Unknown command 'teleport'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, expected):
    out = lounge(*args)
    assert out.returncode == 2
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], out.stderr


def test_failed_start_from_the_shell_leaves_nothing(lounge_dir):
    out = lounge("start", "2", "--preload", "definitely_not_a_module")
    assert out.returncode == 2
    assert "definitely_not_a_module" in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert state.list_states() == []
    assert processes_under(str(lounge_dir)) == []
