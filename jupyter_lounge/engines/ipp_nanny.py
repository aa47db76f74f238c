"""One nanny per node for every ipyparallel engine of that node.

Stock ipyparallel starts a nanny process beside each engine (``python -m
ipyparallel.engine.nanny``, one more interpreter per engine). The nanny owns the engine's
control connection and relays it, so it can answer ``signal_request`` (``Client.send_signal``,
Ctrl-C on a ``%%px`` cell) however busy the engine is, and it tells the controller the moment
its engine dies instead of leaving that to missed heartbeats.

Here the node agent forks one such nanny before its engines. Each engine, once registered,
asks it for a relay of its control channel (over a CurveZMQ socket on loopback, with signed
messages), exactly where a stock engine would start its own nanny. The nanny watches every
engine through a pidfd: a signal goes to that very process (never to a reused pid), and its
exit is seen at once, whatever killed it.
"""

from __future__ import annotations

import json
import os
import resource
import signal
from typing import Any

ATTACH = "lounge_attach_request"
ATTACH_WAIT_S = 10.0
HANDSHAKE_WAIT_S = 5.0  # within ATTACH_WAIT_S: the engine hears why
LAST_WORDS_S = 0.5  # how long a dead engine's last messages may still be on their way


def _handshake_events() -> int:
    import zmq

    return (
        zmq.EVENT_HANDSHAKE_SUCCEEDED
        | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
        | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
        | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    )


def session_for(connection: dict) -> Any:
    """A Session that signs and checks messages with the controller's key."""
    from ipyparallel import util
    from jupyter_client.session import Session

    util._disable_session_extract_dates()
    return Session(
        key=(connection.get("key") or "").encode(),
        signature_scheme=connection.get("signature_scheme", "hmac-sha256"),
        packer=connection.get("pack", "json"),
        unpacker=connection.get("unpack", "json"),
    )


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return int(stat[stat.rindex(b")") + 2 :].split()[1])


def _set_curve(sock: Any, keys: tuple[bytes, bytes] | None, server: bool, serverkey=None) -> None:
    """CurveZMQ on ``sock`` with the node's key pair (as server, or as client of
    ``serverkey``); nothing when the cluster runs without Curve (``--no-tls`` on local)."""
    if keys is None:
        return
    import zmq

    public, secret = keys
    if server:
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
    else:
        sock.setsockopt(zmq.CURVE_SERVERKEY, serverkey or public)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, secret)


class _Engine:
    """What the nanny holds for one engine: its pidfd and its two relayed sockets."""

    def __init__(self, pid: int, engine_id: int, pidfd: int, control: Any, parent: Any):
        self.pid, self.engine_id, self.pidfd = pid, engine_id, pidfd
        self.control, self.parent = control, parent


class NodeNanny:
    def __init__(self, connection: dict, keys: tuple[bytes, bytes] | None, agent_pid: int):
        self.connection = connection
        self.keys = keys
        self.agent_pid = agent_pid
        self.session = session_for(connection)
        self.serverkey = (connection.get("curve_serverkey") or "").encode() or None
        interface = connection["interface"]
        self.registration_url = f"{interface}:{connection['registration']}"
        self.engines: dict[int, _Engine] = {}  # pidfd -> engine

    # -- start ---------------------------------------------------------------------------
    def serve(self, ready_fd: int) -> None:
        import asyncio

        import zmq
        from tornado.ioloop import IOLoop
        from zmq.eventloop.zmqstream import ZMQStream

        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is for the engines
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:  # three descriptors per engine; hundreds of engines per node
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        asyncio.set_event_loop(asyncio.new_event_loop())
        self.loop = IOLoop.current()
        self.context = zmq.Context()
        self.registration = self.context.socket(zmq.DEALER)
        self.registration.linger = 3000
        _set_curve(self.registration, self.keys, False, self.serverkey)
        self.registration.connect(self.registration_url)
        service = self.context.socket(zmq.ROUTER)
        _set_curve(service, self.keys, True)
        url = self._bind_local(service, f"n{os.getpid()}")
        self.service = ZMQStream(service)
        self.service.on_recv(self._attach)
        os.write(ready_fd, json.dumps({"nanny_url": url}).encode() + b"\n")
        os.close(ready_fd)
        self.loop.start()

    def _bind_local(self, sock: Any, name: str) -> str:
        """Bind ``sock`` for this node's engines alone: where the controller is on Unix
        sockets (``ipc://``, a cluster on this machine alone), as ``name`` in its private
        folder; else on a random loopback port (CurveZMQ keeps it to the node's keys)."""
        transport, where = self.connection["interface"].split("://", 1)
        if transport == "ipc":
            url = f"ipc://{os.path.join(os.path.dirname(where), name)}"
            sock.bind(url)
            return url
        return f"tcp://127.0.0.1:{sock.bind_to_random_port('tcp://127.0.0.1')}"

    # -- one engine ----------------------------------------------------------------------
    def _attach(self, frames: list) -> None:
        """An engine asks for a relay of its control channel."""
        import zmq
        from zmq.eventloop.zmqstream import ZMQStream

        try:
            idents, frames = self.session.feed_identities(frames)
            msg = self.session.deserialize(frames)
        except Exception:  # noqa: BLE001 - unsigned or malformed: not an engine of ours
            return
        try:
            content = msg["content"]
            pid, engine_id = int(content["pid"]), int(content["id"])
            if _parent_of(pid) != self.agent_pid:
                raise PermissionError(f"pid {pid} is not an engine of this node")
            pidfd = os.pidfd_open(pid)
        except Exception as e:  # noqa: BLE001 - a bad request is answered, never fatal
            self.session.send(
                self.service, "lounge_attach_reply", {"error": str(e)}, ident=idents, parent=msg
            )
            return
        control = self.context.socket(zmq.ROUTER)
        control.setsockopt(zmq.IDENTITY, content["ident"].encode())
        _set_curve(control, self.keys, False, self.serverkey)
        # The engine is told its relay only once the relay's connection to the controller
        # is up (its handshake done): the engine then starts its heart, the controller then
        # announces it, and a client's first control message to it (a shutdown, a signal)
        # would otherwise be dropped by the controller, the relay not connected yet.
        watch = ZMQStream(control.get_monitor_socket(_handshake_events()))
        control.connect(content["control_url"])

        def ready(error: str | None) -> None:
            if watch.closed():
                return
            self.loop.remove_timeout(timer)
            control.disable_monitor()
            watch.close(linger=0)
            if error:
                control.close(linger=0)
                os.close(pidfd)
                self.session.send(
                    self.service, "lounge_attach_reply", {"error": error}, ident=idents, parent=msg
                )
                return
            parent = self.context.socket(zmq.DEALER)
            _set_curve(parent, self.keys, True)
            url = self._bind_local(parent, f"r{pid}")
            engine = _Engine(pid, engine_id, pidfd, ZMQStream(control), ZMQStream(parent))
            engine.control.on_recv_stream(lambda stream, raw: self._from_controller(engine, raw))
            engine.parent.on_recv(engine.control.send_multipart)
            self.engines[pidfd] = engine
            self.loop.add_handler(pidfd, self._exited, self.loop.READ)
            self.session.send(
                self.service,
                "lounge_attach_reply",
                {"url": url},
                ident=idents,
                parent=msg,
            )

        def event(frames: list) -> None:
            from zmq.utils.monitor import parse_monitor_message

            if parse_monitor_message(frames)["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                ready(None)
            else:
                ready(
                    f"the handshake with the controller at {content['control_url']} failed "
                    "(its keys or its protocol are not this node's): stop the cluster and "
                    "start it again, so that its nodes get its keys"
                )

        watch.on_recv(event)
        timer = self.loop.call_later(
            HANDSHAKE_WAIT_S,
            ready,
            f"the controller at {content['control_url']} did not complete a connection "
            f"within {HANDSHAKE_WAIT_S:g} s: check that this node reaches that address and "
            "port (a firewall between them, or an address this node has no route to)",
        )

    def _from_controller(self, engine: _Engine, raw: list) -> None:
        """Answer a signal request here; pass every other control message to the engine."""
        try:
            idents, frames = self.session.feed_identities(raw)
            msg = self.session.deserialize(frames, content=True)
        except Exception:  # noqa: BLE001 - unsigned or malformed: dropped, as the engine would
            return
        if msg["header"]["msg_type"] != "signal_request":
            engine.parent.send_multipart(raw)
            return
        try:
            sig = msg["content"]["sig"]
            sig = getattr(signal, sig) if isinstance(sig, str) else int(sig)
            signal.pidfd_send_signal(engine.pidfd, sig)
            content: dict = {"status": "ok"}
        except Exception as e:  # noqa: BLE001
            from ipyparallel import error

            try:
                raise type(e)(f"engine {engine.engine_id} (pid {engine.pid}): {e}") from None
            except Exception:  # noqa: BLE001
                content = error.wrap_exception()
        self.session.send(engine.control, "signal_reply", content, ident=idents, parent=msg)

    def _exited(self, pidfd: int, events: int) -> None:
        """The engine is gone: pass on what it said last, then tell the controller, as the
        stock nanny does (long before missed heartbeats would). An engine answers a shutdown
        request and exits; its reply can still be on its way here when its exit is seen, and
        closing its sockets then lost the reply, so the client's ``shutdown(block=True)``
        waited for ever. The relay therefore goes on for ``LAST_WORDS_S`` without holding
        up the nanny (an engine hands its last words to the network before it exits, so they
        are here within a moment even on a loaded node)."""
        engine = self.engines.pop(pidfd)
        self.loop.remove_handler(pidfd)
        os.close(pidfd)
        self.loop.call_later(LAST_WORDS_S, self._unregister, engine)

    def _unregister(self, engine: _Engine) -> None:
        engine.parent.stop_on_recv()
        while engine.parent.socket.poll(0):
            engine.control.send_multipart(engine.parent.socket.recv_multipart())
        engine.control.flush()
        self.session.send(self.registration, "unregistration_request", {"id": engine.engine_id})
        engine.control.close(linger=int(LAST_WORDS_S * 1000))  # sent on in the background
        engine.parent.close(linger=0)


def serve(connection: dict, keys: tuple[bytes, bytes] | None, agent_pid: int, ready_fd: int):
    NodeNanny(connection, keys, agent_pid).serve(ready_fd)


def attach(app: Any, nanny_url: str, serverkey: bytes | None, control_url: str) -> str:
    """In an engine (``IPEngine.start_nanny``): the relay URL its control socket connects to."""
    import zmq

    sock = app.context.socket(zmq.DEALER)
    sock.linger = 0
    keys = (app.curve_publickey, app.curve_secretkey) if serverkey else None
    _set_curve(sock, keys, False, serverkey)
    sock.connect(nanny_url)
    try:
        app.session.send(
            sock,
            ATTACH,
            {"pid": os.getpid(), "id": app.id, "ident": app.ident, "control_url": control_url},
        )
        if not sock.poll(ATTACH_WAIT_S * 1000):
            raise RuntimeError(
                f"the node's nanny at {nanny_url} did not answer within {ATTACH_WAIT_S:g} s"
            )
        _, frames = app.session.feed_identities(sock.recv_multipart())
        reply = app.session.deserialize(frames)["content"]
    finally:
        sock.close()
    if "url" not in reply:
        raise RuntimeError(f"the node's nanny refused this engine: {reply.get('error')}")
    return reply["url"]
