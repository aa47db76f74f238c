"""A cluster's ipyparallel controller: ``python -m jupyter_lounge.engines.ipp_controller``
with ``ipyparallel.controller``'s own arguments.

It is the stock controller but for one piece of its hub's work per registration. Measured
with py-spy while 4,096 simulated engines registered (``bench/controller_scale.py``), 41% of
the hub's time went to ``Hub._save_engine_state``: at every registration and unregistration
it writes the whole engine table as JSON into the profile's log folder, so a cluster of N
engines writes O(N^2) bytes as it starts (4,096 engines: about 800 MB). That file serves
``--restore`` (``IPController.restore_engines``) when a controller is restarted over running
engines; a lounge cluster never restarts its controller (engines whose controller is gone are
stopped by their agents), so here it is not written. (On the 2 cores of the machine it was
measured on, the rate of registration did not change, 100/s at 4,096 before and after: the
simulated engines' own work on the same cores bounds it first.)
"""

from __future__ import annotations


def controller_class() -> type:
    from ipyparallel.controller.app import IPController

    class LoungeController(IPController):
        def init_hub(self):
            super().init_hub()
            if not self.restore_engines:  # what the file is for: see the docstring
                self.hub.engine_state_file = ""

    return LoungeController


def main() -> None:
    controller_class().launch_instance()


if __name__ == "__main__":
    main()
