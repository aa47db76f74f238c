"""A cluster's ipyparallel controller: ``python -m jupyter_lounge.engines.ipp_controller``
with ``ipyparallel.controller``'s own arguments.

It is the stock controller but for two things that make a registration flood slow, both
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


def controller_class() -> type:
    from ipyparallel.controller.app import IPController

    class LoungeController(IPController):
        def init_hub(self):
            super().init_hub()
            if not self.restore_engines:  # what the file is for: see the docstring
                self.hub.engine_state_file = ""

    return LoungeController


def main() -> None:
    _listen_with_backlog()
    controller_class().launch_instance()


if __name__ == "__main__":
    main()
