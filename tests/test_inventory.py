"""The lounge inventory: a good file read whole, and every mistake one sentence that names the
file, the line or key, and what is expected."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jupyter_lounge import inventory
from jupyter_lounge.errors import LoungeError

GOOD = """\
[defaults]
user = "lounge"
key = "~/.ssh/lounge_key"
python = "/opt/lounge/bin/python"
engines = 4

[idle]
cpu_percent = 25
for_seconds = 20

[pools.gpu.idle]
cpu_percent = 10

[[node]]
name = "pc01"
host = "10.77.0.11"
gpus = 1
pools = ["gpu", "nlp"]

[[node]]
name = "pc02"
host = "10.77.0.12"
port = 2222
engines = 8
pools = "cancer"
"""


@pytest.fixture
def write(tmp_path):
    def write(text: str):
        path = tmp_path / "lounge.toml"
        path.write_text(text)
        return path

    return write


def test_a_good_inventory(write):
    inv = inventory.load(write(GOOD))
    pc01, pc02 = inv.nodes
    assert (pc01.name, pc01.host, pc01.user, pc01.port, pc01.gpus, pc01.engines) == (
        "pc01",
        "10.77.0.11",
        "lounge",
        22,
        1,
        4,
    )
    assert pc01.key == os.path.expanduser("~/.ssh/lounge_key")
    assert pc01.python == "/opt/lounge/bin/python"
    assert (pc02.port, pc02.engines, pc02.pools) == (2222, 8, ("cancer",))
    # the global policy, tightened for the gpu pool only
    assert (pc01.idle.cpu_percent, pc01.idle.for_seconds, pc01.idle.gpu_percent) == (10, 20, 10)
    assert pc02.idle.cpu_percent == 25
    assert inv.pools == ["cancer", "gpu", "nlp"]
    assert [n.name for n in inv.select("gpu")] == ["pc01"]
    assert [n.name for n in inv.select()] == ["pc01", "pc02"]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("[[node]]\nname = 'a'\nhost = \n", "is not valid TOML: "),
        ("[[node]]\nname = 'a'\n", "line 1 ([[node]] number 1): 'host' is missing"),
        ("[[node]]\nname = 'a'\nhost = 'h'\ngpu = 1\n", "unknown key 'gpu'; expected one of"),
        (
            "[[node]]\nname = 'a'\nhost = 'h'\n[[node]]\nname = 'b'\nhost = 'h'\nengines = 0\n",
            "line 4 ([[node]] number 2): 'engines' must be a whole number from 1 to 4096, not 0",
        ),
        ("[[node]]\nname = 'a'\nhost = 'h'\ngpus = 'two'\n", "'gpus' must be a whole number"),
        (
            "[[node]]\nname = 'a'\nhost = 'h'\n[[node]]\nname = 'a'\nhost = 'g'\n",
            "node name 'a' is used twice",
        ),
        ("[[node]]\nname = 'bad name'\nhost = 'h'\n", "node name 'bad name' is not valid"),
        ("[[node]]\nname = 'a'\nhost = 'h'\npools = [1]\n", "'pools' must be a list of names"),
        (
            "[idle]\ncpu = 5\n[[node]]\nname = 'a'\nhost = 'h'\n",
            "line 2 in [idle]: unknown key 'cpu'; expected one of cpu_percent",
        ),
        (
            "[idle]\ncpu_percent = -1\n[[node]]\nname = 'a'\nhost = 'h'\n",
            "'cpu_percent' must be a number of at least 0, not -1",
        ),
        ("[machines]\n", "unknown section 'machines'"),
        ("[defaults]\nuser = 'x'\n", "no [[node]] entries; add one per machine"),
    ],
)
def test_each_mistake_is_one_sentence(write, text, expected):
    path = write(text)
    with pytest.raises(LoungeError) as info:
        inventory.load(path)
    message = str(info.value)
    assert expected in message and str(path) in message and "\n" not in message.strip()


def test_missing_file_and_unknown_pool(tmp_path, write):
    with pytest.raises(LoungeError, match="No lounge inventory at .*nope.toml: create it"):
        inventory.load(tmp_path / "nope.toml")
    inv = inventory.load(write(GOOD))
    with pytest.raises(
        LoungeError, match="Unknown pool 'vision' in .*: the pools there are cancer, gpu, nlp"
    ):
        inv.select("vision")


def test_lounge_nodes_prints_the_table(write, monkeypatch):
    path = write(GOOD)
    monkeypatch.setenv("JUPYTER_LOUNGE_INVENTORY", str(path))
    out = subprocess.run(
        [sys.executable, "-m", "jupyter_lounge.cli", "nodes"],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"{path}:"
    assert lines[1].split() == ["name", "host", "user", "port", "gpus", "engines", "pools"]
    assert lines[2].split() == ["pc01", "10.77.0.11", "lounge", "22", "1", "4", "gpu,nlp"]
    gpu_only = subprocess.run(
        [sys.executable, "-m", "jupyter_lounge.cli", "nodes", "--pool", "gpu"],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ,
    )
    assert [line.split()[0] for line in gpu_only.stdout.splitlines()[2:]] == ["pc01"]
    bad = subprocess.run(
        [sys.executable, "-m", "jupyter_lounge.cli", "nodes", "--pool", "x"],
        capture_output=True,
        text=True,
        timeout=60,
        env=os.environ,
    )
    assert bad.returncode == 2 and "Unknown pool 'x'" in bad.stderr


def test_magic_lounge_nodes(write, monkeypatch, capsys):
    from IPython.core.interactiveshell import InteractiveShell

    monkeypatch.setenv("JUPYTER_LOUNGE_INVENTORY", str(write(GOOD)))
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "jupyter_lounge")
    shell.run_line_magic("lounge", "nodes --pool cancer")
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out[2:]] == ["pc02"]
