"""A stranger at a cluster's ports: run as another user (``nobody``) by tests/test_security.py.

``python tests/stranger.py CANARY HOST:PORT ...`` tries, on every port, what someone who knows
nothing but the port would try, for either engine kind, and prints one JSON line per port:
what came back (``answers``) and whether the peer speaks ZeroMQ (``zmtp``):

* ``zmtp``: a ZeroMQ greeting offering the NULL mechanism (no key), then an unsigned
  ``execute_request`` as DEALER, and a SUB that subscribes to everything (iopub, notifications);
* ``dask``: Dask's own comm in the clear, sending ``{"op": "run"}`` with a function that would
  create the CANARY file;
* ``dask-tls``: the same over TLS, showing a certificate of a CA the stranger made itself;
* ``tls``: a TLS handshake with no client certificate, then an HTTP request;
* ``http``: a plain HTTP request.

A target that is a path (``/...``) is a Unix socket: the stranger connects (the folder and the
socket's own mode should stop it there: ``unreachable``), then tries HTTP and Dask's comm (its
handshake, then the ``run``) over it.

Anything the peer sends back beyond a refusal is an answer: application bytes, an HTTP
response, a Dask reply, a ZeroMQ message. The refusals are: nothing, a closed connection, a
TLS alert, and a ZeroMQ peer that closes the connection when offered no key (CURVE).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
import sys
import tempfile
import time

ZMTP_NULL_GREETING = (
    b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" * 32
)


def recv_all(sock: socket.socket, seconds: float, most: int = 1 << 20) -> bytes:
    sock.settimeout(0.2)
    data, end = b"", time.monotonic() + seconds
    while time.monotonic() < end and len(data) < most:
        try:
            chunk = sock.recv(min(65536, most - len(data)))
        except TimeoutError:
            continue
        except OSError:
            break
        if not chunk:
            break
        data += chunk
    return data


def zmtp_handshake(host: str, port: int) -> tuple[bool, bytes]:
    """(whether the peer speaks ZeroMQ, what it sent after we offered the NULL mechanism:
    its greeting and READY when it accepts a peer without a key; nothing when it demands
    CURVE, for then it closes the connection)."""
    with socket.create_connection((host, port), timeout=3) as s:
        signature = recv_all(s, 0.5, 10)
        if len(signature) < 10 or signature[0] != 0xFF or signature[9] != 0x7F:
            return False, b""
        s.sendall(ZMTP_NULL_GREETING)
        return True, recv_all(s, 1.5)


def zmq_messages(host: str, port: int, canary: str) -> list[str]:
    """Messages a key-less ZeroMQ peer gets: as DEALER after an unsigned execute_request,
    and as SUB subscribed to everything."""
    import zmq
    from jupyter_client.session import Session

    ctx = zmq.Context()
    got = []
    try:
        dealer = ctx.socket(zmq.DEALER)
        dealer.linger = 0
        dealer.connect(f"tcp://{host}:{port}")
        session = Session(key=b"")
        code = f"open({canary!r}, 'w').close()"
        dealer.sndtimeo = 1000  # with no peer (a refused handshake) a send would wait forever
        for kind, content in (
            ("execute_request", {"code": code, "silent": False}),
            ("connection_request", {}),
        ):
            try:
                session.send(dealer, kind, content)
            except zmq.Again:
                break
        sub = ctx.socket(zmq.SUB)
        sub.linger = 0
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(f"tcp://{host}:{port}")
        poller = zmq.Poller()
        poller.register(dealer, zmq.POLLIN)
        poller.register(sub, zmq.POLLIN)
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            for sock, _ in poller.poll(100):
                frames = sock.recv_multipart()
                got.append(b"|".join(frames)[:120].decode(errors="replace"))
    finally:
        ctx.destroy(linger=0)
    return got


def stranger_tls(tmp: str):
    """A client TLS context with a certificate of the stranger's own CA (self-signed)."""
    import subprocess

    key, cert = os.path.join(tmp, "k.pem"), os.path.join(tmp, "c.pem")
    if not os.path.exists(cert):
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-days", "1", "-subj", "/CN=stranger", "-keyout", key, "-out", cert],
            check=True, capture_output=True,
        )  # fmt: skip
    return key, cert


def tls_try(host: str, port: int, with_cert: tuple[str, str] | None) -> str:
    """Handshake (with or without a client certificate), send an HTTP request; return the
    application bytes that came back (the refusal shows as an error or an empty read)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if with_cert:
        ctx.load_cert_chain(with_cert[1], with_cert[0])
    try:
        with socket.create_connection((host, port), timeout=3) as raw:
            with ctx.wrap_socket(raw) as s:
                s.sendall(b"GET /health HTTP/1.0\r\nHost: x\r\n\r\n")
                return recv_all(s, 1.5)[:200].decode(errors="replace")
    except (ssl.SSLError, OSError):
        return ""


def plain_http(host: str, port: int) -> str:
    try:
        with socket.create_connection((host, port), timeout=3) as s:
            s.sendall(b"GET /health HTTP/1.0\r\nHost: x\r\n\r\n")
            data = recv_all(s, 1.5)
    except OSError:
        return ""
    if data[:1] == b"\x15":  # a TLS alert record: a refusal, not an answer
        return ""
    return data[:200].decode(errors="replace")


def dask_run(host: str, port: int, canary: str, cert: tuple[str, str] | None) -> str:
    """Dask's own client side: connect, send {"op": "run"} creating the canary, read."""
    from distributed.comm import connect

    async def attempt() -> str:
        kwargs = {}
        if cert:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            ctx.load_cert_chain(cert[1], cert[0])
            kwargs = {"ssl_context": ctx}
        comm = await connect(f"{'tls' if cert else 'tcp'}://{host}:{port}", timeout=3, **kwargs)
        return await run_canary(comm, canary)

    return quietly(attempt)


async def run_canary(comm, canary: str) -> str:
    """On a connected Dask comm: send {"op": "run"} creating the canary, read the reply."""
    from pathlib import Path

    from distributed.protocol.pickle import dumps

    try:
        await comm.write({"op": "run", "function": dumps(Path(canary).touch), "reply": True})
        reply = await asyncio.wait_for(comm.read(), 3)
        return repr(reply)[:200]
    finally:
        comm.abort()


def quietly(attempt) -> str:
    """Run the coroutine function ``attempt`` (10 s at most): what it returned, or "" for
    any error (every refusal looks like some error here)."""
    try:
        return asyncio.run(asyncio.wait_for(attempt(), 10))
    except Exception:  # noqa: BLE001
        return ""


def unix_connect(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect(path)
    except OSError:
        s.close()
        raise
    return s


def unix_http(path: str) -> str:
    try:
        with unix_connect(path) as s:
            s.sendall(b"GET /health HTTP/1.0\r\nHost: x\r\n\r\n")
            return recv_all(s, 1.5)[:200].decode(errors="replace")
    except OSError:
        return ""


def unix_dask_run(path: str, canary: str) -> str:
    """Dask's comm over the socket, as a Dask client would speak it: the handshake, then
    {"op": "run"} creating the canary."""
    from distributed.comm.tcp import TCP
    from tornado.iostream import IOStream

    async def attempt() -> str:
        sock = unix_connect(path)
        sock.setblocking(False)
        # (Dask's TCP framing on the socket; the addresses are labels Dask can parse)
        comm = TCP(IOStream(sock), "tcp://127.0.0.1:1", "tcp://127.0.0.1:2")
        try:
            await comm.write(comm.handshake_info())
            await asyncio.wait_for(comm.read(), 3)
        except BaseException:
            comm.abort()
            raise
        return await run_canary(comm, canary)

    return quietly(attempt)


def probe_unix(path: str, canary: str) -> dict:
    try:
        unix_connect(path).close()
    except OSError as e:  # the folder or the socket's mode: no way in
        return {"port": path, "zmtp": False, "answers": {}, "unreachable": str(e)}
    answers = {}
    for name, fn in (
        ("http", lambda: unix_http(path)),
        ("dask", lambda: unix_dask_run(path, canary)),
    ):
        reply = fn()
        if reply:
            answers[name] = reply
    return {"port": path, "zmtp": False, "answers": answers, "connected": True}


def probe(target: str, canary: str, cert: tuple[str, str]) -> dict:
    if target.startswith("/"):
        return probe_unix(target, canary)
    host, port = target.rsplit(":", 1)
    port = int(port)
    try:
        zmtp, after = zmtp_handshake(host, port)
    except OSError as e:  # nothing listens there (any more): nothing to answer either
        return {"port": target, "zmtp": False, "answers": {}, "unreachable": str(e)}
    answers = {}
    if zmtp and after:
        answers["zmtp"] = after[:120].decode(errors="replace")
    elif zmtp:
        got = zmq_messages(host, port, canary)
        if got:
            answers["zmq"] = got
    else:
        for name, fn in (
            ("http", lambda: plain_http(host, port)),
            ("tls", lambda: tls_try(host, port, None)),
            ("tls-own-ca", lambda: tls_try(host, port, cert)),
            ("dask", lambda: dask_run(host, port, canary, None)),
            ("dask-tls", lambda: dask_run(host, port, canary, cert)),
        ):
            reply = fn()
            if reply:
                answers[name] = reply
    return {"port": target, "zmtp": zmtp, "answers": answers}


def main() -> None:
    from concurrent.futures import ThreadPoolExecutor

    canary, targets = sys.argv[1], sys.argv[2:]
    cert = stranger_tls(tempfile.mkdtemp(prefix="stranger-"))
    with ThreadPoolExecutor(16) as pool:  # every port at once: each probe mostly waits
        for row in pool.map(lambda t: probe(t, canary, cert), targets):
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
