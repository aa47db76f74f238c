"""jupyter_lounge: seconds from ``%lounge start 30`` to 30 engines with TensorFlow imported.

Imports are lazy: the node agent imports this package before it forks, and must stay light.
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = [
    "Lounge",
    "Cluster",
    "ClusterManager",
    "LoungeError",
    "current",
    "run",
    "runs",
    "data",
    "load_ipython_extension",
]


def __getattr__(name: str):
    if name in ("Lounge", "Cluster"):
        from .cluster import Cluster

        return Cluster
    if name == "current":
        from .cluster import current

        return current
    if name in ("run", "runs"):  # runs of any cluster, running or stopped (runstore.py)
        from . import runstore

        return getattr(runstore, name)
    if name == "data":  # in an engine: a staged data set's folder on its node (stage.py)
        from .stage import data

        return data
    if name == "ClusterManager":
        from .manager import ClusterManager

        return ClusterManager
    if name == "LoungeError":
        from .errors import LoungeError

        return LoungeError
    raise AttributeError(name)


def load_ipython_extension(ipython) -> None:
    from .magics import LoungeMagics

    ipython.register_magics(LoungeMagics)
