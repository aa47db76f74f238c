"""Data sets on every node's own disk: `lounge stage` to the testbed's sshd nodes (shipped by
content: a changed file is all that travels again), engines reading them from their own disk,
pools, a node without room, an interrupted stage; on Slurm, agents copying a data set from
the shared file system to node scratch once; on this machine, engines reading the folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jupyter_lounge import Lounge, ship, stage
from jupyter_lounge.errors import LoungeError

from .conftest import processes_under, slurm_testbed_problem, wait_until

TESTBED = Path(os.environ.get("LOUNGE_TESTBED", "/tmp/lounge-testbed"))


def data_folder(root: Path, small: int = 300, large: int = 2, large_mib: int = 8) -> Path:
    """Many small files in subfolders and a few large ones, fresh random bytes (so no node
    has any of them yet)."""
    root.mkdir(parents=True, exist_ok=True)
    for i in range(small):
        path = root / f"slides_{i % 10}" / f"tile_{i:04}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(1024 + i * 10))
    for i in range(large):
        (root / f"weights_{i}.bin").write_bytes(os.urandom(large_mib * 2**20))
    (root / "labels.csv").write_text(f"tile,label\n0,tumour\n# {os.urandom(8).hex()}\n")
    return root


def lounge(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "jupyter_lounge.cli", *args],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def by_node(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr
    return {r["node"]: r for r in json.loads(done.stdout)}


def data_objects(node: int) -> list[Path]:
    """The objects of data sets in a testbed node's store (owner-only modes)."""
    objects = TESTBED / "local" / f"node{node}" / "lounge" / "store" / "objects"
    return [p for p in objects.rglob("*.*") if p.suffix in (".400", ".500")]


# -- on this machine (fast) --------------------------------------------------------------------
@pytest.mark.fast
@pytest.mark.parametrize(
    "given, sentence",
    [
        (["tissue"], "--stage 'tissue' is not NAME=DIR"),
        (["tis sue=/tmp"], "'tis sue' cannot name a data set"),
        (["tissue\n=/tmp"], "'tissue\\\\n' cannot name a data set"),
        (["tissue=/no/such/folder"], "'/no/such/folder' is not a folder here"),
    ],
)
def test_a_wrong_stage_option_is_one_sentence(given, sentence, lounge_dir):
    with pytest.raises(LoungeError, match=sentence):
        Lounge(1, stage=given)


@pytest.mark.fast
def test_data_outside_an_engine_says_how_to_stage(monkeypatch):
    monkeypatch.delenv("LOUNGE_DATA_TISSUE", raising=False)
    with pytest.raises(LoungeError, match="stage it with `lounge stage DIR --name tissue`"):
        stage.data("tissue")
    monkeypatch.setenv("LOUNGE_DATA_TISSUE", "/var/local/lounge/data/.tissue.abc")
    assert stage.data("tissue") == "/var/local/lounge/data/.tissue.abc"
    done = lounge("stage")
    assert done.returncode != 0 and "Say which folder to stage" in done.stderr


def test_local_engines_read_the_folder_where_it_is(tmp_path, lounge_dir):
    root = data_folder(tmp_path / "tissue", small=3, large=0)
    cluster = Lounge(2, stage=[f"tissue={root}"], wait=True).start_sync()
    try:

        def read(_):
            import os

            import jupyter_lounge

            path = jupyter_lounge.data("tissue")
            return path, os.environ["LOUNGE_DATA_TISSUE"], open(f"{path}/labels.csv").read()

        df = cluster.map(read, range(2), progress=False)
        labels = (root / "labels.csv").read_text()
        assert df.result.tolist() == [(str(root), str(root), labels)] * 2
    finally:
        cluster.stop_sync()


# -- the lounge's nodes (testbed) --------------------------------------------------------------
@pytest.fixture
def pools(tmp_path):
    """node1 and node2 in pool "a", node3 in pool "b"; node3's local_dir as given."""
    problem = slurm_testbed_problem()
    if problem:
        pytest.skip(problem)

    def write(node3_dir: str = "/var/local/lounge") -> str:
        text = ""
        for i, pool in ((1, "a"), (2, "a"), (3, "b")):
            text += (
                f'[[node]]\nname = "node{i}"\nhost = "10.77.0.1{i}"\nuser = "root"\n'
                f'key = "{os.environ["LOUNGE_TESTBED_KEY"]}"\npython = "{sys.executable}"\n'
                f'known_hosts = "{os.environ["LOUNGE_TESTBED_KNOWN_HOSTS"]}"\nengines = 2\n'
                f'pools = ["{pool}"]\n'
                f'local_dir = "{node3_dir if i == 3 else "/var/local/lounge"}"\n\n'
            )
        path = tmp_path / "lounge.toml"
        path.write_text(text)
        return str(path)

    return write


def test_stage_ships_once_then_only_the_changed_file_and_engines_read_their_own_disk(
    pools, tmp_path, lounge_dir
):
    inventory = pools()
    root = data_folder(tmp_path / "tissue")
    files = sum(1 for p in root.rglob("*") if p.is_file())
    args = ["--inventory", inventory, "--pool", "a", "--json"]
    first = by_node(lounge("stage", str(root), "--name", "tissue", *args))
    assert set(first) == {"node1", "node2"}  # the pool's nodes only
    assert all(r["status"] == "shipped" and r["files"] == files for r in first.values())
    assert first["node1"]["path"] == "/var/local/lounge/data/tissue"

    healthy = f"tile,label\n0,healthy\n# {os.urandom(8).hex()}\n"  # new to every node
    (root / "labels.csv").write_text(healthy)
    again = by_node(lounge("stage", str(root), "--name", "tissue", *args))
    assert [(r["status"], r["files"]) for r in again.values()] == [("shipped", 1)] * 2
    assert all(r["MiB"] < 0.001 for r in again.values())  # 22 bytes, not 16 MiB
    same = by_node(lounge("stage", str(root), "--name", "tissue", *args))
    assert {r["status"] for r in same.values()} == {"present"}

    listed = json.loads(lounge("stage", "--list", "--inventory", inventory, "--json").stdout)
    have = {(r["node"], r["name"], r.get("files")) for r in listed}
    assert have == {("node1", "tissue", files), ("node2", "tissue", files), ("node3", None, None)}

    cluster = Lounge(4, wait=True, backend="ssh", inventory=inventory, pool="a").start_sync()
    try:

        def read(_):
            import hashlib
            import socket

            import jupyter_lounge

            path = jupyter_lounge.data("tissue")
            with open(f"{path}/weights_1.bin", "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            return socket.gethostname(), path, open(f"{path}/labels.csv").read(), digest

        df = cluster.map(read, range(8), progress=False)
        weights = __import__("hashlib").sha256((root / "weights_1.bin").read_bytes()).hexdigest()
        assert {r[0] for r in df.result} == {"node1", "node2"}
        assert all(r[1].startswith("/var/local/lounge/data/.tissue.") for r in df.result)
        assert not Path(df.result[0][1]).exists()  # on the node's own disk, not here
        assert {(r[2], r[3]) for r in df.result} == {(healthy, weights)}
    finally:
        cluster.stop_sync()

    removed = by_node(lounge("stage", "--remove", "tissue", *args))
    assert {r["status"] for r in removed.values()} == {"removed"}
    assert data_objects(1) == [] and not (TESTBED / "local/node1/lounge/data/tissue").exists()
    assert processes_under(str(lounge_dir)) == []


def test_a_node_without_room_says_so_and_the_others_get_it(pools, tmp_path, lounge_dir):
    init = (TESTBED / "node3.pid").read_text().strip()
    mount = ["nsenter", f"--mount=/proc/{init}/ns/mnt"]
    subprocess.run([*mount, "mkdir", "-p", "/var/local/small"], check=True)
    subprocess.run([*mount, "mount", "-t", "tmpfs", "-o", "size=64m,mode=0700", "tmpfs",
                    "/var/local/small"], check=True)  # fmt: skip
    try:
        inventory = pools("/var/local/small")
        root = data_folder(tmp_path / "scan", small=5, large=1, large_mib=40)
        done = lounge("stage", str(root), "--name", "scan", "--inventory", inventory, "--json")
        rows = by_node(done)  # some node has it: not an error
        assert rows["node1"]["status"] == rows["node2"]["status"] == "shipped"
        said = rows["node3"]["status"]
        assert said.startswith("failed: jupyter_lounge on node3: this node has ") and (
            "MiB free in /var/local/small and this needs 41 MiB more" in said
        ), said
        lounge("stage", "--remove", "scan", "--inventory", inventory)
    finally:
        subprocess.run([*mount, "umount", "/var/local/small"], check=True)


def test_an_interrupted_stage_keeps_what_arrived_and_the_next_one_resumes(
    pools, tmp_path, lounge_dir
):
    inventory = pools()
    root = data_folder(tmp_path / "big", small=0, large=24, large_mib=4)
    cmd = [sys.executable, "-m", "jupyter_lounge.cli", "stage", str(root), "--name", "big",
           "--inventory", inventory, "--pool", "a", "--json"]  # fmt: skip
    objects = TESTBED / "local" / "node1" / "lounge" / "store" / "objects"
    wanted = [objects / sha[:2] / f"{sha}.400" for sha in map(ship.sha256_file, root.iterdir())]

    def arrived() -> int:  # a look at these files alone: the store may hold thousands more
        return sum(p.exists() for p in wanted)

    assert arrived() == 0 and len(wanted) == 25
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: arrived() > 0, 60, "some files on node1", interval=0.005)
    finally:
        proc.kill()  # the sender dies mid-stream; its ssh sessions end with it
        proc.wait()
    time.sleep(1)
    kept = arrived()
    assert 0 < kept < 25
    assert not (TESTBED / "local/node1/lounge/data/big").exists()  # never half a data set
    again = by_node(lounge("stage", str(root), "--name", "big", "--inventory", inventory,
                           "--pool", "a", "--json"))  # fmt: skip
    assert again["node1"]["status"] == "shipped" and again["node1"]["files"] == 25 - kept
    assert list((TESTBED / "local/node1/lounge/store/tmp").iterdir()) == []
    lounge("stage", "--remove", "big", "--inventory", inventory)


def test_slurm_agents_copy_a_data_set_to_scratch_once_and_later_jobs_reuse_it(tmp_path, lounge_dir):
    problem = slurm_testbed_problem()
    if problem:
        pytest.skip(problem)
    root = data_folder(tmp_path / "tissue", small=20, large=1, large_mib=2)
    scratch = tmp_path / "scratch"
    options = {"backend": "slurm", "engines_per_node": 1, "scratch": str(scratch)}
    seen = []
    for _ in range(2):
        cluster = Lounge(2, stage=[f"tissue={root}"], wait=True, **options).start_sync()
        try:

            def read(_):
                import os
                import socket

                import jupyter_lounge

                path = jupyter_lounge.data("tissue")
                return socket.gethostname(), path, open(os.path.join(path, "labels.csv")).read()

            df = cluster.map(read, range(4), progress=False)
            assert len({r[0] for r in df.result}) == 2
            assert {r[2] for r in df.result} == {(root / "labels.csv").read_text()}
            paths = {r[1] for r in df.result}
            assert len(paths) == 1 and paths.pop().startswith(f"{scratch}/jupyter_lounge-")
            big = next(Path(df.result[0][1]).glob("weights_*.bin")).stat()
            seen.append((df.result[0][1], big.st_ino, big.st_ctime_ns))
        finally:
            cluster.stop_sync()
    assert seen[0] == seen[1]  # the second job found it there: nothing copied again
