"""ipyparallel engines: an ``ipcontroller`` beside the cluster, ``IPEngine`` in each child."""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from ..errors import LoungeError, LoungeTimeout
from .base import EngineKind, engine_ident, parse_engine_name


class IPyParallelEngines(EngineKind):
    name = "ipyparallel"
    controller_name = "ipyparallel controller"
    clean_exit_retires = True  # an engine ends with 0 only when asked: rc.shutdown, exit
    has_node_service = True
    local_sockets = True

    def agent_imports(self) -> None:
        # The engine pulls ~300 modules (ipykernel, and debugpy for the kernel's debugger,
        # imported when the kernel starts): import them once, here, not in every engine.
        import os

        os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
        import code  # noqa: F401
        import pydoc  # noqa: F401
        import runpy  # noqa: F401
        import sqlite3  # noqa: F401

        import ipykernel.debugger  # noqa: F401
        import ipykernel.ipkernel  # noqa: F401
        import ipyparallel.engine.app  # noqa: F401
        import ipyparallel.serialize  # noqa: F401
        import IPython.core.completerlib  # noqa: F401
        import IPython.core.oinspect  # noqa: F401
        import IPython.extensions.storemagic  # noqa: F401
        import IPython.utils.wildcard  # noqa: F401
        import tornado.platform.asyncio  # noqa: F401

    def probe_address(self, connection: dict) -> tuple[str, int] | str:
        transport, host = connection["interface"].split("://", 1)
        if transport == "ipc":  # the socket's path (ipyparallel joins it with ":" too)
            return f"{host}:{connection['registration']}"
        return host, int(connection["registration"])

    def prepare(self, connection: dict, options: dict, connection_file: str) -> None:
        _list_loaded_modules()
        # The node's engines and its nanny share one CurveZMQ key pair, made here (no ZMQ
        # context needed) and handed to them by the fork: the nanny serves its relays with
        # it, as a stock nanny serves its engine's relay with that engine's own key.
        if connection.get("curve_serverkey"):
            import zmq

            options["curve_keys"] = zmq.curve_keypair()
        _initialize_app(connection_file, options)
        _make_shell()

    def serve_node(self, connection: dict, options: dict, ready_fd: int) -> None:
        from . import ipp_nanny

        ipp_nanny.serve(connection, options.get("curve_keys"), os.getppid(), ready_fd)

    def run_engine(self, connection_file, *, rank, node, restarts, options):
        app = _lounge_engine_class().instance()  # the singleton: %matplotlib, bind_kernel
        if not app.lounge_initialized:  # the agent initializes it before it forks
            _initialize_app(connection_file, options)
        sys.path.insert(0, "")  # IPEngine.init_engine's, which ran in the agent
        app.session.session = str(uuid.uuid4())  # its own, as a Session made here has,
        app.session.pid = os.getpid()  # and one that sends from this process
        # The identity carries node and rank, so the cluster can count engines per node.
        app.ident = engine_ident(node, rank, uuid.uuid4().hex[:8])
        app.lounge_nanny_url = options.get("nanny_url")
        app.enable_nanny = bool(app.lounge_nanny_url)
        transport, where = app.registration_url.split("://", 1)
        if transport == "ipc":  # bind_kernel() opens its ports as Unix sockets beside ours
            app.config.IPKernelApp.transport = "ipc"
            app.config.IPKernelApp.ip = os.path.join(os.path.dirname(where), f"k{os.getpid()}")
        if restarts == 0:
            app.id = rank
        if _made is not None:
            _made.take_up()
        try:
            app.start()
        except Exception:
            # A shutdown request or `exit` stops the loop under IPEngine.start, which then
            # raises ("Event loop stopped before Future completed"): that end was asked for.
            shell = getattr(getattr(app, "kernel", None), "shell", None)
            if not getattr(shell, "exit_now", False):
                raise
        _let_last_words_out(app)

    def controller_command(self, cdir: Path, listen_ip: str, options: dict) -> list[str]:
        hb = int(options.get("heartbeat_ms", 150))
        # Every message is signed (HMAC with a key made here), CurveZMQ or not: ipyparallel
        # drops the key when Curve is on unless the config names one. The key goes into the
        # profile's config file (0600), never onto a command line that `ps` shows.
        profile = cdir / "profile"
        profile.mkdir(mode=0o700, exist_ok=True)
        config = profile / "ipcontroller_config.py"
        fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        sockets = options.get("socket_dir")
        with os.fdopen(fd, "w") as f:
            f.write(f"c.Session.key = {secrets.token_hex(32).encode()!r}\n")
            if sockets:  # this machine alone: Unix sockets in a folder only we can enter
                for role, prefix in (("engine", "e"), ("client", "c"), ("monitor", "m")):
                    f.write(f"c.IPController.{role}_transport = 'ipc'\n")
                    f.write(f"c.IPController.{role}_ip = {os.path.join(sockets, prefix)!r}\n")
            elif options.get("tls"):  # here, not on the command line: it would drop the key
                f.write("c.IPController.enable_curve = True\n")
        # Engines read the user's engine config as stock ones started for the default
        # profile do (nodes without a shared file system get none: their profile is theirs).
        from IPython.paths import get_ipython_dir

        user_config = Path(get_ipython_dir()) / "profile_default" / "ipengine_config.py"
        if user_config.is_file():
            shutil.copyfile(user_config, profile / "ipengine_config.py")
        return [
            sys.executable,
            "-m",
            "jupyter_lounge.engines.ipp_controller",  # the stock one, less O(N) work per engine
            f"--profile-dir={cdir / 'profile'}",
            *([] if sockets else [f"--ip={listen_ip}"]),
            f"--HeartMonitor.period={hb}",
            "--HeartMonitor.max_heartmonitor_misses=20",  # ~3 s to declare an engine dead
            "--log-level=WARN",
        ]

    def connection_files(self, cdir: Path) -> tuple[Path, Path]:
        sec = cdir / "profile" / "security"
        return sec / "ipcontroller-engine.json", sec / "ipcontroller-client.json"

    def _connect(self, cdir: Path, timeout: float) -> Any:
        import ipyparallel as ipp

        return ipp.Client(str(self.connection_files(cdir)[1]), timeout=timeout)

    def close(self, client: Any) -> None:
        client.close(linger=0)

    def registered(self, client: Any) -> list[tuple[str, int]]:
        engines = dict(client._engines)  # id -> ident "node/rank/nonce"; copy: IO thread writes
        return [parse_engine_name(engines.get(eid, "")) or ("?", eid) for eid in client.ids]

    def engines(self, client):
        idents = dict(client._engines)  # id -> ident "node/rank/nonce"; copy: IO thread writes
        return {
            eid: (parse_engine_name(idents.get(eid, "")) or ("?", eid))[0] for eid in client.ids
        }

    def submit_to(self, client, engine, fn, *args):
        return client.direct_view(engine).apply_async(fn, *args)

    def outcome(self, future):
        return future.get()

    def interrupt(self, client, engines):
        if engines:  # the agent's nanny answers it: SIGINT to that very engine
            client.send_signal("SIGINT", targets=list(engines), block=False)

    def execute(self, client, code, timeout):
        if not client.ids:
            raise LoungeError("No engine is registered yet; wait with `%lounge status` and retry.")
        ar = client[:].execute(code, silent=False, block=False)
        # Stream from each engine's accumulating metadata rather than through iopub
        # callbacks, which can miss output that arrives before they are registered.
        shown: dict[tuple[int, str], int] = {}
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            finished = ar.ready()
            metadata = ar.metadata if isinstance(ar.metadata, list) else [ar.metadata]
            for md in metadata:
                for stream in ("stdout", "stderr"):
                    text, start = md.get(stream) or "", shown.get((md["engine_id"], stream), 0)
                    if len(text) > start:
                        shown[(md["engine_id"], stream)] = len(text)
                        end = "" if text.endswith("\n") else "\n"
                        out = sys.stderr if stream == "stderr" else sys.stdout
                        print(
                            f"[{stream}:{md['engine_id']}] {text[start:]}",
                            end=end,
                            file=out,
                            flush=True,
                        )
            if finished:
                break
            if deadline is not None and time.monotonic() > deadline:
                raise LoungeTimeout(
                    f"The cell did not finish on every engine within {timeout:g} s."
                )
            time.sleep(0.05)
        ar.get()  # raise the engines' errors (ipyparallel's CompositeError shows each one)


def _initialize_app(connection_file: str, options: dict) -> None:
    """The engine application, made and initialized in the agent before the first fork,
    as everything in it is the same for the node's engines: its config (the command line,
    the profile's files), its connection file and session, its logging. Made in each
    engine instead, it wrote pages of the agent all over (traitlets' class set-up reads
    every attribute of the classes; the config loader's questions walk the ABCs' caches):
    6 MiB copied into every engine. Each engine then sets what is its own (run_engine)."""
    app = _lounge_engine_class().instance()
    if options.get("curve_keys"):
        app.curve_publickey, app.curve_secretkey = options["curve_keys"]
    argv = [
        f"--IPEngine.url_file={connection_file}",
        "--log-level=WARN",
        # An engine does not watch the controller's pings to exit when they stop: its agent
        # probes the controller and takes its engines down when it is gone (node.py,
        # controller_alive: 3 probes 2 s apart). Watching woke the engine's Python loop at
        # every ping, ~0.3 ms of CPU each: at the 150 ms heartbeat, 2.1 of an idle
        # engine's 2.7 ms a second (256 engines: over a quarter of this machine's 2 cores).
        # Its heart still answers the controller's pings, in ZMQ's C code, not Python.
        "--IPEngine.max_heartbeat_misses=0",
    ]
    if options.get("profile_dir"):
        argv.append(f"--profile-dir={options['profile_dir']}")
    hook, path, cwd = sys.excepthook, list(sys.path), os.getcwd()
    try:
        app.initialize(argv)
    finally:  # the agent's own, whatever the app set for an engine
        sys.excepthook, sys.path[:] = hook, path
        os.chdir(cwd)
    app.lounge_initialized = True


#: How long an engine asked to end waits for what it said last to leave it.
LAST_WORDS_S = 2.0


def _let_last_words_out(app: Any) -> None:
    """Before an engine that was asked to end exits: hand what it said last (the shutdown
    reply, its last output) to its peers. The engine ends with ``os._exit``, which ends ZMQ's
    I/O thread at once: a reply still queued there was lost, and the client's
    ``shutdown(block=True)`` waited for ever. So: flush the output, stop the threads that
    own sockets, then close every socket of the engine's context with a linger and end the
    context, which waits until the messages are out (or ``LAST_WORDS_S`` has passed: a peer
    that is gone does not hold the exit). Each wait is bounded; when one runs out, the
    engine exits without closing (a socket still used by a thread must not be closed)."""
    import threading

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()  # the kernel's streams: their text goes out on IOPub
        except Exception:  # noqa: BLE001, S110 - output that cannot go out is not kept
            pass
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    kernel = getattr(app, "kernel", None)
    control = getattr(kernel, "control_thread", None)
    iopub = getattr(kernel, "iopub_thread", None)
    threads = []
    if control is not None and control.is_alive():
        control.stop()
        threads.append(control)
    if iopub is not None and iopub.thread.is_alive():
        iopub.io_loop.add_callback(iopub.io_loop.stop)  # IOPubThread.stop waits 30 s
        threads.append(iopub.thread)
    deadline = time.monotonic() + LAST_WORDS_S
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            return
    closing = threading.Thread(
        target=app.context.destroy, kwargs={"linger": int(LAST_WORDS_S * 1000)}, daemon=True
    )
    closing.start()
    closing.join(LAST_WORDS_S + 1.0)


@functools.cache
def _lounge_engine_class() -> type:
    """IPEngine whose nanny is the node's (see ipp_nanny), not a process of its own."""
    from ipyparallel.engine.app import IPEngine
    from traitlets import observe

    from . import ipp_nanny

    class LoungeEngine(IPEngine):
        lounge_nanny_url: str | None = None
        lounge_initialized = False  # by the agent, before its first fork (see prepare)

        @observe("kernel")
        def _kernel_made(self, change):
            if _made is not None and change.new is not None:
                _made.bind(change.new)

        async def complete_registration(self, *args, **kwargs):
            with _modules_as_listed():  # (the kernel is made in here)
                return await super().complete_registration(*args, **kwargs)

        def start_nanny(self, control_url):
            serverkey = self.curve_publickey if self.curve_serverkey else None
            return ipp_nanny.attach(self, self.lounge_nanny_url, serverkey, control_url), None

    return LoungeEngine


class _MadeShell:
    """The kernel's IPython shell, made in the agent before the first fork (see _make_shell),
    and what making it set for the whole process, which the agent takes back and each engine
    sets again."""

    SYS_NAMES = ("ps1", "ps2", "ps3", "displayhook", "excepthook", "stdin", "stdout", "stderr")

    def __init__(self, make):
        import atexit
        import builtins

        env, names, main = dict(os.environ), dict(builtins.__dict__), sys.modules.get("__main__")
        attrs = {name: getattr(sys, name, _MISSING) for name in self.SYS_NAMES}
        try:
            self.shell = make()
        finally:  # what the shell set for this process, and then the agent's own again
            self.env = _changes(env, os.environ)
            self.builtins = _changes(names, builtins.__dict__)
            self.main = sys.modules.get("__main__")
            self.sys = _changes(attrs, {n: getattr(sys, n, _MISSING) for n in self.SYS_NAMES})
            for key in self.env:
                _put(os.environ, key, env.get(key, _MISSING))
            for key in self.builtins:
                _put(builtins.__dict__, key, names.get(key, _MISSING))
            _put(sys.modules, "__main__", main if main is not None else _MISSING)
            for name in self.sys:
                _set_attr(sys, name, attrs[name])
        atexit.unregister(self.shell.atexit_operations)

    def take_up(self) -> None:
        """*engine*, first: what making the shell set for its process, set in this one."""
        import atexit
        import builtins

        for key, value in self.env.items():  # one by one: see node._warm_abc_caches
            _put(os.environ, key, value)
        for key, value in self.builtins.items():
            _put(builtins.__dict__, key, value)
        if self.main is not None:
            sys.modules["__main__"] = self.main
        for name, value in self.sys.items():
            _set_attr(sys, name, value)
        atexit.register(self.shell.atexit_operations)

    def bind(self, kernel) -> None:
        """*engine*, when its kernel is made (which took this shell as its own): the shell's
        kernel and parent are that kernel, as if the kernel had made it."""
        if kernel.shell is self.shell:
            self.shell.kernel = kernel
            self.shell.parent = kernel


_MISSING = object()


def _changes(before, after) -> dict:
    """What differs in ``after`` from ``before``: each changed key's new value, or _MISSING."""
    return {
        key: after.get(key, _MISSING)
        for key in {*before, *after}
        if not _same(before.get(key, _MISSING), after.get(key, _MISSING))
    }


def _same(a, b) -> bool:
    return a is b or (isinstance(a, str) and a == b)  # os.environ makes a new str each time


def _put(mapping, key, value) -> None:
    if value is _MISSING:
        mapping.pop(key, None)
    else:
        mapping[key] = value


def _set_attr(obj, name, value) -> None:
    if value is _MISSING:
        if hasattr(obj, name):
            delattr(obj, name)
    else:
        setattr(obj, name, value)


_made: _MadeShell | None = None


def _make_shell() -> None:
    """*agent*, after _initialize_app, before the first fork: make the IPython shell the
    engine's kernel would make for itself, once for all the node's engines. Made in each
    engine it was about 9 ms of the ~20 ms of CPU an engine spends completing its
    registration (IPython's ~35 configurables each loading the config, its history, its
    completer, ...), and ~960 pages written (4 MiB). The kernel's ``shell_class.instance``
    then finds this one, and each engine binds it to its kernel (``_MadeShell.bind``). Made
    as IPythonKernel makes it (ipykernel 6-7), with the history ipyparallel gives engines:
    in memory (an sqlite database of the agent's, which only the engine's copy uses)."""
    global _made
    from ipyparallel.engine.app import Kernel

    app = _lounge_engine_class().instance()
    shell_class = Kernel.class_traits()["shell_class"].default()
    compiler_class = Kernel.class_traits()["compiler_class"].default()
    app.config.HistoryManager.hist_file = ":memory:"  # as complete_registration sets it
    _made = _MadeShell(
        lambda: shell_class.instance(
            parent=app,
            profile_dir=None,  # the kernel's, as ipyparallel makes it
            user_module=None,
            user_ns=app.user_ns,
            kernel=None,  # bound in the engine
            compiler_class=compiler_class,
        )
    )


# Two walks over every loaded module as an engine makes its kernel: IPythonKernel.__init__
# lists each module's file (for its debugger's just-my-code) and IPython's InteractiveShellApp
# .init_code keeps the set of their names (for ``%reset --aggressive``). In a forked engine a
# walk writes the reference count of every module object, name and file name the agent
# imported, so each page holding one (4,468 modules with TensorFlow) is copied into the
# engine (measured with /proc/PID/smaps: 26 MiB for the first walk, 7.6 for the second). The
# agent makes both lists once, before the first fork, of new objects that lie together in a
# few pages; while the engine makes its kernel, the two modules' ``sys.modules`` gives those:
# an idle engine's private memory went from 43 to 20 MiB.
class _Loaded:
    """A loaded module as IPythonKernel.__init__ reads it: its file."""

    __slots__ = ("__file__",)

    def __init__(self, file: str):
        self.__file__ = file


def _fresh(text: str) -> str:
    """A new str object equal to ``text`` (slicing or str() would give the same object)."""
    return (text + ".")[:-1]


class _ListedModules:
    """``sys.modules`` as ipykernel.ipkernel and IPython.core.shellapp see it while an engine
    makes its kernel: ``copy()`` and ``keys()`` (the one use each makes of it, in ipykernel
    6-7 and IPython 8-9) give what the agent listed; anything else, the real one."""

    def __init__(self):
        names, files = [], []
        for name, module in list(sys.modules.items()):
            names.append(_fresh(name))
            if hasattr(module, "__file__") and module.__file__:  # as IPythonKernel asks
                files.append(_Loaded(_fresh(module.__file__)))
        self.names = frozenset(names)
        # numbered, not named: copy() INCREFs its keys too, and a number here is a new object
        self.files = {i: f for i, f in enumerate(files, 1000)}

    def copy(self) -> dict:
        return dict(self.files)

    def keys(self):
        return self.names

    def __getattr__(self, name):
        return getattr(sys.modules, name)


class _Sys:
    """``sys`` as those two modules see it while an engine makes its kernel."""

    def __init__(self, modules: _ListedModules):
        self.modules = modules

    def __getattr__(self, name):
        return getattr(sys, name)


_listed: _Sys | None = None


def _list_loaded_modules() -> None:
    """*agent*, before the first fork."""
    global _listed
    _listed = _Sys(_ListedModules())


class _modules_as_listed:
    """While the engine makes its kernel, the two modules read the agent's lists (when there
    are some: an engine started another way walks as before)."""

    def __enter__(self):
        import ipykernel.ipkernel
        import IPython.core.shellapp

        self.swapped = []
        for module in (ipykernel.ipkernel, IPython.core.shellapp):
            if _listed is not None and module.sys is sys:
                module.sys = _listed
                self.swapped.append(module)

    def __exit__(self, *exc):
        for module in self.swapped:
            module.sys = sys
