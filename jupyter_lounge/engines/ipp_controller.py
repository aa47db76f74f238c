"""A cluster's ipyparallel controller: ``python -m jupyter_lounge.engines.ipp_controller``
with ``ipyparallel.controller``'s own arguments.

It is the stock controller but for three things that make a registration flood slow, all
found while 4,096 simulated engines registered (``bench/controller_scale.py``):

* Its listening sockets queue 4,096 connections, not ZMQ's default 100 (``BACKLOG``). With
  100, the kernel dropped connections by the hundred thousand (``ListenOverflows``), each
  then waiting for TCP to try again; with 4,096, none: 4,096 engines registered at 175/s
  instead of 96 to 102/s on this machine's 2 cores (1,024: 179/s, unchanged).
* Its hub does not write the whole engine table as JSON at every registration and
  unregistration (``Hub._save_engine_state``: O(N^2) bytes as a cluster starts, about 800 MB
  at 4,096; 41% of the hub's time in a py-spy profile of that flood). The file serves
  ``--restore`` (``IPController.restore_engines``) when a controller is restarted over
  running engines; a lounge cluster never restarts its controller (engines whose controller
  is gone are stopped by their agents). Alone, this did not move the rate here.
* Its hub finds a registration's clash with the pending ones by key, where the stock hub
  compares it with every pending registration through traitlets (half the hub's time in
  that flood, O(pending) per engine): the hub's CPU per registered engine went from 1.5 to
  0.9 ms at 4,096. The rate here is bound by the machine's 2 cores, which the simulators
  share (see docs/scale.md), so it stayed near 195/s.

And its heart monitor reads the engines' answers to a ping all at once, at the next beat
(``_heart_monitor_class``), where the stock one handles each as its own event.
"""

from __future__ import annotations

#: Connections each listening socket of the controller queues before it accepts them. ZMQ's
#: default is 100: when hundreds of engines register at once (8 connections each), the rest
#: overflow the kernel's queue and wait for TCP to try again (after 1 s, then 3 s, ...).
BACKLOG = 4096


def _listen_with_backlog() -> None:
    """Every ZMQ socket made in this process and the ones it forks (the hub's, the
    schedulers', the heart monitor's) gets ``BACKLOG``."""
    import zmq

    stock = zmq.Context.socket

    def socket(self, socket_type, *args, **kwargs):
        made = stock(self, socket_type, *args, **kwargs)
        made.setsockopt(zmq.BACKLOG, BACKLOG)
        return made

    zmq.Context.socket = socket


class _Pending(dict):
    """The hub's pending registrations (engine heart id -> its EngineConnector), which also
    know the heart id of each pending engine id."""

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.hearts_by_id: dict = {}
        self.update(*args, **kwargs)

    def update(self, *args, **kwargs) -> None:
        for heart, connector in dict(*args, **kwargs).items():
            self[heart] = connector

    def __setitem__(self, heart, connector) -> None:
        if heart in self:
            self.hearts_by_id.pop(self[heart].id, None)
        super().__setitem__(heart, connector)
        self.hearts_by_id[connector.id] = heart

    def __delitem__(self, heart) -> None:
        self.hearts_by_id.pop(self[heart].id, None)
        super().__delitem__(heart)

    def pop(self, heart, *default):
        if heart in self:
            self.hearts_by_id.pop(self[heart].id, None)
        return super().pop(heart, *default)

    def clear(self) -> None:
        self.hearts_by_id.clear()
        super().clear()


def _register_keyed(hub, register, reg, msg):
    """The stock ``Hub.register_engine``, but its look for a clash among the pending
    registrations is keyed, not a scan of every one of them (the scan, through traitlets,
    was half the hub's time while 4,096 engines registered). The stock method runs with
    only the pending registrations it could clash with in view (the same heart, and the
    engine id asked for), then what it added joins the rest."""
    pending = hub.incoming_registrations
    content = msg.get("content") if isinstance(msg, dict) else None
    uuid = content.get("uuid") if isinstance(content, dict) else None
    if not isinstance(pending, _Pending) or not isinstance(uuid, str):
        return register(reg, msg)  # the stock way, which says what is wrong
    near = [uuid.encode("utf8"), pending.hearts_by_id.get(content.get("id"))]
    hub.incoming_registrations = {h: pending[h] for h in near if h in pending}
    try:
        return register(reg, msg)
    finally:
        seen = hub.incoming_registrations
        hub.incoming_registrations = pending
        for heart, connector in seen.items():
            if pending.get(heart) is not connector:
                pending[heart] = connector


def _heart_monitor_class() -> type:
    import time

    import zmq
    from ipyparallel.controller.heartmonitor import HeartMonitor
    from tornado import ioloop

    class LoungeHeartMonitor(HeartMonitor):
        """The stock heart monitor, but the engines' answers (pongs) wait in its socket and
        are read all at once as it beats, not each through the event loop as it comes: the
        stock way cost ~17 us of Python per pong here, this ~3 us, and at 256 engines and
        150 ms that is 1,700 pongs a second: the heart monitor of 256 idle engines took 6.0
        to 6.6% of a core, the stock one 8.6 (most of the rest is CurveZMQ and TCP in ZMQ's
        I/O thread; a launch's time did not move within this machine's noise). What a beat
        decides is the stock one's: an answer to the last ping counts, one to the ping
        before is late but counts, any other is ignored."""

        def start(self):
            self.monitor_stream.socket.recv_multipart()  # the hub has subscribed
            self.tic = time.monotonic()
            self.caller = ioloop.PeriodicCallback(self.beat, self.period)
            self.caller.start()

        def take_pongs(self) -> None:
            socket = self.pong_stream.socket
            current = str(self.lifetime).encode("ascii")
            last = str(self.last_ping).encode("ascii")
            late = other = 0
            while True:
                try:
                    heart, *rest = socket.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                stamp = rest[0] if rest else None
                if stamp == current:
                    self.responses.add(heart)
                elif stamp == last:
                    self.responses.add(heart)
                    late += 1
                else:
                    other += 1
            if late or other:
                self.log.warning(
                    "heartbeat: %d engines answered a beat late, %d with an unknown beat",
                    late,
                    other,
                )

        def beat(self):
            self.take_pongs()  # before the beat's stamps move on
            self.last_ping = self.lifetime
            toc = time.monotonic()
            self.lifetime += toc - self.tic
            self.tic = toc
            good = self.hearts & self.responses
            new = self.responses - good
            if new:
                self.handle_new_hearts(new)
            failures, self.on_probation = self._check_missed(
                self.hearts - good, self.on_probation, self.hearts
            )
            if failures:
                self.handle_heart_failure(failures)
            self.responses = set()
            self.ping_stream.send(str(self.lifetime).encode("ascii"))
            self.ping_stream.flush()

    return LoungeHeartMonitor


def _use_lounge_heart_monitor() -> None:
    """The controller starts its heart monitor in a forked process, which makes the class
    named in this module: ours, from then on."""
    from ipyparallel.controller import heartmonitor

    heartmonitor.HeartMonitor = _heart_monitor_class()


def controller_class() -> type:
    from functools import partial

    from ipyparallel.controller.app import IPController

    class LoungeController(IPController):
        def construct_url(self, kind, channel, index=None):
            # An ipc:// address joins its path and "port" with "-" here but with ":" in
            # ipyparallel's engines and clients (9.x), which then found nothing: ":" here too.
            url = super().construct_url(kind, channel, index)
            info = {"engine": self.engine_info, "client": self.client_info}.get(
                kind, self.internal_info
            )
            interface = info["interface"]
            if interface.startswith("ipc://") and url.startswith(interface + "-"):
                url = f"{interface}:{url[len(interface) + 1 :]}"
            return url

        def init_hub(self):
            super().init_hub()
            hub = self.hub
            if not self.restore_engines:  # what the file is for: see the docstring
                hub.engine_state_file = ""
            hub.incoming_registrations = _Pending(hub.incoming_registrations)
            hub.query_handlers["registration_request"] = partial(
                _register_keyed, hub, hub.register_engine
            )

    return LoungeController


def main() -> None:
    _listen_with_backlog()
    _use_lounge_heart_monitor()
    controller_class().launch_instance()


if __name__ == "__main__":
    main()
