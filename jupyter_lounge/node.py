"""The node agent: one per node. Import the preload set once, then fork the engines.

``python -m jupyter_lounge.node SPEC.json`` (or ``--stdio`` over SSH). It speaks the agent
protocol (``protocol.py``) through a link: the spec (so no connection info is ever on a command
line) says which engines to run; each control says which ranks are wanted and whether to stop;
the agent publishes a report: its status and each engine's pid and state.

Forked children inherit every imported module by copy-on-write, so no engine pays for
``import tensorflow``. That is only safe while this process has no extra thread and no ZMQ
context, so the agent never creates either, and checks before every fork.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import select
import signal
import socket
import sys
import time
import traceback

from .engines import engine_kind
from .protocol import Control, FileLink, Report, StdioLink, read_json, write_json

POLL_S = 0.2
PROBE_EVERY_S = 2.0
PROBE_MISSES = 3
STOP_GRACE_S = 5.0
MAX_RESTARTS = 5  # crashes of one rank before it is left down
SERVICE_WAIT_S = 30.0
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


def gpu_for(local_index: int, gpus: list[str], engines_per_gpu: int) -> str | None:
    """CUDA_VISIBLE_DEVICES for the engine with this index on its node, round-robin.

    None when the node has no GPUs (leave the variable alone); "" for an engine beyond
    ``len(gpus) * engines_per_gpu`` (it runs on the CPU rather than oversubscribing a GPU).
    """
    if not gpus:
        return None
    if engines_per_gpu > 0 and local_index >= len(gpus) * engines_per_gpu:
        return ""
    return str(gpus[local_index % len(gpus)])


def detect_gpus() -> list[str]:
    """This node's GPUs: those Slurm (or the user) granted in CUDA_VISIBLE_DEVICES, else
    every GPU nvidia-smi lists, else none."""
    granted = os.environ.get("CUDA_VISIBLE_DEVICES")
    if granted is not None:
        return [g for g in granted.split(",") if g.strip()]
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip().isdigit()]


def fork_safety_problem(thorough: bool = True) -> str | None:
    """Why forking now would be unsafe (a thread or a ZMQ context exists), or None.

    ``thorough`` also scans every object for a ZMQ context (slow with TensorFlow loaded):
    done once before the first fork (and only then: it touches every module's globals, so
    after a fork each page it touches is copied, see NodeAgent.check_fork_safety); later forks
    check threads and the global context.
    """
    import threading

    others = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if others:
        return f"threads {others} are running"
    zmq = sys.modules.get("zmq")
    if zmq is not None:
        if getattr(zmq.Context, "_instance", None) is not None:
            return "a ZMQ context exists"
        if thorough and _find_instance(zmq.Context):
            return "a ZMQ context exists"
    return None


def _find_instance(cls: type) -> bool:
    """Is there an instance of ``cls`` among GC-tracked objects or module globals? (A ZMQ
    context is not GC-tracked, so the usual place, a module global, is searched too.)"""
    if any(isinstance(o, cls) for o in gc.get_objects()):
        return True
    for module in list(sys.modules.values()):
        try:
            values = list(vars(module).values())
        except TypeError:
            continue
        if any(isinstance(v, cls) for v in values):
            return True
    return False


def _set_parent_death_signal() -> None:
    """Ask Linux to SIGKILL this child when the agent dies, even by SIGKILL."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def own_mib() -> int:
    """This process's resident memory in MiB (Linux)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // 2**20
    except (OSError, ValueError, IndexError):
        return 0


#: The oldest generation's threshold while the agent imports: higher than it will ever reach.
NO_FULL_COLLECTIONS = 2**30


def _young_collections_only() -> tuple[int, int, int]:
    """*agent*, before it imports the preload: the garbage collector keeps collecting the
    young generations but no longer the whole heap, and the thresholds it had are returned
    (``gc.set_threshold(*them)`` sets them back). Each full collection while TensorFlow is
    imported walks every object made so far: 8 of them, about 0.9 s of the ~4.3 s import
    here, on the path of every launch. Only 34 objects were still garbage at the end, which
    gc.freeze then keeps with the rest, where a full collection first cost 0.22 s more (and
    freed holes that engines then fill, copying the pages: Python's gc.freeze docs ask for no
    collection in a parent that forks)."""
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], thresholds[1], NO_FULL_COLLECTIONS)
    return thresholds


def _warm_abc_caches() -> None:
    """Ask, in the agent, what each engine would otherwise ask first: whether a common
    type is a Mapping, a Sequence, an Awaitable, ... The first time, each such question
    walks every subclass of that ABC the agent imported (TensorFlow's too) and writes the
    answer into each one's cache; asked in each engine, those writes copied about a
    megabyte of the agent's pages into it (``os.environ.update(**names)`` alone asked
    whether () is a Mapping: 1.3 MiB). Asked here once (about 4 ms), the engines read the
    answers."""
    import collections.abc as abcs
    import types

    kinds = [abcs.Mapping, abcs.MutableMapping, abcs.Sequence, abcs.MutableSequence]
    kinds += [abcs.Set, abcs.MutableSet, abcs.Awaitable, abcs.Coroutine, abcs.Iterable]
    kinds += [abcs.Iterator, abcs.Callable, abcs.Collection, abcs.Container, abcs.Sized]
    kinds += [abcs.Hashable, abcs.Generator]
    common = [str, bytes, bytearray, int, float, bool, complex, list, tuple, dict, set]
    common += [frozenset, type(None), types.CoroutineType, types.FunctionType, type, range]
    for kind in kinds:
        for t in common:
            issubclass(t, kind)


def _take_up_malloc_holes(limit: int = 200_000) -> dict:
    """Take up the holes in the C heap (glibc's main arena) before the first fork, so that
    an engine's C allocations come from fresh pages of its own, not from holes spread over
    pages it shares with the agent.

    Importing TensorFlow and making the engine application leave about 2 MB free in holes of
    the agent's heap. In a forked engine, a malloc served from a hole writes its header and
    its neighbours' on a page of the agent, and copy-on-write copies that page: TensorFlow's
    first op in an ipyparallel engine copied about 1,300 heap pages of the agent (5 MiB),
    where its allocations fill a few hundred fresh ones. ``malloc_trim(0)`` first merges the
    small free chunks and gives the pages inside the big ones back (so what follows writes
    only the chunks' headers); then each size is allocated until malloc serves it from the
    top of the heap. Those blocks are never freed (the agent already had their pages). At
    most the free bytes mallinfo2 counted (and a MiB), and ``limit`` calls, are taken. Where
    the C library is not glibc 2.33 or later, nothing is done and {} comes back."""
    import ctypes

    if not sys.platform.startswith("linux"):
        return {}
    try:
        libc = ctypes.CDLL(None)
        mallinfo2, malloc, free = libc.mallinfo2, libc.malloc, libc.free
        sbrk, trim = libc.sbrk, libc.malloc_trim
    except (OSError, AttributeError):
        return {}

    class MallInfo2(ctypes.Structure):
        _fields_ = [
            (name, ctypes.c_size_t)
            for name in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks"
            " keepcost".split()
        ]

    mallinfo2.restype, mallinfo2.argtypes = MallInfo2, []
    malloc.restype, malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    free.restype, free.argtypes = None, [ctypes.c_void_p]
    sbrk.restype, sbrk.argtypes = ctypes.c_void_p, [ctypes.c_ssize_t]
    trim.restype, trim.argtypes = ctypes.c_int, [ctypes.c_size_t]
    trim(0)
    before = mallinfo2()
    # free bytes outside the top chunk (all arenas'; what the tcache holds is not counted):
    # a bound, should the top be misread, on what is taken from it
    budget = before.fordblks - before.keepcost + 2**20
    taken = calls = 0
    # big holes by halves, then every small size: malloc takes a small block only from a
    # hole of its own size class (tcache, fastbins) or splits a bigger one
    for size in [1 << k for k in range(16, 10, -1)] + list(range(1024, 0, -16)):
        info = mallinfo2()
        top = (sbrk(0) or 0) - info.keepcost - 64  # the top chunk: where the holes end
        while taken + size <= budget and calls < limit:
            block = malloc(size)
            calls += 1
            if not block or block >= top:
                free(block)  # from the top (or mmap): no hole of this size is left
                break
            taken += size + 16  # a chunk's header and rounding, at most
    after = mallinfo2()
    return {"taken": taken, "free_after": after.fordblks - after.keepcost}


def _reseed(rank: int) -> None:
    """Fork copies numpy's global random state: give every engine its own."""
    seed = int.from_bytes(os.urandom(4), "little") ^ rank
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(seed)


class NodeAgent:
    def __init__(self, link: FileLink | StdioLink, carried: dict | None = None):
        """``carried``: the state this agent had before it executed itself anew (``rest``)."""
        self.link = link
        self.spec = s = link.spec()
        self.node = s.node or socket.gethostname().split(".")[0]
        self.gpus = detect_gpus() if s.gpus is None else [str(g) for g in s.gpus]
        self.kind = engine_kind(s.engine_kind)
        self.children: dict[int, int] = {}  # pid -> rank
        self.engines: dict[str, dict] = {}  # str(rank) -> {pid, state, restarts, index}
        self.wanted: list[int] = []  # the ranks the last control asked for
        self.size = 0  # the cluster's engine count, as the last control said
        self.forking = False  # engines are forked once the controller is there
        self.retired: set[int] = set()  # ranks whose engine was shut down on purpose
        self.service_pid: int | None = None  # the engine kind's per-node service (nanny)
        self.checked = False  # fork_safety_problem(thorough=True) passed in this process
        self._interrupt = None  # the last interrupt token of the control file
        self.stopping = False
        self.status = "starting"
        self._reported = time.monotonic()  # when the last report went (report())
        self.error: str | None = None
        self._next_index = 0
        self.timings: list[tuple[str, float]] = []  # seconds per launch phase, in order
        self.telemetry = None  # the last sample of this machine
        self.courtesy = None  # Courtesy when the spec asks to yield the machine to people
        self.evicted = False  # engines stopped because a person uses this machine
        self._evicted_at = 0.0
        self.lean = False  # nothing imported but what watching needs: a person uses the PC
        self.data: dict[str, str] = {}  # data set name -> its folder on this node's disk
        self.resumed = carried is not None
        self._carried_courtesy = None
        self._t0 = time.monotonic()
        if carried is not None:
            self._take_over(carried)

    def _lap(self, phase: str) -> None:
        if self.resumed:  # the launch's timings stay what the first start measured
            return
        now = time.monotonic()
        self.timings.append((phase, round(now - self._t0, 3)))
        self._t0 = now

    # -- resting: the PC gets its memory back while a person uses it -------------------------
    def rest(self, lean: bool) -> None:
        """Execute this agent anew, keeping its pid, its link and what it knows: ``lean`` while
        a person uses the machine (nothing imported but what watching needs, so the preload's
        and the engine kind's memory goes back to the PC), full again once the machine is idle
        (the preload is imported anew, then the engines fork)."""
        self.stop_service()
        # A stop that comes from here on waits, blocked, for the new agent's handlers (run()
        # unblocks); one that came before is done here.
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        if self.stopping:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
            self.shutdown()
        courtesy = self.courtesy
        carried = {
            "link": self.link.carry(),
            "lean": lean,
            "evicted": lean,
            "engines": self.engines,
            "wanted": self.wanted,
            "size": self.size,
            "retired": sorted(self.retired),
            "next_index": self._next_index,
            "interrupt": self._interrupt,
            "timings": self.timings,
            "courtesy": None if courtesy is None else courtesy.carry(),
        }
        path = self.spec.report_file + ".carried"
        write_json(path, carried)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, "-m", "jupyter_lounge.node", "--resume", path])

    def _take_over(self, carried: dict) -> None:
        self.lean, self.evicted = carried["lean"], carried["evicted"]
        self.engines, self.wanted = carried["engines"], carried["wanted"]
        self.size = carried["size"]
        self.retired = set(carried["retired"])
        self._next_index, self._interrupt = carried["next_index"], carried["interrupt"]
        self.timings = carried["timings"]
        self._carried_courtesy = carried["courtesy"]
        if self.lean:
            self.status = "in use"

    # -- reporting ---------------------------------------------------------------------------
    def report(self) -> None:
        self._reported = time.monotonic()
        courtesy = self.courtesy
        self.link.publish(
            Report(
                node=self.node,
                host=socket.gethostname(),
                pid=os.getpid(),
                status=self.status,
                error=self.error,
                engines=self.engines,
                time=time.time(),
                timings=[list(t) for t in self.timings],
                telemetry=self.telemetry,
                courtesy=None
                if courtesy is None
                else {"state": courtesy.state, "reason": courtesy.reason},
            )
        )

    def _report_if_due(self) -> None:
        """Report again when the last one is PROBE_EVERY_S old: in a long phase of the start
        too, a silent agent is a lost one to whoever reads its reports (Slurm's backend)."""
        if time.monotonic() - self._reported >= PROBE_EVERY_S:
            self.report()

    def fail(self, message: str, code: int = 3) -> None:
        self.status, self.error = "failed", message
        print(f"node agent {self.node}: {message}", file=sys.stderr, flush=True)
        self.report()
        self.stop_children()
        self.link.cleanup()
        sys.exit(code)

    def _poll(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the link; act on a new control. True when one came."""
        control = self.link.poll(timeout)
        if control is not None:
            self.apply_control(control)
        if self.link.closed and not self.stopping:
            self.error = "the SSH session to this node ended; engines taken down"
            self.stopping = True
        return control is not None

    # -- startup -----------------------------------------------------------------------------
    def preload(self) -> None:
        self.status = "preloading"
        self.report()
        self._lap("start")
        for module in self.spec.preload:
            try:
                importlib.import_module(module)
                self._lap(f"import {module}")
            except BaseException as e:  # noqa: BLE001 - any import failure is the user's to see
                self.fail(
                    f"preload module {module!r} failed to import on node {self.node!r}: "
                    f"{type(e).__name__}: {e}"
                )
        try:
            self.kind.agent_imports()
        except BaseException as e:  # noqa: BLE001
            self.fail(
                f"engine kind {self.kind.name!r} cannot be imported on node "
                f"{self.node!r}: {type(e).__name__}: {e}"
            )
        self._lap("engine_imports")

    def stage_data(self) -> None:
        """The spec's data sets: as they are (local), or copied to this node's scratch from
        the shared file system before any engine forks (Slurm; treestore.stage_copy)."""
        self.data = dict(self.spec.data)
        if not self.spec.stage:
            return
        from .treestore import StoreError, scratch_root, stage_copy, unpack
        from .trust import UntrustedPath

        self.status = "staging"
        self.report()
        root = scratch_root(self.spec.scratch)
        for item in self.spec.stage:
            try:
                with open(item["manifest"], "rb") as f:
                    manifest = unpack(f.read())
                self.data[item["name"]] = stage_copy(
                    root, item["name"], manifest["tree"], manifest["entries"], item["source"]
                )
            except (StoreError, UntrustedPath, OSError, ValueError) as e:
                self.fail(
                    f"data set {item['name']!r} could not be staged on node {self.node!r}: {e}"
                )
        self._lap("stage")

    def _data_env(self) -> dict[str, str]:
        """LOUNGE_DATA_<NAME> for every data set this node has for the engines: the spec's,
        and (lounge nodes) those `lounge stage` put in local_dir, whenever it did."""
        from .stage import env_var
        from .treestore import data_links

        found = dict(self.data)
        if self.spec.local_dir:
            found |= data_links(os.path.expanduser(self.spec.local_dir))
        return {env_var(name): path for name, path in found.items()}

    def wait_for_controller(self) -> None:
        if not self.resumed:  # a resumed agent's controller is there: no status to flicker
            self.status = "waiting-controller"
            self.report()
        path = self.spec.connection_file
        deadline = time.monotonic() + self.spec.connect_timeout
        while not os.path.exists(path) or read_json(path) is None:
            if self.stopping:
                self.shutdown()
            if time.monotonic() > deadline:
                self.fail(f"timed out waiting for the controller's connection file {path}")
            self._poll(0.05)
            self._report_if_due()
        self.connection = read_json(path)
        self.probe_addr = self.kind.probe_address(self.connection)

    def start_service(self) -> None:
        """Fork the engine kind's per-node service (ipyparallel's nanny) and wait for the
        line that tells the engines where it is."""
        if not self.kind.has_node_service:
            return
        options = self.spec.engine_options
        read_fd, write_fd = os.pipe()
        pid = self._fork_child(lambda: self.kind.serve_node(self.connection, options, write_fd))
        os.close(write_fd)
        line, deadline = b"", time.monotonic() + SERVICE_WAIT_S
        while not line.endswith(b"\n") and time.monotonic() < deadline:
            if select.select([read_fd], [], [], 0.1)[0]:
                chunk = os.read(read_fd, 4096)
                if not chunk:
                    break
                line += chunk
        os.close(read_fd)
        self.service_pid = pid
        if not line.endswith(b"\n"):
            self.fail(
                f"the {self.kind.name} nanny on node {self.node!r} did not start within "
                f"{SERVICE_WAIT_S:g} s (see this agent's log)"
            )
        options.update(json.loads(line))

    # -- engines -----------------------------------------------------------------------------
    def _fork_child(self, run) -> int:
        """Fork a child that runs ``run()`` and exits (0 when it returns)."""
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid:
            return pid
        code = 1
        try:
            _set_parent_death_signal()
            if os.getppid() != self.agent_pid:
                os._exit(1)
            self.link.close_in_child()
            for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
                signal.signal(sig, signal.SIG_DFL)
            run()
            code = 0
        except SystemExit as e:  # an app's exit(n) is its exit code, not a crash
            code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        except BaseException:  # noqa: BLE001
            traceback.print_exc(file=sys.__stderr__)  # sys.stderr may be the engine's iopub
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def check_fork_safety(self) -> None:
        """Fail when forking now would be unsafe: thoroughly the first time, before anything
        forks. The thorough look reads every module's globals, which writes their reference
        counts all over the heap: done after the nanny's fork, it made the agent copy ~76 MiB
        of pages the nanny then held alone (measured, /proc/PID/smaps)."""
        problem = fork_safety_problem(thorough=not self.checked)
        if problem:
            self.fail(
                f"cannot fork engines on node {self.node!r}: {problem} before the fork "
                "(a preload module started it); remove that module from --preload"
            )
        self.checked = True

    def fork_engine(self, rank: int) -> None:
        self.check_fork_safety()
        entry = self.engines.setdefault(
            str(rank), {"restarts": -1, "crashes": 0, "index": self._next_index}
        )
        if entry["index"] == self._next_index:
            self._next_index += 1
        entry["restarts"] += 1
        gpu = gpu_for(entry["index"], self.gpus, self.spec.engines_per_gpu)
        data = self._data_env()

        def engine() -> None:
            env = {
                **data,
                "LOUNGE_RANK": str(rank),
                "LOUNGE_SIZE": str(self.size),
                "LOUNGE_NODE": self.node,
                "LOUNGE_CLUSTER": self.spec.cluster,
                # the agent's private folder: what one engine got, its siblings read (a map's
                # function travels once per node)
                "LOUNGE_SHARE_DIR": os.path.dirname(self.spec.report_file),
            }
            for name, value in env.items():  # not os.environ.update(**names): see
                os.environ[name] = value  # _warm_abc_caches (it asks whether () is a Mapping)
            if gpu is not None:
                os.environ["CUDA_VISIBLE_DEVICES"] = gpu
            if gpu and self.spec.engines_per_gpu != 1:
                # engines that share a GPU: each takes the memory it uses, not all of it at
                # its first op (TensorFlow's and JAX's default, which leaves the others none)
                os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
                os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
            _reseed(rank)
            self.kind.run_engine(
                self.spec.connection_file,
                rank=rank,
                node=self.node,
                restarts=entry["restarts"],
                options=self.spec.engine_options,
            )

        pid = self._fork_child(engine)
        self.children[pid] = rank
        entry.update(pid=pid, state="running", started=time.time())

    def reap(self) -> bool:
        changed = False
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid == self.service_pid:
                self._service_exited(status)
                changed = True
                continue
            rank = self.children.pop(pid, None)
            if rank is None:
                continue
            changed = True
            entry = self.engines[str(rank)]
            asked = entry.get("state")  # "running" unless this agent asked it to stop
            entry["exit"] = code = os.waitstatus_to_exitcode(status)
            entry["state"] = "evicted" if self.evicted else "exited"
            if self.stopping or self.evicted or rank not in self.wanted:
                continue
            if asked == "restarting":
                self.fork_engine(rank)
            elif code == 0 and asked == "running" and self.kind.clean_exit_retires:
                entry["state"] = "retired"  # shut down on purpose: not replaced
                self.wanted.remove(rank)
                self.retired.add(rank)
            elif code != 0:
                entry["crashes"] += 1
                if self.spec.restart and entry["crashes"] <= MAX_RESTARTS:
                    self.fork_engine(rank)
            elif self.spec.restart:
                self.fork_engine(rank)  # closed by its controller (Dask's restart)
        return changed

    def _service_exited(self, status: int) -> None:
        """The nanny died: start another and restart the engines it served (their control
        channels ran through it)."""
        print(
            f"node agent {self.node}: the {self.kind.name} nanny exited "
            f"({os.waitstatus_to_exitcode(status)}); restarting it and the engines",
            file=sys.stderr,
            flush=True,
        )
        self.service_pid = None
        if self.stopping:
            return
        self.start_service()
        for pid, rank in list(self.children.items()):
            self.engines[str(rank)]["state"] = "restarting"
            os.kill(pid, signal.SIGTERM)

    def interrupt(self) -> None:
        """Interrupt the running work of every engine (their kind says how)."""
        sig = getattr(signal, self.kind.interrupt_signal)
        for pid in list(self.children):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def apply_control(self, control: Control) -> None:
        """Do what the cluster wants now: stop, interrupt, or run exactly these ranks (before
        the controller is there, only remember them)."""
        if control.stop:
            self.stopping = True
            return
        if control.interrupt is not None and control.interrupt != self._interrupt:
            self._interrupt = control.interrupt
            self.interrupt()
        self.wanted = [r for r in control.ranks if r not in self.retired]
        self.size = control.size or self.size
        if not self.forking:
            return
        running = set(self.children.values())
        for pid, rank in list(self.children.items()):
            if rank not in self.wanted:
                self.engines[str(rank)]["state"] = "stopping"
                os.kill(pid, signal.SIGTERM)
        for rank in self.wanted:
            if rank not in running and not self.evicted:
                self.fork_engine(rank)

    def controller_alive(self) -> bool:
        try:
            if isinstance(self.probe_addr, str):  # a Unix socket's path
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.settimeout(1.0)
                    s.connect(self.probe_addr)
                return True
            with socket.create_connection(self.probe_addr, timeout=1.0):
                return True
        except OSError:
            return False

    def stop_children(self) -> None:
        self.stopping = True  # nothing reaped from here on is replaced
        for pid in list(self.children):
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + STOP_GRACE_S
        while self.children and time.monotonic() < deadline:
            self.reap()
            time.sleep(0.05)
        for pid in list(self.children):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        while self.children:
            try:
                pid, _ = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            self.children.pop(pid, None)
        self.stop_service()  # after the engines: it reports their exits

    def stop_service(self) -> None:
        if self.service_pid is not None:
            pid, self.service_pid = self.service_pid, None
            try:
                os.kill(pid, signal.SIGTERM)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass

    def shutdown(self, reason: str = "stopped") -> None:
        self.status = "stopping"
        self.report()
        self.stop_children()
        for entry in self.engines.values():
            entry["state"] = "exited"
        self.status = reason
        self.report()
        self.link.cleanup()
        sys.exit(0)

    # -- courtesy ----------------------------------------------------------------------------
    def _start_watching(self) -> None:
        from .telemetry import Courtesy, IdlePolicy, Telemetry

        self.watcher = Telemetry(os.getpid(), presence=self.spec.presence)
        policy = self.spec.courtesy
        if policy is not None:  # only then does the first look decide whether to fork
            self.courtesy = Courtesy(IdlePolicy(**policy), time.monotonic())
            if self._carried_courtesy:  # monotonic time is the machine's: kept by an exec
                self.courtesy.take_over(self._carried_courtesy)
            self._watch()

    def _watch(self) -> None:
        """Sample the machine; stop the engines when a person uses it, fork them back once it
        has been idle long enough."""
        from .telemetry import probe_in_use

        self.telemetry = self.watcher.sample() | {"agent_mib": own_mib()}
        if self.courtesy is None:
            return
        probe = probe_in_use(self.courtesy.policy.probe)
        state = self.courtesy.update(self.telemetry, time.monotonic(), probe)
        if state == "in use" and not self.evicted:
            self.evicted, self.status = True, "in use"
            self._evicted_at = time.monotonic()
            for pid, rank in list(self.children.items()):
                self.engines[str(rank)]["state"] = "evicted"
                os.kill(pid, signal.SIGTERM)
        elif state == "idle" and self.evicted and self.lean:
            self.report()
            self.rest(lean=False)
        elif state == "idle" and self.evicted:
            self.evicted, self.status = False, "running"
            running = set(self.children.values())
            for rank in self.wanted:
                if rank not in running:
                    self.fork_engine(rank)

    def _leave_for_the_person(self) -> None:
        """Once evicted: engines that outlast the grace are killed, and once none is left
        the agent rests lean (``rest``)."""
        if self.children and time.monotonic() - self._evicted_at > STOP_GRACE_S:
            for pid in list(self.children):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if not self.children:
            self.report()
            self.rest(lean=True)

    # -- main --------------------------------------------------------------------------------
    def _on_term(self, signum, frame) -> None:
        if not self.children and self.status in ("starting", "preloading"):
            self.status = "stopped"  # nothing forked yet: leave now, not after the import
            self.report()
            self.link.cleanup()
            os._exit(0)
        self.stopping = True

    def _on_hup(self, signum, frame) -> None:
        self.link.hup()

    def run(self) -> None:
        self.agent_pid = os.getpid()
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGINT, self._on_term)
        signal.signal(signal.SIGHUP, self._on_hup)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # blocked across a rest
        thresholds = gc.get_threshold()
        if not self.lean:
            thresholds = _young_collections_only()
            self.stage_data()
            self.preload()
        self.wait_for_controller()
        self._lap("wait_controller")
        if not self.lean:
            self.kind.prepare(self.connection, self.spec.engine_options, self.spec.connection_file)
            self.check_fork_safety()  # the thorough look, before any fork
            _warm_abc_caches()
            gc.freeze()
            gc.set_threshold(*thresholds)  # engines collect as any Python does
            _take_up_malloc_holes()
            self._lap("gc_freeze")
            self.start_service()
        self._start_watching()
        self._poll(0)  # the control as it is now (a file link reads it the first time)
        self.forking = True
        if not self.evicted and not self.stopping:
            for rank in self.wanted:
                if self.engines.get(str(rank), {}).get("state") != "running":
                    self.fork_engine(rank)
                    self._report_if_due()  # hundreds of engines on a big node take a while
        self._lap("fork")
        self.status = "in use" if self.evicted else "running"
        self.report()
        next_probe, misses = time.monotonic() + PROBE_EVERY_S, 0
        while not self.stopping:
            changed = self.reap()
            changed |= self._poll(POLL_S)
            if self.stopping:
                break
            if self.evicted and not self.lean:
                self._leave_for_the_person()
            if time.monotonic() >= next_probe:
                next_probe = time.monotonic() + PROBE_EVERY_S
                misses = 0 if self.controller_alive() else misses + 1
                if misses >= PROBE_MISSES:
                    self.error = "the controller stopped answering; engines taken down"
                    self.shutdown("controller-lost")
                self._watch()
                changed = True  # a report every probe is the agent's heartbeat
            if changed:
                self.report()
        self.shutdown()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--stdio"]:  # the spec and everything after it come over stdin (see StdioLink)
        NodeAgent(StdioLink()).run()
        return
    if len(argv) == 2 and argv[0] == "--resume":  # this agent, executed anew by NodeAgent.rest
        carried = read_json(argv[1])
        os.unlink(argv[1])
        link = carried["link"]
        if link["kind"] == "stdio":
            NodeAgent(StdioLink(link), carried).run()
        else:
            NodeAgent(FileLink("", link), carried).run()
        return
    if len(argv) != 1:
        raise SystemExit("usage: python -m jupyter_lounge.node SPEC.json | --stdio")
    # One command for every task of a Slurm step: "{task}" is this task's number.
    NodeAgent(FileLink(argv[0].replace("{task}", os.environ.get("SLURM_PROCID", "0")))).run()


if __name__ == "__main__":
    main()
