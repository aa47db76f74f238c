"""Pure logic: GPU pinning, the parser's one-sentence errors, state files."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from jupyter_lounge import commands, state
from jupyter_lounge.errors import LoungeError
from jupyter_lounge.node import gpu_for


def test_gpu_round_robin():
    gpus = ["0", "1"]
    assert [gpu_for(i, gpus, 2) for i in range(6)] == ["0", "1", "0", "1", "", ""]
    assert [gpu_for(i, gpus, 0) for i in range(3)] == ["0", "1", "0"]  # 0: no cap
    assert gpu_for(0, [], 1) is None


@pytest.mark.parametrize(
    "line, expected",
    [
        ("", "Say what to do"),
        ("launch 3", "Unknown command 'launch'"),
        ("start", "Say how many engines"),
        ("start 0", "The number of engines must be a whole number above 0, not 0"),
        ("start -3", "above 0"),
        ("start x", "The number of engines must be a whole number above 0, not 'x'"),
        ("start 3 --frobnicate", "Unknown option --frobnicate"),
        ("start 3 --timeout 0", "--timeout must be a number of seconds above 0, not 0"),
        ("start 3 --nodes none", "--nodes must be a whole number above 0"),
        ("scale zero", "The number of engines must be a whole number"),
    ],
)
def test_bad_input_is_one_sentence(line, expected):
    with pytest.raises(LoungeError) as info:
        commands.parse(line.split())
    message = str(info.value)
    assert expected in message
    assert "\n" not in message and "Traceback" not in message


def test_start_options_reach_the_cluster():
    args = commands.parse("start 4 --engines dask --nodes 2 --preload numpy,scipy --wait".split())
    opts = commands.start_options(args)
    assert args.n == 4
    assert opts["engines"] == "dask" and opts["nodes"] == 2 and opts["wait"] is True
    assert opts["preload"] == "numpy,scipy"


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({"engines": "spark"}, "Unknown engine kind 'spark'"),
        ({"backend": "kubernetes"}, "Unknown backend 'kubernetes'"),
        ({"name": "bad name!"}, "Cluster name 'bad name!' is not valid"),
    ],
)
def test_cluster_rejects_bad_arguments(kwargs, expected):
    from jupyter_lounge import Lounge

    with pytest.raises(LoungeError, match=expected):
        Lounge(2, **kwargs)


@pytest.mark.parametrize("n", [0, -1, 2.5, "3", True])
def test_cluster_rejects_bad_counts(n):
    from jupyter_lounge import Lounge

    with pytest.raises(LoungeError, match="whole number above 0"):
        Lounge(n)


def test_state_files_are_private_and_atomic(lounge_dir):
    state.save_state("alpha", {"name": "alpha", "created": 1.0, "x": 1})
    path = state.state_path("alpha")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(state.cluster_dir("alpha")).st_mode) == 0o700
    assert [d["name"] for d in state.list_states()] == ["alpha"]
    state.save_state("alpha", {"name": "alpha", "created": 1.0, "x": 2})
    assert state.load_state("alpha")["x"] == 2
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    state.remove_state("alpha")
    assert state.load_state("alpha") is None and state.list_states() == []


def test_table_formatting():
    text = commands.format_table([{"a": 1, "b": None}, {"a": "long", "b": "x"}], ["a", "b"])
    assert text.splitlines() == ["a     b", "1", "long  x"]


def test_sync_words_and_remote_paths():
    from jupyter_lounge import commands
    from jupyter_lounge.sync import env_dir, remote_path

    args = commands.parse(["start", "8", "--backend", "ssh", "--pool", "gpu", "--sync"])
    assert commands.start_options(args)["sync"] is True
    assert "sync" not in commands.start_options(commands.parse(["start", "8"]))
    assert commands.parse(["sync", "--pool", "gpu", "--force"]).force is True
    assert remote_path("~/.cache/x y") == "\"$HOME\"'/.cache/x y'"
    assert remote_path("/var/local/lounge") == "/var/local/lounge"
    assert env_dir("/var/local/lounge/", "ab12") == "/var/local/lounge/envs/ab12"


@pytest.mark.parametrize("node", ["vm", "node-01", "gpu_3", "pc7.lounge", "a-2d_b", "Ä", "節点"])
def test_engine_identities_are_python_name_parts_and_give_node_and_rank_back(node):
    from jupyter_lounge.engines.base import engine_ident, engine_name, parse_engine_name

    ident = engine_ident(node, 12, "ab12cd34")
    # ipyparallel makes Python names of message ids holding it, after turning - into _
    assert f"_x_{ident}_f".replace("-", "_").isidentifier(), ident
    assert parse_engine_name(ident) == (node, 12)
    assert parse_engine_name(engine_name(node, 3)) == (node, 3)  # Dask's worker names
    assert parse_engine_name("not-an-engine") is None


def test_doctor_runs_tensorflow_in_an_engine_forked_as_the_agent_forks_them():
    from jupyter_lounge.doctor import _tensorflow_row

    done = subprocess.run(
        [sys.executable, "-m", "jupyter_lounge.doctor"],
        capture_output=True,
        text=True,
        timeout=180,
        env=os.environ | {"CUDA_VISIBLE_DEVICES": ""},  # the GPUs Slurm granted: none
    )
    said = json.loads(done.stdout)
    assert said["fork"] is None and said["gpus"] == [] and said["op"] is True
    version = said["version"]
    assert _tensorflow_row(said, gpus=0) == (
        True,
        f"TensorFlow {version} in a forked engine sees 0 GPU(s) and ran an op on /CPU:0",
    )
    ok, detail = _tensorflow_row(said, gpus=2)  # the inventory promised two
    assert not ok and detail.endswith(
        "pip install tensorflow[and-cuda]) in the environment and sync it"
    )
    ok, detail = _tensorflow_row(said | {"fork": "threads ['loader'] are running"}, gpus=0)
    assert not ok and "cannot be: threads ['loader'] are running after import tensorflow" in detail


_ABC_CACHES = """
import _abc, collections.abc, sys
import traitlets.config  # noqa: F401 - more subclasses of Mapping, as an agent has
from jupyter_lounge import node

def caches():
    seen, todo = {}, [collections.abc.Mapping, collections.abc.Sequence]
    while todo:
        cls = todo.pop()
        if cls not in seen and hasattr(cls, "_abc_impl"):
            seen[cls] = {r() for part in _abc._get_dump(cls)[:3] for r in part}
            todo += type.__subclasses__(cls)
    return seen

if sys.argv[1] == "warm":
    node._warm_abc_caches()
before = caches()
isinstance((), collections.abc.Mapping), isinstance("", collections.abc.Mapping)
isinstance(None, collections.abc.Sequence)
print(sum(len(caches()[c] - before[c]) for c in before))
"""


@pytest.mark.fast
def test_the_agent_asks_the_common_abc_questions_before_it_forks():
    """Asking whether () is a Mapping walks every subclass of Mapping and writes each one's
    cache: in a forked engine, pages of the agent copied into every engine. After the
    agent's _warm_abc_caches, the questions an engine asks first change no cache."""
    out = {}
    for how in ("cold", "warm"):
        run = [sys.executable, "-c", _ABC_CACHES, how]
        got = subprocess.run(run, capture_output=True, text=True, timeout=120)
        assert got.returncode == 0, got.stderr
        out[how] = int(got.stdout)
    assert out["cold"] > 10 and out["warm"] == 0, out


_HOLES = """
import ctypes, json, os, resource, sys
from jupyter_lounge import node

libc = ctypes.CDLL(None)
malloc, free, memset = libc.malloc, libc.free, ctypes.memset
malloc.restype, malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
free.argtypes = [ctypes.c_void_p]
pairs = [(malloc(200), malloc(3880)) for _ in range(5000)]  # about a page each
for small, _ in pairs:
    free(small)  # a hole on every page, too big for the fastbins
got = node._take_up_malloc_holes() if sys.argv[1] == "taken" else {}
r, w = os.pipe()
pid = os.fork()
if pid == 0:  # an engine: its allocations, and the pages of the parent they copy
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5000):
        memset(malloc(200), 1, 200)
    os.write(w, str(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before).encode())
    os._exit(0)
os.close(w)
faults = int(os.read(r, 100))
os.waitpid(pid, 0)
print(json.dumps({"faults": faults, **got}))
"""


@pytest.mark.fast
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heap")
def test_the_agent_takes_up_the_holes_in_its_c_heap_before_it_forks():
    """A forked engine's malloc served from a hole of the agent's heap copies the page the
    hole is on. With a hole on each of 5,000 pages, a child's 5,000 small allocations copy
    about 5,000 pages; after _take_up_malloc_holes they come from fresh pages (1 MB)."""
    out = {}
    for how in ("cold", "taken"):
        run = [sys.executable, "-c", _HOLES, how]
        got = subprocess.run(run, capture_output=True, text=True, timeout=120)
        assert got.returncode == 0, got.stderr
        out[how] = json.loads(got.stdout)
    assert out["cold"]["faults"] > 4000, out  # the holes were used
    assert out["taken"]["faults"] < 600, out  # about 250 fresh pages, and Python's own
    assert out["taken"]["taken"] >= 5000 * 200 and out["taken"]["free_after"] < 2**20, out


_YOUNG_ONLY = """
import gc, json, sys
from jupyter_lounge import node
stock = gc.get_threshold()
if sys.argv[1] == "young only":
    thresholds = node._young_collections_only()
before = [s["collections"] for s in gc.get_stats()]
kept = [[i] for i in range(2_000_000)]  # as an import makes objects that stay
after = [s["collections"] for s in gc.get_stats()]
if sys.argv[1] == "young only":
    gc.set_threshold(*thresholds)
print(json.dumps({"young": after[0] - before[0], "full": after[2] - before[2],
                  "restored": gc.get_threshold() == stock}))
"""


@pytest.mark.fast
def test_the_agent_imports_with_no_full_collection_and_gives_engines_the_stock_collector():
    """While the agent imports, the young generations are still collected but never the
    whole heap (each full collection walks every object made so far: ~0.9 s of importing
    TensorFlow); afterwards the thresholds are what they were."""
    out = {}
    for how in ("stock", "young only"):
        got = subprocess.run(
            [sys.executable, "-c", _YOUNG_ONLY, how], capture_output=True, text=True, timeout=120
        )
        assert got.returncode == 0, got.stderr
        out[how] = json.loads(got.stdout)
    assert out["stock"]["full"] >= 1, out  # what is avoided happens without it
    assert out["young only"]["full"] == 0 and out["young only"]["young"] > 1000, out
    assert out["young only"]["restored"], out


_MADE_SHELL = """
import atexit, builtins, json, os, sys, threading
from jupyter_lounge.engines import ipyparallel as ipp

at_exit = []  # the calls registered to run at exit, and not unregistered
register, unregister = atexit.register, atexit.unregister
atexit.register = lambda f, *a, **k: (at_exit.append(f.__qualname__), register(f, *a, **k))[1]
atexit.unregister = lambda f: (at_exit.remove(f.__qualname__), unregister(f))[1]

def state():
    return {
        "ipython": "__IPYTHON__" in builtins.__dict__, "pager": os.environ.get("PAGER"),
        "ps1": getattr(sys, "ps1", None), "main": sys.modules["__main__"].__name__,
        "main_is_the_shells": ipp._made is not None
        and sys.modules["__main__"] is ipp._made.shell.user_module,
        "atexit": "InteractiveShell.atexit_operations" in at_exit,
        "threads": threading.active_count(),
    }

ipp.IPyParallelEngines().agent_imports()  # as an agent does first (some register at exit)
agent = [state()]
ipp._make_shell()
agent.append(state())
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    ipp._made.take_up()
    from ipykernel.zmqshell import ZMQInteractiveShell
    engine = state() | {"instance": ZMQInteractiveShell.instance() is ipp._made.shell}
    os.write(w, json.dumps(engine).encode())
    os._exit(0)
os.close(w)
engine = json.loads(os.read(r, 10000))
os.waitpid(pid, 0)
print(json.dumps({"agent": agent, "engine": engine}))
"""


@pytest.mark.fast
def test_the_agent_makes_the_engines_ipython_shell_and_takes_back_what_it_set_for_itself():
    """An ipyparallel engine's kernel made its IPython shell in every engine (~9 ms of CPU
    and ~4 MiB of pages each): the agent makes it once before it forks. What making it sets
    for the whole process (``__IPYTHON__`` and ``display`` in builtins, PAGER=cat and the
    like, sys.ps1, ``__main__``, an atexit call) the agent takes back, and a forked engine
    sets again, where the kernel's ``instance()`` finds that shell."""
    run = [sys.executable, "-c", _MADE_SHELL]
    env = {k: v for k, v in os.environ.items() if k != "PAGER"}
    got = subprocess.run(run, capture_output=True, text=True, timeout=120, env=env)
    assert got.returncode == 0, got.stderr
    said = json.loads(got.stdout)
    before, after = said["agent"]
    assert before == after | {"main_is_the_shells": False}, said  # the agent's own again
    assert not after["ipython"] and after["pager"] is None and after["ps1"] is None, said
    assert not after["atexit"], said
    assert after["threads"] == 1, said  # nothing started that a fork would lose
    assert said["engine"] == {
        "ipython": True,
        "pager": "cat",
        "ps1": "In : ",
        "main": "__main__",
        "main_is_the_shells": True,
        "atexit": True,
        "threads": 1,
        "instance": True,
    }, said


_WORKER_VERSIONS = """
import importlib.metadata, sys
from distributed import versions
from jupyter_lounge.engines.dask import DaskEngines

if sys.argv[1] == "agent":
    DaskEngines().agent_imports()
def looked_up(name):  # an engine forked from here reading a package's metadata from disk
    raise SystemExit(f"{name}'s version was looked up after the agent's imports")
versions.version = looked_up
print(versions.get_versions()["packages"]["distributed"])
"""


@pytest.mark.fast
def test_the_agent_reads_the_package_versions_a_dask_worker_registers_with_before_it_forks():
    """A Dask worker sends the scheduler nine packages' versions as it registers, each read
    from that package's metadata on disk unless the process has it cached: the agent reads
    them once, so a worker forked from it reads none."""
    import distributed

    out = {}
    for how in ("bare", "agent"):
        run = [sys.executable, "-c", _WORKER_VERSIONS, how]
        got = subprocess.run(run, capture_output=True, text=True, timeout=120)
        out[how] = (got.returncode, got.stdout.strip(), got.stderr.strip()[-200:])
    assert out["agent"] == (0, distributed.__version__, ""), out
    assert out["bare"][0] != 0 and "looked up after the agent's imports" in out["bare"][2], out


def _versions(packages: dict | None) -> dict | None:
    return None if packages is None else {"host": {"python": "3"}, "packages": packages}


@pytest.mark.fast
def test_the_schedulers_version_check_sees_each_kind_of_worker_once_and_says_what_dask_says():
    """The scheduler's version warning for a registering worker is Dask's own, word for word,
    whatever the workers' versions are; the check is given one worker of each distinct kind,
    not every worker (it walked them all for every registration: O(N^2) for a cluster)."""
    from distributed import versions

    from jupyter_lounge.engines.dask_scheduler import versions_checked_once_per_kind

    seen = []

    def stock(scheduler, workers, source, source_name="Client"):
        seen.append(len(workers))
        return versions.error_message(scheduler, workers, source, source_name=source_name)

    checked = versions_checked_once_per_kind(stock)
    same = {"dask": "1", "distributed": "1", "tornado": "6"}
    scheduler = _versions(same)
    workers: dict = {}
    for i in range(300):  # a cluster starting: one worker registers after another
        workers[f"w{i}"] = source = _versions(dict(same))
        got = checked(scheduler, workers, source, source_name=f"w{i}")
        assert got == versions.error_message(scheduler, workers, source, f"w{i}")
    assert got == {"warning": "", "error": ""} and max(seen) == 1, (got, seen[-3:])
    # other kinds come and go: a worker with another Dask, one that sent none, one with a
    # package missing; each time the answer is Dask's, from one worker of each kind
    odd = {
        "w300": _versions(same | {"dask": "2"}),
        "w301": None,
        "w302": _versions({"dask": "1", "distributed": "1"}),
    }
    for name, source in odd.items():
        workers[name] = source
        got = checked(scheduler, workers, source, source_name=name)
        assert got == versions.error_message(scheduler, workers, source, name), name
        assert seen[-1] == len({str(v and v["packages"]) for v in workers.values()})
    assert "Mismatched versions found" in got["warning"] and "dask" in got["warning"]
    for name in odd:
        del workers[name]
    for i in range(300):  # the odd ones left long ago: forgotten
        del workers[f"w{i}"]
        workers[f"v{i}"] = source = _versions(dict(same))
        got = checked(scheduler, workers, source, source_name=f"v{i}")
    assert (
        got
        == versions.error_message(scheduler, workers, source, "v299")
        == {
            "warning": "",
            "error": "",
        }
    )
    assert seen[-1] == 1
