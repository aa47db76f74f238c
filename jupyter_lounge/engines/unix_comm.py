"""Dask comms over Unix sockets, for a cluster whose scheduler, workers and client are all on
this machine: addresses ``unix:///a/private/folder/name``.

Dask's own transports are TCP, in the clear or with TLS. A local cluster on loopback TCP is
open to every user of the machine, so it must use TLS (a CA and certificates per cluster, a
handshake per connection); at 256 workers the handshakes were ~10% of a launch here. A Unix
socket in a folder only its user can enter (0700) is reached by no one else, and each side
also checks that its peer runs as the same user (``SO_PEERCRED``): the kernel vouches for who
is at the other end, and no byte leaves the machine, so there is nothing to encrypt.

Each process that uses these addresses calls :func:`register` first (the scheduler, the node
agent before it forks its workers, the client).
"""

from __future__ import annotations

import asyncio
import errno
import functools
import os
import socket
import struct
import weakref

SCHEME = "unix"
PREFIX = f"{SCHEME}://"
#: How long a connect waits for room in a listener's full queue (then it tries again).
QUEUE_FULL_RETRY_S = 0.005


def available() -> bool:
    """Whether this machine's Python has Unix sockets and their peer credentials (Linux)."""
    return hasattr(socket, "AF_UNIX") and hasattr(socket, "SO_PEERCRED")


def address(path: str) -> str:
    return PREFIX + path


def path_of(addr: str) -> str:
    """The socket path of ``unix:///...`` (or of its scheme-less form)."""
    return addr[len(PREFIX) :] if addr.startswith(PREFIX) else addr


def peer_uid(sock: socket.socket) -> int:
    """The user id of the process at the other end of a connected Unix socket."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def register() -> None:
    """Make ``unix://`` addresses known to Dask in this process (once)."""
    from distributed.comm import registry

    if SCHEME not in registry.backends:
        registry.backends[SCHEME] = _backend_class()()


@functools.cache
def _backend_class() -> type:
    from distributed.comm.core import BaseListener, Comm, CommClosedError, Connector
    from distributed.comm.registry import Backend
    from distributed.comm.tcp import MAX_BUFFER_SIZE, TCP
    from tornado.iostream import IOStream
    from tornado.netutil import bind_unix_socket
    from tornado.tcpserver import TCPServer

    def _mark_closed(ref) -> None:
        comm = ref()
        if comm is not None:
            comm._closed = True

    class UnixComm(TCP):
        """Dask's TCP comm (its framing, reads and writes) on a Unix socket's stream, less
        what is TCP's own: no Nagle to turn off, no keepalive timers."""

        def __init__(self, stream: IOStream, local_addr: str, peer_addr: str, deserialize=True):
            self._closed = False
            Comm.__init__(self, deserialize=deserialize)
            self._local_addr, self._peer_addr = local_addr, peer_addr
            self.stream = stream
            self._finalizer = weakref.finalize(self, self._get_finalizer())
            self._finalizer.atexit = False
            self._extra: dict = {}
            stream.set_close_callback(lambda ref=weakref.ref(self): _mark_closed(ref))

    def _same_user_or_refuse(sock: socket.socket, where: str) -> None:
        uid = peer_uid(sock)
        if uid != os.getuid():
            raise PermissionError(
                errno.EACCES, f"{where}: the peer runs as user {uid}, not as {os.getuid()}"
            )

    class UnixConnector(Connector):
        async def connect(self, address, deserialize=True, **connection_args):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:  # (Dask's connect() bounds the wait: a timeout cancels it)
                while True:
                    try:
                        sock.connect(address)
                        break
                    except BlockingIOError:  # the listener's queue is full: a moment later
                        await asyncio.sleep(QUEUE_FULL_RETRY_S)
                _same_user_or_refuse(sock, PREFIX + address)
            except OSError as e:
                sock.close()
                raise CommClosedError(f"in {PREFIX}{address}: {e}") from e
            except BaseException:  # cancelled
                sock.close()
                raise
            stream = IOStream(sock, max_buffer_size=MAX_BUFFER_SIZE)
            return UnixComm(stream, f"{PREFIX}{address}#client", PREFIX + address, deserialize)

    class UnixListener(BaseListener):
        prefix = PREFIX

        def __init__(self, loc, comm_handler, deserialize=True, allow_offload=True, **_):
            super().__init__()
            self.path = loc
            self.comm_handler = comm_handler
            self.deserialize = deserialize
            self.allow_offload = allow_offload
            self.server: TCPServer | None = None
            self.accepted = 0

        async def start(self):
            import dask

            backlog = int(dask.config.get("distributed.comm.socket-backlog"))
            sock = bind_unix_socket(self.path, mode=0o600, backlog=backlog)
            self.server = TCPServer(max_buffer_size=MAX_BUFFER_SIZE)
            self.server.handle_stream = self._handle_stream
            self.server.add_socket(sock)

        def stop(self):
            server, self.server = self.server, None
            if server is not None:
                server.stop()
                try:
                    os.unlink(self.path)
                except OSError:
                    pass

        async def _handle_stream(self, stream: IOStream, _address) -> None:
            try:
                _same_user_or_refuse(stream.socket, self.contact_address)
            except OSError:
                stream.close()  # another user's process: not a peer of this cluster
                return
            if self.server is None:  # stopped after it accepted (see Dask's TCP listener)
                stream.close()
                return
            self.accepted += 1
            peer = f"{self.contact_address}#peer{self.accepted}"
            comm = UnixComm(stream, self.contact_address, peer, self.deserialize)
            comm.allow_offload = self.allow_offload
            try:
                await self.on_connection(comm)
            except CommClosedError:
                return
            await self.comm_handler(comm)

        @property
        def listen_address(self):
            return PREFIX + self.path

        @property
        def contact_address(self):
            return PREFIX + self.path

    class UnixBackend(Backend):
        def get_connector(self):
            return UnixConnector()

        def get_listener(self, loc, handle_comm, deserialize, **connection_args):
            return UnixListener(loc, handle_comm, deserialize, **connection_args)

        def get_address_host(self, loc):
            return "localhost"  # this machine: every peer of such an address is on it

        def resolve_address(self, loc):
            return loc

        def get_local_address_for(self, loc):
            return os.path.dirname(loc)

    return UnixBackend
