"""Sync benchmark: seconds and bytes to put a tree on 3 SSH nodes, ours against rsync and tar.

On the testbed's SSH nodes (``set -a; . ./.testbed.env; set +a``: node1..node3 are 10.77.0.11
to .13, sshd as root), every way puts the same tree on all three nodes at once and is timed
from its start until the last node has it. The trees:

* env: this virtualenv (``sys.prefix``, about 2.5 GB in 48k files);
* data: a generated 500 MB folder (50 MB with ``--quick``): small files of 16-64 KB in
  subfolders (2000 of them; 500 with ``--quick``) and 4 large files making up the rest,
  random bytes from a seeded ``random.Random``, made once into a temporary folder.

The ways:

* ours: ``jupyter_lounge.sync.put_tree(nodes, backend.reusing_ssh_command, kind, name,
  build)`` (as ``lounge sync`` and ``lounge stage`` call it: each node's session rides the
  SSH connection kept open to it, made by the first session and open for
  ``c.SSHBackend.persist`` s, 300, after its last) with
  the ssh backend of an inventory made as tests/conftest.py's ``inventory_for_testbed`` makes
  it, except that ``local_dir`` is ``/var/local/lounge-bench``, so that removing the store
  between repetitions does not pull it from under the tests that may be using the testbed's
  ``/var/local/lounge`` at the same time. The env is kind "env" built by
  ``sync.env_tree()`` (as ``lounge sync`` builds it) under a fresh 16-hex-digit name
  each time (so no node answers "present"); the data set is kind "data", name "bench", built
  by ``ship.scan(ship.folder_pairs(root), private=True, what="bench")``. The time includes
  ``build()`` (hashing). Bytes sent: the sum over the nodes of the row's ``wire`` (manifests,
  frame headers and file bytes: all that went into the session but the node program).
  The lounge folder (``JUPYTER_LOUNGE_DIR``) is a temporary one; its ``cache`` (the hashes and
  the remembered manifests) is removed before every first sync, so ours' first sync includes
  hashing every file (a cold hash cache: the honest number; a warm one would be faster), and
  the re-sync finds it warm, as a user's second sync would: ours then trusts the RECORDs
  (which its fingerprint trusts too) and does not list the virtualenv's 48k files again while
  they and the folders holding them are unchanged, where rsync looks at every file
  (``lounge sync --force`` lists and checks them all).
* rsync: ``rsync -a --stats -e "ssh OPTIONS" SRC/ NODE:/var/local/bench-rsync/KIND/``, one
  rsync per node, all started at once (as a user's loop with ``&`` would); OPTIONS are the
  ones the backend's ``ssh_command`` uses (an agent's: a new connection per session, as
  ssh's own default). Bytes sent: the sum of rsync's "Total bytes sent".
* (``--ways``, not run unless named) ours-fresh: ours with a new connection per session
  (``backend.ssh_command``: what ours takes when no connection is kept, persist 0, or after
  it closed); rsync-kept: rsync over the connections ours keeps
  (``backend.reusing_ssh_command``'s options), which shows how much of ours' lead is the
  kept connection rather than the program.
* tar|ssh: ``tar -C SRC -cf - . | ssh OPTIONS NODE 'mkdir -p DEST && tar -C DEST -xf -'``
  per node, all at once, DEST ``/var/local/bench-tar/KIND``. Bytes sent: the sum of the tar
  streams' sizes (``tar --totals``).

The cases, each repeated (``--repeat``, default 3; the table gives the median). The ways take
turns, a different one first in each repetition (run one after another, a way would always
find the disk as the one before it left it), and before each timed sync what earlier runs left
for the kernel to write back to disk is written (``os.sync()``, not timed):

* first sync: the nodes have nothing of the tree (before each repetition what that way put
  on the nodes is removed, from this machine's side: the nodes' /var/local is
  ``$LOUNGE_TESTBED/local/nodeN``);
* one-file re-sync: right after the first sync, one small file changed and the tree synced
  again. The virtualenv itself is never changed: the change is a new file
  ``lib/bench_edit.py`` (a few KB) kept in a small folder EXTRA here; ours ships the pairs of
  ``sync.env_tree([("lib/bench_edit.py", that file)])`` under a new name (the node
  keeps the first tree, so only the manifest's difference and the one file travel); rsync
  syncs ``VENV/ EXTRA/`` (rsync merges its sources) and so sees one new file among 48k;
  tar sends the whole tree again plus EXTRA (it has no delta: that is the point). For the
  data set, one small file is rewritten (new bytes, another size) and every way syncs again.

Note that ours ships the environment as ``lounge sync`` does (an editable jupyter_lounge goes
in as its source, without the hooks that point here), while rsync and tar copy the virtualenv
as it is; the difference is a few files. After each sync the files on every node are
counted and summed (and ours' rows checked: status, files, bytes); what does not match is
printed as a note under the table. Nothing is asserted.

    python bench/sync.py [--repeat 3] [--quick] [--trees env,data] [--ways ours,rsync,tar|ssh]
                         [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import markdown_table

NODES = ("node1", "node2", "node3")
LOCAL_DIR = "/var/local/lounge-bench"  # ours, on each node (its /var/local is ours to use)
RSYNC_DIR = "/var/local/bench-rsync"
TAR_DIR = "/var/local/bench-tar"
EDIT = "lib/bench_edit.py"  # the file the env re-sync adds
WAIT_S = 1800.0  # the most one sync of one way may take
WAYS = ("ours", "rsync", "tar|ssh")
MORE_WAYS = ("ours-fresh", "rsync-kept")  # run when --ways names them
TESTBED_ENV = ("LOUNGE_TESTBED_KEY", "LOUNGE_TESTBED_KNOWN_HOSTS")


def testbed() -> str:
    return os.environ.get("LOUNGE_TESTBED", "/tmp/lounge-testbed")


def host_path(node: str, path: str) -> str:
    """Where this machine sees a node's ``/var/local/...`` path."""
    assert path.startswith("/var/local/")
    return os.path.join(testbed(), "local", node, path[len("/var/local/") :])


def write_inventory(path: str) -> str:
    """The testbed inventory, as tests/conftest.py's ``inventory_for_testbed`` writes it (but
    ours' local_dir: see the module's doc)."""
    text = "".join(
        f'[[node]]\nname = "node{i}"\nhost = "10.77.0.1{i}"\nuser = "root"\n'
        f'key = "{os.environ["LOUNGE_TESTBED_KEY"]}"\npython = "{sys.executable}"\n'
        f'known_hosts = "{os.environ["LOUNGE_TESTBED_KNOWN_HOSTS"]}"\n'
        f'engines = 4\npools = ["gpu"]\nlocal_dir = "{LOCAL_DIR}"\n\n'
        for i in (1, 2, 3)
    )
    with open(path, "w") as f:
        f.write(text)
    return path


# -- the trees ----------------------------------------------------------------------------------
def make_dataset(root: Path, total: int, small: int) -> None:
    """``small`` files of 16-64 KB in folders of 100, and 4 large files making up the rest."""
    rng = random.Random(20240601)
    used = 0
    for i in range(small):
        folder = root / "small" / f"{i // 100:03d}"
        folder.mkdir(parents=True, exist_ok=True)
        size = rng.randint(16 << 10, 64 << 10)
        (folder / f"file{i:05d}.bin").write_bytes(rng.randbytes(size))
        used += size
    (root / "large").mkdir()
    left = max(total - used, 0)
    for i in range(4):
        size = left // 4 + (left % 4 if i == 3 else 0)
        with open(root / "large" / f"big{i}.bin", "wb") as f:
            while size:
                n = min(size, 8 << 20)
                f.write(rng.randbytes(n))
                size -= n


def count_files(root: str, skip: frozenset = frozenset()) -> tuple[int, int]:
    """(regular files, their bytes) under ``root`` (a link to a folder is followed at the top
    only), leaving out the top-level names in ``skip``."""
    files = size = 0
    stack = [os.path.realpath(root)]
    top = stack[0]
    while stack:
        here = stack.pop()
        with os.scandir(here) as it:
            for e in it:
                if here == top and e.name in skip:
                    continue
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                elif e.is_file(follow_symlinks=False):
                    files += 1
                    size += e.stat(follow_symlinks=False).st_size
    return files, size


class Target:
    """A tree to sync: the env (the venv, plus EXTRA for its re-sync) or the data set."""

    def __init__(self, kind: str, src: str, extra: str | None = None):
        self.kind, self.src, self.extra = kind, src, extra
        self.edits = 0
        self.edited = False  # the env: whether EXTRA is part of the tree now

    @property
    def edit_path(self) -> str:
        if self.kind == "env":
            return os.path.join(self.extra, EDIT)
        return os.path.join(self.src, "small", "000", "file00000.bin")

    def sources(self) -> list[str]:
        return [self.src, self.extra] if self.edited and self.extra else [self.src]

    def edit(self) -> None:
        """Change one small file: write EXTRA's file anew (env) or rewrite one of the data
        set's small files, with new bytes and another size each time."""
        self.edits += 1
        data = random.Random(self.edits).randbytes(2048 + 64 * (self.edits % 16))
        if self.kind == "env":
            data = b"# " + data.hex().encode() + b"\n"
        with open(self.edit_path, "wb") as f:
            f.write(data)
        if self.kind == "env":  # EXTRA's lib keeps the venv's lib's mode and times
            shutil.copystat(os.path.join(self.src, "lib"), os.path.dirname(self.edit_path))
        self.edited = True

    def reset(self) -> None:
        self.edited = False

    def expected(self) -> tuple[int, int]:
        files = size = 0
        for src in self.sources():
            n, b = count_files(src)
            files, size = files + n, size + b
        return files, size


# -- the ways -----------------------------------------------------------------------------------
class Way:
    name = ""
    dest = ""  # on the node, a /var/local path: what is removed before each first sync

    def __init__(self, backend, notes: list[str]):
        self.backend, self.notes = backend, notes
        self.nodes = [backend.nodes[n] for n in NODES]

    def clean(self) -> None:
        for node in NODES:
            shutil.rmtree(host_path(node, self.dest), ignore_errors=True)

    def check_counts(self, target: Target, case: str, where: str, expect, skip=frozenset()):
        for node in NODES:
            try:
                got = count_files(host_path(node, where.format(node=node)), skip)
            except OSError as e:
                got = f"{type(e).__name__}: {e}"
            if got != expect:
                self.notes.append(
                    f"{case}, {self.name}: {node} has {got} (files, bytes), expected {expect}"
                )

    def ssh(self, node) -> list[str]:
        return self.backend.ssh_command(node.name)


def wait_all(procs: dict, case: str, way: str, notes: list[str]) -> dict[str, str]:
    """Wait for every node's process (node -> (process, the temporary file its output went
    to)); node -> that output. A failure is noted."""
    errs = {}
    deadline = time.monotonic() + WAIT_S
    for node, (proc, out) in procs.items():
        try:
            proc.wait(max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        out.seek(0)
        errs[node] = out.read().decode(errors="replace")
        out.close()
        if proc.returncode:
            tail = errs[node].strip().splitlines()[-1:] or [""]
            notes.append(f"{case}, {way}: {node} exit code {proc.returncode}: {tail[0][:200]}")
    return errs


class Ours(Way):
    name = "ours"
    dest = LOCAL_DIR
    kept = True  # on the connections kept open to the nodes, as lounge sync and stage are

    def __init__(self, backend, notes, lounge_dir: str):
        super().__init__(backend, notes)
        self.lounge_dir = lounge_dir
        self.build_s: dict[str, list[float]] = {}  # case -> seconds build() took, each run
        self.trees: dict = {}  # kind -> the tree last shipped

    def clean(self) -> None:
        super().clean()
        shutil.rmtree(os.path.join(self.lounge_dir, "cache"), ignore_errors=True)

    def sync(self, target: Target, case: str, first: bool) -> tuple[float, int]:
        from jupyter_lounge import ship, sync

        built = {}
        if target.kind == "env":
            extra = [(EDIT, Path(target.edit_path))] if target.edited else []
            name = secrets.token_hex(8)

            def build():
                t = time.perf_counter()
                built["tree"] = sync.env_tree(extra)
                built["seconds"] = time.perf_counter() - t
                return built["tree"]

            kind = "env"
        else:
            name, kind = "bench", "data"

            def build():
                t = time.perf_counter()
                pairs = ship.folder_pairs(Path(target.src))
                built["tree"] = ship.scan(pairs, private=True, what="bench")
                built["seconds"] = time.perf_counter() - t
                return built["tree"]

        t0 = time.perf_counter()
        ssh = self.backend.reusing_ssh_command if self.kept else self.backend.ssh_command
        rows = sync.put_tree(self.nodes, ssh, kind, name, build, progress=False)
        seconds = time.perf_counter() - t0
        self.build_s.setdefault(case, []).append(built.get("seconds", 0.0))
        tree = built.get("tree")
        if tree is None:
            self.notes.append(f"{case}, ours: build() was not called: {rows}")
            return seconds, sum(r.get("wire", 0) for r in rows.values())
        # what the node lacks: every object of the tree, or those the first sync's tree lacks
        # (the changed file, and any file of an editable jupyter_lounge edited in between)
        last = None if first else self.trees.get(target.kind)
        before = last.sizes if last is not None else {}
        new = {k: n for k, n in tree.sizes.items() if k not in before}
        want = (len(new), sum(new.values()))
        self.trees[target.kind] = tree
        for node, row in rows.items():
            if row["status"] != "shipped" or (row["files"], row["bytes"]) != want:
                self.notes.append(
                    f"{case}, ours: {node}: {row} (expected shipped, files {want[0]}, "
                    f"bytes {want[1]})"
                )
            elif row["wire"] < row["bytes"]:
                self.notes.append(f"{case}, ours: {node}: wire < bytes: {row}")
        expect = (tree.files, tree.bytes)
        if kind == "env":
            where = f"{LOCAL_DIR}/envs/{name}"
            self.check_counts(target, case, where, expect, frozenset({".lounge-env"}))
        else:
            self.check_counts(target, case, f"{LOCAL_DIR}/data/bench", expect)
        return seconds, sum(r["wire"] for r in rows.values())


class OursFresh(Ours):
    name = "ours-fresh"
    kept = False


class Rsync(Way):
    name = "rsync"
    dest = RSYNC_DIR

    def sync(self, target: Target, case: str, first: bool) -> tuple[float, int]:
        for node in NODES:
            os.makedirs(host_path(node, self.dest), exist_ok=True)
        procs = {}
        t0 = time.perf_counter()
        for node in self.nodes:
            cmd = self.ssh(node)
            assert cmd[-2] == "--", cmd
            shell, host = subprocess.list2cmdline(cmd[:-2]), cmd[-1]
            srcs = [s.rstrip("/") + "/" for s in target.sources()]
            argv = ["rsync", "-a", "--stats", "-e", shell, *srcs]
            argv.append(f"{host}:{self.dest}/{target.kind}/")
            out = tempfile.TemporaryFile()
            p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
            procs[node.name] = (p, out)
        outs = wait_all(procs, case, self.name, self.notes)
        seconds = time.perf_counter() - t0
        sent = 0
        for node, out in outs.items():
            m = re.search(r"Total bytes sent: ([\d,.]+)", out)
            if m:
                sent += int(re.sub(r"\D", "", m.group(1)))
            else:
                self.notes.append(f"{case}, rsync: {node}: no 'Total bytes sent' in its output")
        self.check_counts(target, case, f"{self.dest}/{target.kind}", target.expected())
        return seconds, sent


class RsyncKept(Rsync):
    name = "rsync-kept"

    def ssh(self, node) -> list[str]:
        return self.backend.reusing_ssh_command(node.name)


class TarSsh(Way):
    name = "tar|ssh"
    dest = TAR_DIR

    def sync(self, target: Target, case: str, first: bool) -> tuple[float, int]:
        procs, tars = {}, {}
        dest = f"{self.dest}/{target.kind}"
        t0 = time.perf_counter()
        for node in self.nodes:
            argv = ["tar", "--totals", "-cf", "-"]
            for src in target.sources():
                argv += ["-C", src, "."]
            tar_err, ssh_err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
            tar = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=tar_err)
            remote = f"mkdir -p {dest} && tar -C {dest} -xf -"
            ssh = subprocess.Popen([*self.ssh(node), remote], stdin=tar.stdout, stderr=ssh_err)
            tar.stdout.close()  # ssh holds it now: tar sees the pipe close if ssh ends
            tars[node.name] = (tar, tar_err)
            procs[node.name] = (ssh, ssh_err)
        wait_all(procs, case, self.name, self.notes)
        totals = wait_all(tars, case, "tar", self.notes)
        seconds = time.perf_counter() - t0
        sent = 0
        for node, err in totals.items():
            m = re.search(r"Total bytes written: (\d+)", err)
            if m:
                sent += int(m.group(1))
            else:
                self.notes.append(f"{case}, tar: {node}: no total: {err.strip()[-200:]}")
        self.check_counts(target, case, dest, target.expected())
        return seconds, sent


# -- running and reporting ----------------------------------------------------------------------
def ensure_rsync() -> None:
    if shutil.which("rsync"):
        return
    if os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        print("installing rsync (apt-get) ...", file=sys.stderr, flush=True)
        subprocess.run(["apt-get", "update", "-qq"], env=env, check=False)
        subprocess.run(["apt-get", "install", "-y", "-qq", "rsync"], env=env, check=False)
    if not shutil.which("rsync"):
        raise SystemExit("bench/sync.py needs rsync: apt-get install -y rsync")


def measure(ways, targets, args, notes: list[str]) -> list[dict]:
    """For each tree, ``repeat`` times, each way in turn (a different one first each time, so
    none always runs on a machine the others have warmed or loaded): clean the nodes, first
    sync, change one file, re-sync, clean up (only one way's copies are on the nodes at a
    time). What the last run left to write back to disk is written before each timed run."""
    rows = []
    for target in targets:
        report_first = not (args.quick and target.kind == "env")
        runs = {(w.name, c): [] for w in ways for c in ("first sync", "one-file re-sync")}
        for rep in range(args.repeat):
            for way in ways[rep % len(ways) :] + ways[: rep % len(ways)]:
                way.clean()
                target.reset()
                for case, first in (("first sync", True), ("one-file re-sync", False)):
                    label = f"{target.kind} {case}"
                    if not first:
                        target.edit()
                    print(f"{label}, {way.name} ({rep + 1}/{args.repeat}) ...", file=sys.stderr)
                    os.sync()
                    try:
                        seconds, sent = way.sync(target, label, first)
                    except Exception as e:  # noqa: BLE001 - noted, the next goes on
                        notes.append(f"{label}, {way.name}: {type(e).__name__}: {e}"[:400])
                        continue
                    print(f"  {seconds:.1f} s, {sent / 1e6:.1f} MB", file=sys.stderr, flush=True)
                    runs[way.name, case].append((seconds, sent))
                way.clean()
        for (name, case), got in runs.items():
            if case == "first sync" and not report_first:
                continue
            row = {"case": f"{target.kind} {case}", "way": name, "seconds": None}
            if got:
                row["seconds"] = statistics.median(s for s, _ in got)
                row["bytes"] = statistics.median(b for _, b in got)
                row["runs"] = [round(s, 2) for s, _ in got]
            rows.append(row)
    cases = [f"{t.kind} {c}" for t in targets for c in ("first sync", "one-file re-sync")]
    names = [w.name for w in ways]
    return sorted(rows, key=lambda r: (cases.index(r["case"]), names.index(r["way"])))


def megabytes(n: float) -> str:
    mb = n / 1e6
    return f"{mb:,.1f}" if mb >= 10 else f"{mb:.3g}"


def table(rows: list[dict]) -> str:
    head = ["case", "way", "seconds", "MB sent", "time way/ours", "runs"]
    out = []
    for r in rows:
        ours = next(
            (o["seconds"] for o in rows if o["case"] == r["case"] and o["way"] == "ours"), None
        )
        secs = r["seconds"]
        out.append(
            [
                r["case"],
                r["way"],
                "-" if secs is None else f"{secs:.1f}",
                "-" if secs is None else megabytes(r["bytes"]),
                "-" if secs is None or not ours else f"{secs / ours:.2f}",
                " ".join(f"{s:.1f}" for s in r.get("runs", [])),
            ]
        )
    return markdown_table(head, out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--quick", action="store_true", help="a 50 MB data set; of the env, the re-sync only"
    )
    ap.add_argument(
        "--trees", default="env,data", help="which trees to sync: env, data or both (env,data)"
    )
    ap.add_argument(
        "--ways",
        default=",".join(WAYS),
        help=f"which ways, comma-separated, of {', '.join(WAYS + MORE_WAYS)} (ours always runs)",
    )
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    trees = args.trees.split(",")
    if not trees or set(trees) - {"env", "data"}:
        ap.error(f"--trees {args.trees!r}: name env, data or both, comma-separated")
    names = args.ways.split(",")
    if set(names) - set(WAYS + MORE_WAYS):
        ap.error(f"--ways {args.ways!r}: name some of {', '.join(WAYS + MORE_WAYS)}")
    if missing := [v for v in TESTBED_ENV if not os.environ.get(v)]:
        ap.error(f"no SSH testbed here ({', '.join(missing)} unset): set -a; . ./.testbed.env")
    ensure_rsync()
    out = os.path.abspath(args.json) if args.json else None

    tmp = tempfile.mkdtemp(prefix="lounge-sync-bench-")
    os.environ["JUPYTER_LOUNGE_DIR"] = os.path.join(tmp, "lounge")
    notes: list[str] = []
    try:
        from jupyter_lounge.backends import make_backend

        backend = make_backend("ssh", inventory=write_inventory(os.path.join(tmp, "lounge.toml")))
        data = Path(tmp, "data")
        total, small = (50, 500) if args.quick else (500, 2000)
        print(f"making the {total} MB data set ...", file=sys.stderr, flush=True)
        make_dataset(data, total * 10**6, small)
        extra = os.path.join(tmp, "extra")
        os.makedirs(os.path.join(extra, "lib"))
        for src, dst in ((sys.prefix, extra), (os.path.join(sys.prefix, "lib"), f"{extra}/lib")):
            shutil.copystat(src, dst)  # the merged folders keep the venv's modes and times
        targets = [Target("env", sys.prefix, extra), Target("data", str(data))]
        targets = [t for t in targets if t.kind in trees]
        lounge = os.environ["JUPYTER_LOUNGE_DIR"]
        ways = [Ours(backend, notes, lounge)]
        if "ours-fresh" in names:
            ways.append(OursFresh(backend, notes, lounge))
        ways += [way(backend, notes) for way in (Rsync, RsyncKept, TarSsh) if way.name in names]
        try:
            rows = measure(ways, targets, args, notes)
        finally:
            backend.close_connections()  # ours' and rsync-kept's, which would stay open
        for case, took in ways[0].build_s.items():  # how much of ours' time was build()
            for row in rows:
                if (row["case"], row["way"]) == (case, "ours") and row["seconds"] is not None:
                    row["build_seconds"] = statistics.median(took)
                    notes.insert(
                        0,
                        f"{case}, ours: of the {row['seconds']:.1f} s, build() (listing and "
                        f"hashing the files, while the nodes start) took "
                        f"{row['build_seconds']:.1f} s",
                    )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    env_files, env_bytes = count_files(sys.prefix)
    print()
    print(
        f"3 nodes; medians of {args.repeat}; env: {sys.prefix} ({env_files} files, "
        f"{env_bytes / 1e9:.2f} GB); data: {total} MB ({small} small files + 4 large); "
        "MB sent: all 3 nodes together"
    )
    print(table(rows))
    print(
        "The testbed's 3 nodes share this machine's "
        f"{os.cpu_count()} cores and one disk (and its sshd's encryption runs on them too): "
        "this measures our overhead, not a real LAN."
    )
    for note in notes:
        print(f"note: {note}")
    if out:
        with open(out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
