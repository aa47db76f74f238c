"""The node side of `lounge sync` and `lounge stage` (envstore.put, treestore.py) with the
sender (ship.py), run for real on this machine: the same bootstrap command and program, the
same conversation, only bash in ssh's place. Small folders stand in for the environment and
the data sets, so these take seconds (tests/test_ssh.py and test_stage.py ship to nodes)."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_lounge import envstore, ship, sync, treestore

FP = "0123456789abcdef"


class Here:
    """A 'backend' whose nodes are this machine: bash -c runs the command ssh would."""

    def __init__(self, local_dir: Path):
        node = type("Node", (), {"name": "here", "local_dir": str(local_dir)})()
        self.nodes = {"here": node}

    def ssh_command(self, name: str) -> list[str]:
        return ["bash", "-c"]


@pytest.fixture
def here(tmp_path, monkeypatch, lounge_dir):
    monkeypatch.setattr(sync, "base_python", lambda: sys.executable)
    return Here(tmp_path / "local")


def folder(tmp_path: Path, text: str = "hello") -> Path:
    root = tmp_path / f"src-{text}"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").write_text("#!/bin/sh\n")
    (root / "bin" / "python").chmod(0o775)  # group-writable at the source: not on the node
    (root / "lib" / "pkg").mkdir(parents=True)
    (root / "lib" / "pkg" / "data.txt").write_text(text * 1000)
    (root / "lib" / "pkg" / "other.txt").write_text("same in every version")
    (root / "lib" / "link").symlink_to("pkg")
    return root


def ship_it(here, root, name=FP, kind="env", build=None, **how) -> dict:
    def scan():
        return ship.scan(ship.folder_pairs(root), private=kind == "data", what="test")

    nodes = list(here.nodes.values())
    return sync.put_tree(nodes, here.ssh_command, kind, name, build or scan, progress=False, **how)[
        "here"
    ]


def tidied(local: Path) -> None:
    """Wait for the node's tidying after its answer (it holds the store's lock)."""
    with open(local / "store" / ".lock") as f:
        fcntl.flock(f, fcntl.LOCK_EX)


def leftovers(local: Path) -> list[str]:
    """Temporary files and folders left, once the node's tidying is done (its own temporary
    file for the manifest it saves is not one)."""
    tidied(local)
    found = [p.name for p in (local / "store" / "tmp").iterdir()]
    for sub in ("envs", "data"):
        if (local / sub).exists():
            found += [p.name for p in (local / sub).iterdir() if ".part-" in p.name]
    return sorted(found)


def test_an_environment_arrives_whole_and_only_then_is_in_place(here, tmp_path):
    root = folder(tmp_path)
    row = ship_it(here, root)
    assert row["status"] == "shipped" and row["files"] == 3
    env = tmp_path / "local" / "envs" / FP
    assert (env / "lib" / "pkg" / "data.txt").read_text() == "hello" * 1000
    assert os.readlink(env / "lib" / "link") == "pkg"
    assert (env / "bin" / "python").stat().st_mode & 0o777 == 0o555  # nobody writes it
    assert (env / "lib").stat().st_mode & 0o777 == 0o755
    marker = json.loads((env / envstore.MARKER).read_text())
    assert marker["fingerprint"] == FP and len(marker["tree"]) == 64
    assert leftovers(tmp_path / "local") == []
    assert (tmp_path / "local").stat().st_mode & 0o077 == 0  # made private
    assert envstore.check(str(tmp_path / "local"), FP) == {"state": "present"}
    assert ship_it(here, root)["status"] == "present"  # asked, nothing sent


def test_a_second_environment_ships_only_the_changed_file_and_the_manifest_change(here, tmp_path):
    root = folder(tmp_path)
    for i in range(200):  # a manifest that is not small
        (root / "lib" / f"module_{i:03}.py").write_text(f"VALUE = {i}\n")
    first = ship_it(here, root)
    assert first["files"] == 203
    (root / "lib" / "module_007.py").write_text("VALUE = 'changed'\n")
    unchanged = (tmp_path / "local" / "envs" / FP / "lib" / "module_008.py").stat().st_ino
    again = ship_it(here, root, name="f" * 16)
    assert again["status"] == "shipped" and again["files"] == 1 and again["bytes"] == 18
    assert again["wire"] < first["wire"] / 5 and again["wire"] < 4096  # only the delta
    env = tmp_path / "local" / "envs" / ("f" * 16)
    assert (env / "lib" / "module_007.py").read_text() == "VALUE = 'changed'\n"
    assert (env / "lib" / "module_008.py").stat().st_ino == unchanged  # one copy


@pytest.mark.parametrize("settled", [False, True], ids=["just-written", "settled"])
def test_a_file_that_changed_after_hashing_is_refused_and_leaves_nothing(
    here, tmp_path, monkeypatch, settled
):
    """Checked by its hash as it is sent, or (a file older than the scan by RACY_NS: here
    every file) by its stat: the same size and mtime do not hide a write from it."""
    if settled:
        monkeypatch.setattr(ship, "RACY_NS", 0)
    root = folder(tmp_path)

    def build():
        tree = ship.scan(ship.folder_pairs(root), private=False, what="test")
        assert bool(tree.read) == settled  # files whose stat the send will check
        data = root / "lib" / "pkg" / "data.txt"
        st = data.stat()
        data.write_text("jello" * 1000)  # same size
        os.utime(data, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the same mtime
        return tree

    row = ship_it(here, root, build=build)
    assert row["status"].startswith("failed: jupyter_lounge on ")
    assert "changed while the sync read it" in row["status"]
    assert not (tmp_path / "local" / "envs" / FP).exists()
    assert leftovers(tmp_path / "local") == []


def test_a_file_the_scan_hashed_is_sent_unhashed_while_its_stat_holds(here, tmp_path, monkeypatch):
    """The sync's own scan read the file once; sending it does not hash it again."""
    monkeypatch.setattr(ship, "RACY_NS", 0)
    root = folder(tmp_path)

    def refuse():
        raise AssertionError("hashed a second time as it was sent")

    def build():
        tree = ship.scan(ship.folder_pairs(root), private=False, what="test")
        monkeypatch.setattr(ship, "hashlib", type("NoHash", (), {"sha256": refuse}))
        return tree

    assert ship_it(here, root, build=build)["status"] == "shipped"
    env = tmp_path / "local" / "envs" / FP
    assert (env / "lib" / "pkg" / "data.txt").read_text() == "hello" * 1000


def test_a_record_is_trusted_while_its_file_is_as_installed_and_checked_as_it_is_sent(
    here, tmp_path
):
    """A file no newer than its RECORD, with the size it gives, takes the RECORD's hash
    without being read (a first sync reads the 2.5 GB virtualenv once, to send it); one that
    changed since is hashed. A RECORD that lies is found out as the file is sent: nothing of it
    is kept on the node, and the next sync knows the file's real hash."""
    import base64
    import hashlib

    from jupyter_lounge import treestore

    root = folder(tmp_path)
    site, data, other = root / "lib", root / "lib/pkg/data.txt", root / "lib/pkg/other.txt"
    lie = hashlib.sha256(b"jello" * 1000).digest()  # not data.txt's bytes, but its size
    (site / "pkg-1.dist-info").mkdir()
    record = site / "pkg-1.dist-info" / "RECORD"
    wrong = base64.urlsafe_b64encode(bytes(32)).rstrip(b"=").decode()
    record.write_text(
        f"pkg/data.txt,sha256={base64.urlsafe_b64encode(lie).rstrip(b'=').decode()},5000\n"
        f"pkg/other.txt,sha256={wrong},21\npkg-1.dist-info/RECORD,,\n"
    )
    written = record.stat().st_mtime_ns
    os.utime(data, ns=(written - 10**9, written - 10**9))  # as installed
    os.utime(other, ns=(written + 10**9, written + 10**9))  # edited after
    trusted = ship.record_hashes(str(site))
    assert trusted == {str(data): (5000, lie.hex(), written), str(other): (21, "0" * 64, written)}

    def build():
        return ship.scan(ship.folder_pairs(root), private=False, what="test", trusted=trusted)

    shas = {e[0]: e[4] for e in build().entries if e[1] == "f"}
    assert shas["lib/pkg/data.txt"] == lie.hex()  # taken from the RECORD, not read
    assert shas["lib/pkg/other.txt"] == hashlib.sha256(other.read_bytes()).hexdigest()  # read
    row = ship_it(here, root, build=build)
    assert row["status"].startswith("failed: ") and treestore.CHANGED in row["status"]
    assert str(data) in row["status"]
    assert not (tmp_path / "local" / "envs" / FP).exists()
    assert leftovers(tmp_path / "local") == []
    objects = tmp_path / "local" / "store" / "objects"
    assert not list(objects.rglob(f"{lie.hex()}.*"))  # nothing kept under the false name
    row = ship_it(here, root, build=build)  # the real hash is known now: it beats the RECORD
    assert row["status"] == "shipped"
    assert (tmp_path / "local" / "envs" / FP / "lib/pkg/data.txt").read_text() == "hello" * 1000


def test_an_interrupted_sync_keeps_what_arrived_and_the_next_one_resumes(here, tmp_path):
    root = folder(tmp_path)
    for i in range(20):
        (root / "lib" / f"part_{i:02}.bin").write_bytes(os.urandom(1000))
    tree = ship.scan(ship.folder_pairs(root), private=False, what="test")
    keys = sorted(tree.sizes)
    victim = Path(tree.sources[keys[len(keys) // 2]])  # unreadable half way through
    victim.chmod(0)
    saved = victim.read_bytes()
    victim.unlink()
    row = ship_it(here, root, build=lambda: tree)
    assert row["status"].startswith("failed:") and "could not be read here" in row["status"]
    assert not (tmp_path / "local" / "envs" / FP).exists()
    stored = list((tmp_path / "local" / "store" / "objects").rglob("*.*"))
    assert 0 < len(stored) < len(keys)  # what arrived before is kept
    victim.write_bytes(saved)
    row = ship_it(here, root)
    assert row["status"] == "shipped" and row["files"] == len(keys) - len(stored)
    assert leftovers(tmp_path / "local") == []


def test_an_environment_an_agent_runs_is_never_removed(here, tmp_path):
    envs = tmp_path / "local" / "envs"

    def names() -> list[str]:
        return sorted(p.name for p in envs.iterdir() if not p.name.startswith("."))

    assert ship_it(here, folder(tmp_path, "v0"), name="a" * 16)["status"] == "shipped"
    held = os.open(envs / ("a" * 16) / envstore.MARKER, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_SH)  # as launch() does for a running agent
    try:
        assert ship_it(here, folder(tmp_path, "v1"), name="b" * 16)["status"] == "shipped"
        for i, fp in enumerate(("a" * 16, "b" * 16)):
            os.utime(envs / fp / envstore.MARKER, (1000 + i, 1000 + i))  # a older than b
        assert ship_it(here, folder(tmp_path, "v2"), name="c" * 16, keep=1)["status"] == "shipped"
        assert names() == ["a" * 16, "c" * 16]  # a older, but in use; c made of b
    finally:
        os.close(held)
    assert ship_it(here, folder(tmp_path, "v3"), name="d" * 16, keep=1)["status"] == "shipped"
    assert names() == ["d" * 16]  # made of a, and c removed
    tidied(tmp_path / "local")
    assert sorted(p.name for p in envs.iterdir()) == ["d" * 16]  # the old ones' files too
    objects = sorted((tmp_path / "local" / "store" / "objects").rglob("*.*"))
    assert len(objects) == 3  # data.txt of v3, other.txt, python: the rest collected


def test_a_store_someone_else_owns_is_refused(here, tmp_path):
    local = tmp_path / "local"
    (local / "envs").mkdir(parents=True)
    local.chmod(0o700)
    os.chown(local / "envs", 65534, 65534)
    answer = envstore.check(str(local), FP)
    assert answer["state"] == "refused" and "belongs to nobody" in answer["problem"]
    status = ship_it(here, folder(tmp_path))["status"]
    assert "environment store" in status and "belongs to nobody" in status
    assert list((local / "envs").iterdir()) == []


def test_a_data_set_is_the_owners_alone_and_changes_whole(here, tmp_path):
    root = tmp_path / "tissue"
    (root / "slides").mkdir(parents=True)
    (root / "slides" / "a.png").write_bytes(b"A" * 5000)
    (root / "labels.csv").write_text("a,1\n")
    assert ship_it(here, root, name="tissue", kind="data")["status"] == "shipped"
    data = tmp_path / "local" / "data"
    first = (data / "tissue").resolve()
    assert (data / "tissue" / "slides" / "a.png").read_bytes() == b"A" * 5000
    for path in [first, *first.rglob("*")]:
        assert path.stat().st_mode & 0o077 == 0, path  # nothing for other users
    assert ship_it(here, root, name="tissue", kind="data")["status"] == "present"
    (root / "labels.csv").write_text("a,2\n")
    row = ship_it(here, root, name="tissue", kind="data")
    assert row["status"] == "shipped" and row["files"] == 1
    assert (data / "tissue" / "labels.csv").read_text() == "a,2\n" and first.exists()
    (root / "labels.csv").write_text("a,3\n")
    assert ship_it(here, root, name="tissue", kind="data")["status"] == "shipped"
    tidied(tmp_path / "local")
    assert not first.exists()  # two versions kept: the current one and the one before
    status = ship_it(here, root, name="no-such name", kind="data")["status"]
    assert "cannot name a data set" in status


def test_a_data_set_version_is_made_from_the_one_it_replaces_by_its_change(here, tmp_path):
    root, local = tmp_path / "cells", tmp_path / "local"
    (root / "a").mkdir(parents=True)
    for i in range(30):
        (root / "a" / f"{i:02}.bin").write_bytes(os.urandom(500))

    def stage(labels: str) -> Path:
        (root / "labels.csv").write_text(labels)
        assert ship_it(here, root, name="cells", kind="data")["status"] == "shipped"
        tidied(local)  # (its manifest saved: a later version may be made of it)
        return (local / "data" / "cells").resolve()

    def same(version: Path) -> None:
        got = {p.relative_to(version): p.read_bytes() for p in version.rglob("*") if p.is_file()}
        assert got == {p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file()}
        for path in [version, *version.rglob("*")]:
            assert path.stat().st_mode & 0o077 == 0, path

    v1 = stage("v1\n")
    folder = v1.stat().st_ino
    v2, v3 = stage("v2\n"), stage("v3\n")
    assert v3.stat().st_ino == folder and not v1.exists()  # v1's folder, changed into v3
    assert (v2 / "labels.csv").read_text() == "v2\n"  # the one before stays as it was
    same(v3)
    objects = list((local / "store" / "objects").rglob("*.*"))
    assert len(objects) == 32  # 30 + the labels of v2 and v3: v1's collected
    (v2 / "extra.txt").write_text("someone's")  # v2 is no longer as its manifest says
    (root / "extra.txt").write_text("new")
    v4 = stage("v4\n")
    assert not v2.exists()  # the change failed on it (extra.txt was there): it is gone
    same(v4)  # and v4 linked anew


def test_the_first_change_of_a_data_set_is_made_from_a_spare_copy_and_removal_takes_it(
    here, tmp_path
):
    root, local = tmp_path / "cells", tmp_path / "local"
    data = local / "data"
    (root / "a").mkdir(parents=True)
    for i in range(20):
        (root / "a" / f"{i:02}.bin").write_bytes(os.urandom(300))

    def stage(labels: str, name: str = "cells") -> Path:
        (root / "labels.csv").write_text(labels)
        assert ship_it(here, root, name=name, kind="data")["status"] == "shipped"
        tidied(local)
        return (data / name).resolve()

    def files(folder: Path) -> dict:
        return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}

    def spares(name: str = "cells") -> list[Path]:
        return sorted(data.glob(f".{name}{treestore.SPARE}.*"))

    v1 = stage("v1\n")
    [spare] = spares()  # the set's only version: a copy of it waits for the next change
    assert spare.name.endswith(envstore.data_current(str(local), "cells"))
    assert files(spare) == files(v1) == files(root)
    for path in [spare, *spare.rglob("*")]:
        assert path.stat().st_mode & 0o077 == 0, path
    assert treestore.data_versions(str(local), None) == [v1.name.rsplit(".", 1)[1]]
    inode = spare.stat().st_ino
    v2 = stage("v2\n")
    assert v2.stat().st_ino == inode and spares() == []  # the spare, changed into v2
    assert files(v1) == {**files(root), Path("labels.csv"): b"v1\n"}  # the one before: as it was
    assert files(v2) == files(root)
    inode = v1.stat().st_ino
    v3 = stage("v3\n")
    assert v3.stat().st_ino == inode and not v1.exists()  # as every later change: v1's folder
    assert spares() == [] and files(v3) == files(root)
    stage("x\n", name="other")
    assert len(spares("other")) == 1
    left = data / f".other{treestore.SPARE}.{'0' * 64}.part-1"  # a tidy killed as it linked
    left.mkdir()
    stage("y\n", name="other")
    assert not left.exists()
    assert treestore.remove_data(str(local), "other")
    assert spares("other") == [] and not any("other" in p.name for p in data.iterdir())
    objects = list((local / "store" / "objects").rglob("*.*"))
    assert len(objects) == 22  # 20 + the labels of v2 and v3: v1's and other's collected


def test_a_data_set_is_sent_as_its_change_from_its_own_version_among_other_trees(here, tmp_path):
    root, local = tmp_path / "cells", tmp_path / "local"
    (root / "a").mkdir(parents=True)
    for i in range(200):
        (root / "a" / f"{i:03}.bin").write_bytes(os.urandom(200))
    assert ship_it(here, root, name="cells", kind="data")["status"] == "shipped"
    for i in range(2):  # environments, shipped since: trees the node and we both have
        assert ship_it(here, folder(tmp_path, f"v{i}"), name=f"{i}" * 16)["status"] == "shipped"
    tidied(local)
    mine = envstore.data_current(str(local), "cells")
    proc = subprocess.run(
        envstore.command(sys.executable, "put", str(local), "data", "cells"),
        input=envstore.program(), capture_output=True, timeout=60,
    )  # fmt: skip
    hello = json.loads(proc.stdout.splitlines()[0])
    assert hello["have"][0] == mine and len(hello["have"]) > 1  # its own first
    (root / "a" / "000.bin").write_bytes(os.urandom(200))
    row = ship_it(here, root, name="cells", kind="data")
    assert row["status"] == "shipped" and row["files"] == 1
    assert row["wire"] < 1500  # the file and a one-entry change, not 200 entries


def test_the_node_runs_the_compiled_program_only_on_the_python_that_compiled_it(tmp_path):
    """The program travels compiled and as source: the compiled code runs on the very Python
    version that made it, the source is compiled on any other."""
    import marshal

    src = envstore.source()
    code = marshal.dumps(compile(src, envstore.PROGRAM_NAME, "exec"))
    mine = f"{sys.implementation.cache_tag} {sys.hexversion:x}"
    broken = b"raise SystemExit('the wrong half ran')\n"
    bad = marshal.dumps(compile(broken, "x", "exec"))

    def run(payload: bytes) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-I", "-S", "-c", envstore.BOOT, str(len(payload))]
        return subprocess.run(
            [*argv, "data-list", str(tmp_path)], input=payload, capture_output=True, timeout=60
        )

    for payload in (
        envstore.pack_program(broken, mine, code),  # this Python: the code, not the source
        envstore.pack_program(src, "cpython-27 20712f0", bad),  # another: the source
        envstore.program(),
    ):
        proc = run(payload)
        assert proc.returncode == 0 and json.loads(proc.stdout) == [], proc.stderr
    wrong = run(envstore.pack_program(src, mine, bad))
    assert b"the wrong half ran" in wrong.stderr  # the tag decides, as the first case shows


def test_the_files_of_the_node_program_define_no_name_twice():
    """They run as one program (envstore.source): a name defined in two of them would be the
    later one's everywhere, silently."""
    import ast

    where: dict[str, str] = {}
    for name in ("trust.py", "treestore.py", "envstore.py"):
        tree = ast.parse((Path(envstore.__file__).parent / name).read_text())
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
            else:
                continue
            for n in names:
                assert where.setdefault(n, name) == name, f"{n} is in {where[n]} and {name}"


@pytest.mark.fast
def test_the_node_answers_the_text_json_would_and_reads_manifests_of_either_format():
    """The node program writes its answers without the json module and packs manifests with
    marshal; what it writes is json.dumps's text, and a manifest an earlier version saved as
    JSON is still read."""
    from jupyter_lounge import treestore

    odd = 'caf\u00e9 "q" back\\slash \t\n\x00\x7f \U0001f600 \udcff'
    values = [
        {"state": "missing", "missing": {"ab" * 32 + ".644": 12, "k": 0}, "free_mib": 10**12},
        {"state": "shipped", "removed": [odd, "plain/path.py"], "in_use": [], "bytes": 0},
        [None, True, False, -3, 2.5, 1e-07, 123456789.125, [], {}, ""],
        {"fingerprint": "0" * 16, "tree": "f" * 64, "time": 1764990000.123456},
    ]
    for value in values:
        assert envstore.to_json(value) == json.dumps(value)
        assert json.loads(envstore.to_json(value)) == value
    entries = [[odd, "f", 0o644, 3, "ab" * 32, 1764990000], ["d", "d", 0o755, 0, "", 0]]
    change = {"tree": "t", "keep": 2, "base": None, "set": entries, "del": [odd]}
    assert treestore.unpack(treestore.pack(change)) == change
    old = __import__("zlib").compress(json.dumps(change).encode("utf-8", "surrogateescape"))
    assert treestore.unpack(old) == change
    marker = json.dumps({"fingerprint": "x", "tree": "ab12", "time": 1.5})
    assert treestore.marker_tree(marker) == "ab12"
    assert treestore.marker_tree('{"tree":"ab12","x":1}') == "ab12"  # another shape: json


def test_the_node_program_starts_without_json_re_shutil_or_hashlib(tmp_path):
    """Their imports (with enum, bz2, lzma) were a third of a node's CPU in a re-sync: the
    node program loads them only for the rare paths that need them (hashlib, whose OpenSSL
    set-up is ~3 ms, once it has said hello to a sync: while the manifest comes)."""
    payload = envstore.program()
    argv = [sys.executable, "-I", "-S", "-X", "importtime", "-c", envstore.BOOT, str(len(payload))]
    proc = subprocess.run(
        [*argv, "data-list", str(tmp_path)], input=payload, capture_output=True, timeout=60
    )
    assert proc.returncode == 0 and json.loads(proc.stdout) == [], proc.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.decode().splitlines()}
    assert imported & {"json", "re", "enum", "shutil", "bz2", "lzma", "hashlib"} == set(), imported


def test_a_node_without_room_says_so_with_the_numbers(here, tmp_path):
    local = tmp_path / "local"
    local.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300m,mode=0700", "tmpfs", str(local)],
                   check=True)  # fmt: skip
    try:
        root = tmp_path / "big"
        root.mkdir()
        (root / "weights.bin").write_bytes(os.urandom(100 * 2**20))
        status = ship_it(here, root, name="big", kind="data")["status"]
        assert "this node has 300 MiB free in" in status, status
        assert "needs 101 MiB more (plus 256 MiB to spare)" in status
        assert not (local / "data").exists()
    finally:
        subprocess.run(["umount", str(local)], check=True)


def test_launch_checks_the_environment_before_running_it(here, tmp_path):
    """The bootstrap, the program and launch() as the relay runs them; a group-writable
    environment is refused before its python runs."""
    root = folder(tmp_path)
    (root / "bin" / "python").write_text('#!/bin/sh\necho RAN "$@"\n')
    assert ship_it(here, root)["status"] == "shipped"
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


def test_an_agent_starting_as_a_sync_removes_its_environment_does_not_run_it(here, tmp_path):
    """The sync's claim (an exclusive lock on the marker) is held across the rename out of
    view, so a launch waiting on its shared lock finds the marker gone and runs nothing."""
    root = folder(tmp_path)
    (root / "bin" / "python").write_text('#!/bin/sh\necho RAN "$@"\n')
    assert ship_it(here, root)["status"] == "shipped"
    envs = tmp_path / "local" / "envs"
    claim = envstore._claim(str(envs / FP))
    assert claim is not None
    cmd, first = sync.launch_command(here.nodes["here"], FP)
    starting = subprocess.Popen(
        ["bash", "-c", cmd], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    starting.stdin.write(first + envstore.program() + b'{"spec": {}}\n')
    starting.stdin.close()
    starting.stdin = None  # communicate() below has nothing more to send
    with pytest.raises(subprocess.TimeoutExpired):
        starting.wait(1.0)  # waits for the sync's claim
    try:
        envstore._discard(str(envs), FP)
    finally:
        os.close(claim)
    out, err = starting.communicate(timeout=30)
    assert starting.returncode == 3 and b"was removed by a sync as it started" in err, err
    assert b"RAN" not in out
    assert envstore._claim(str(envs / FP)) is None  # and nothing of it is in view


def tree_of(root: Path) -> dict:
    """Every path under ``root``: its kind and content (files), target (links)."""
    found = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        if path.is_symlink():
            found[name] = ("l", os.readlink(path))
        elif path.is_dir():
            found[name] = ("d", None)
        elif path.name != envstore.MARKER:
            found[name] = ("f", path.read_bytes())
    return found


def test_a_new_environment_is_made_from_one_no_agent_runs_changing_only_what_differs(
    here, tmp_path
):
    """A sync makes the new environment from an old one in place (the oldest first, so the one
    before the new one stays while it can), never from one an agent runs; with every one in
    use it links the new one afresh beside them."""
    root = folder(tmp_path)
    envs = tmp_path / "local" / "envs"
    made = []
    for i, (fp, running) in enumerate([("a", ""), ("b", ""), ("c", "b"), ("d", ""), ("e", "cd")]):
        (root / "lib" / "pkg" / "data.txt").write_text(f"version {i}")
        (root / "lib" / f"only_in_{i}").mkdir()
        (root / "lib" / f"only_in_{i - 1}").exists() and (
            (root / "lib" / f"only_in_{i - 1}").rmdir())  # fmt: skip
        held = []
        for other in running:  # as launch() holds it for a running agent
            held.append(os.open(envs / (other * 16) / envstore.MARKER, os.O_RDONLY))
            fcntl.flock(held[-1], fcntl.LOCK_SH)
        try:
            assert ship_it(here, root, name=fp * 16)["status"] == "shipped"
        finally:
            for fd in held:
                os.close(fd)
        tidied(tmp_path / "local")
        made.append((envs / (fp * 16)).stat().st_ino)
        assert tree_of(envs / (fp * 16)) == tree_of(root)
        if fp == "b":  # a's data.txt, replaced in place, is collected
            objects = list((tmp_path / "local" / "store" / "objects").rglob("*.*"))
            assert len(objects) == 3  # data.txt, other.txt and python
            assert sorted(p.name for p in envs.iterdir()) == ["b" * 16]
    assert made[1] == made[0]  # b is what was a: the lone one, no agent on it
    assert made[2] not in made[:2]  # c: b runs an agent, so a new folder
    assert made[3] == made[0]  # d is what was b, the older one (c, the one before, stays)
    assert made[4] not in made[:4]  # e: c and d both run agents
    assert sorted(p.name for p in envs.iterdir()) == ["c" * 16, "d" * 16, "e" * 16]


def modes_of(root: Path) -> dict:
    return {str(p.relative_to(root)): p.lstat().st_mode & 0o7777 for p in root.rglob("*")}


def linked(tmp_path: Path, root: Path, store, into: Path) -> list:
    """The entries of ``root`` as a sync scans them, with their objects in ``store``, linked
    at ``into``."""
    tree = ship.scan(ship.folder_pairs(root), private=False, what="test")
    for key, path in tree.sources.items():
        store.put_object(key, [Path(path).read_bytes()])
    store.link_tree(tree.entries, str(into), 0o755)
    return tree.entries


@pytest.mark.fast
def test_a_change_made_in_place_gives_the_tree_a_fresh_link_would(tmp_path):
    """Folders, files and links trading places, a mode and a file changed: the tree changed
    in place by the delta alone is the one linking the new entries afresh makes."""
    from jupyter_lounge import treestore

    root = folder(tmp_path)
    (root / "a").mkdir()
    (root / "a" / "x").write_text("x")
    (root / "b").write_text("b")
    (root / "c").symlink_to("b")
    store = treestore.Store(str(tmp_path / "local"))
    with store:
        old = linked(tmp_path, root, store, tmp_path / "old")
        shutil.rmtree(root / "a")
        (root / "a").write_text("a is a file now")
        (root / "b").unlink()
        (root / "b").symlink_to("a")
        (root / "c").unlink()
        (root / "c" / "d").mkdir(parents=True)
        (root / "c" / "d" / "y").write_text("y")
        (root / "bin" / "python").chmod(0o700)
        (root / "lib" / "pkg" / "data.txt").write_text("changed")
        new = linked(tmp_path, root, store, tmp_path / "fresh")
        change = treestore.delta(old, new)
        assert len(change["set"]) + len(change["del"]) < len(new)  # only what changed
        store.evolve_tree(str(tmp_path / "old"), old, change, str(tmp_path / "evolved"), 0o755,
                          {envstore.MARKER: b"{}"})  # fmt: skip
    assert not (tmp_path / "old").exists()
    assert tree_of(tmp_path / "evolved") == tree_of(tmp_path / "fresh") == tree_of(root)
    assert {k: v for k, v in modes_of(tmp_path / "evolved").items() if k != envstore.MARKER} == (
        modes_of(tmp_path / "fresh")
    )


@pytest.mark.fast
@pytest.mark.parametrize(
    "bad",
    [
        {"set": [["lib/link/evil", "f", 0o644, 1, "0" * 64, 0]], "del": []},  # through a link
        {"set": [], "del": ["lib/pkg"]},  # leaves lib/pkg/*.txt under a folder it removes
        {"set": [["lib/pkg", "l", 0, 0, "/etc", 0]], "del": []},  # a folder made a link
        {"set": [["lib/../../evil", "f", 0o644, 1, "0" * 64, 0]], "del": []},
    ],
)
def test_a_change_that_reaches_outside_its_folders_is_refused_before_anything_moves(tmp_path, bad):
    from jupyter_lounge import treestore

    root = folder(tmp_path)
    store = treestore.Store(str(tmp_path / "local"))
    with store:
        old = linked(tmp_path, root, store, tmp_path / "old")
        before = tree_of(tmp_path / "old")
        with pytest.raises(treestore.StoreError, match="refusing"):
            store.evolve_tree(str(tmp_path / "old"), old, bad, str(tmp_path / "new"), 0o755, {})
    assert tree_of(tmp_path / "old") == before and not (tmp_path / "new").exists()


@pytest.mark.fast
def test_the_environment_is_walked_again_only_when_what_is_installed_changes(
    tmp_path, monkeypatch, lounge_dir
):
    """sync.env_tree reuses the last walk of the virtualenv while its RECORDs and folders are
    unchanged (jupyter_lounge's own source is walked each time); a new package, --force or a
    file found changed after all (forget_parts) walks it again."""
    import sysconfig

    venv = tmp_path / "venv"
    site = venv / "lib" / "python3" / "site-packages"
    (site / "foo-1.dist-info").mkdir(parents=True)
    (site / "foo-1.dist-info" / "RECORD").write_text("foo/__init__.py,sha256=x,1\n")
    (site / "foo").mkdir()
    (site / "foo" / "__init__.py").write_text("FOO = 1\n")
    (venv / "bin").mkdir()
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    source = tmp_path / "src" / "jupyter_lounge"
    source.mkdir(parents=True)
    (source / "__init__.py").write_text("X = 1\n")
    monkeypatch.setattr(sys, "prefix", str(venv))
    paths = {**sysconfig.get_paths(), "purelib": str(site)}
    monkeypatch.setattr(sync.sysconfig, "get_paths", lambda: paths)
    monkeypatch.setattr(sync, "_source_dir", lambda: source)
    walks = []
    scan = ship.scan
    monkeypatch.setattr(ship, "scan", lambda pairs, private, what, **kw: (
        walks.append(what) or scan(pairs, private, what, **kw)))  # fmt: skip

    def names(tree) -> set:
        return {e[0] for e in tree.entries}

    first = sync.env_tree()
    assert walks == ["env", "env-source"]
    assert {"lib/python3/site-packages/foo/__init__.py",
            "lib/python3/site-packages/jupyter_lounge/__init__.py"} <= names(first)  # fmt: skip
    assert sync.env_tree().id == first.id and walks.count("env") == 1
    monkeypatch.setattr(ship, "_PART", {})  # a new process: the part is read from the disk
    again = sync.env_tree()
    assert walks.count("env") == 1 and again.id == first.id
    assert (again.sources, again.sizes, again.mtimes) == (first.sources, first.sizes, first.mtimes)
    (source / "__init__.py").write_text("X = 2\n")  # an edit of our source: a new tree, no walk
    edited = sync.env_tree()
    assert edited.id != first.id and walks.count("env") == 1
    assert sync.env_tree(rescan=True).id == edited.id and walks.count("env") == 2
    (site / "bar-2.dist-info").mkdir()  # pip installs bar
    (site / "bar-2.dist-info" / "RECORD").write_text("bar.py,sha256=y,1\n")
    (site / "bar.py").write_text("BAR = 2\n")
    with_bar = sync.env_tree()
    assert walks.count("env") == 3 and "lib/python3/site-packages/bar.py" in names(with_bar)
    sync.env_tree()
    ship.forget_parts()
    assert sync.env_tree().id == with_bar.id and walks.count("env") == 4


def test_a_node_lacking_a_few_files_gets_them_before_a_slower_node_has_started(here, tmp_path):
    """A node that lacks a few files gets them as soon as it says so, not after every node
    has answered: here the second node starts only once the first has its data set (it
    waits 10 s at most, then fails), so both ship only if the first was not held for it."""
    root = tmp_path / "cells"
    (root / "a").mkdir(parents=True)
    for i in range(5):  # a few hundred bytes: less than the pipe's buffer here holds
        (root / "a" / f"{i}.bin").write_bytes(os.urandom(200))
    quick, late = tmp_path / "quick", tmp_path / "late"
    nodes = [type("Node", (), {"name": n, "local_dir": str(d)})() for n, d in
             (("quick", quick), ("late", late))]  # fmt: skip
    waits = (
        f'for i in $(seq 200); do [ -e {quick}/data/cells ] && exec bash -c "$1"; sleep 0.05; '
        "done; echo 'the quick node never got its data set' >&2; exit 3"
    )

    def ssh_command(name: str) -> list[str]:
        return ["bash", "-c"] if name == "quick" else ["bash", "-c", waits, "late"]

    def scan():
        return ship.scan(ship.folder_pairs(root), private=True, what="test")

    rows = sync.put_tree(nodes, ssh_command, "data", "cells", scan, progress=False)
    assert [rows[n]["status"] for n in ("quick", "late")] == ["shipped", "shipped"], rows
    assert rows["late"]["files"] == 5
    for local in (quick, late):
        tidied(local)
        got = {p.name: p.read_bytes() for p in (local / "data" / "cells" / "a").iterdir()}
        assert got == {p.name: p.read_bytes() for p in (root / "a").iterdir()}


@pytest.mark.fast
def test_nodes_are_heard_as_they_answer_and_a_silent_one_says_what_it_was_waiting_for():
    """ship._in_turn gives each session's next answer as it arrives (a node that answers
    first is not held up by a slow one listed before it); one that says nothing in time gives
    None and its session says what it waited for and how long."""

    def session(name: str, answer: str) -> ship.Session:  # each reads its input to the end
        return ship.Session(name, ["bash", "-c", f"{answer} cat >/dev/null"], b"")

    sessions = {
        "slow": session("slow", """sleep 0.8; echo '{"node": "slow"}';"""),
        "quick": session("quick", """echo '{"node": "quick"}';"""),
        "silent": session("silent", ""),
    }
    waiting = ship.Waiting()
    for name, s in sessions.items():
        waiting.ask(name, s, 3.0, "testing")
    try:
        heard = list(ship._in_turn(waiting))
    finally:
        for s in sessions.values():
            s.close()
    assert heard == [("quick", {"node": "quick"}), ("slow", {"node": "slow"}), ("silent", None)]
    assert sessions["silent"].failed == "no answer within 3 s while testing"
    assert not sessions["quick"].failed and not sessions["slow"].failed
