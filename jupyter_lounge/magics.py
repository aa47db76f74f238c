"""``%lounge`` and ``%%lounge``: the notebook face of the cluster API."""

from __future__ import annotations

import shlex

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class

from . import commands
from .cluster import Cluster, current
from .errors import LoungeError
from .manager import ClusterManager


def _cluster(name: str | None) -> Cluster:
    return Cluster.attach(name) if name else current()


@magics_class
class LoungeMagics(Magics):
    @line_cell_magic
    def lounge(self, line: str, cell: str | None = None):
        """Start, scale, inspect and stop engine clusters; as a cell magic, run the cell on
        every engine of the current cluster (``%%lounge NAME`` for another one)."""
        try:
            if cell is not None:
                name = line.strip() or None
                _cluster(name).execute(cell)
                return None
            return self._line(shlex.split(line))
        except LoungeError as e:
            raise UsageError(str(e)) from None

    def _line(self, words: list[str]):
        args = commands.parse(words)
        manager = ClusterManager()
        if args.command == "help":
            print(commands.usage())
        elif args.command == "start":
            return Cluster(args.n, **commands.start_options(args)).start_sync()
        elif args.command == "scale":
            _cluster(args.name).scale_sync(args.n)
        elif args.command == "interrupt":
            print(_cluster(args.name).interrupt_sync())
        elif args.command == "status":
            print(commands.format_status(manager.status(args.name or current().name)))
        elif args.command == "list":
            print(commands.format_list(manager.list()))
        elif args.command == "nodes":
            print(commands.format_nodes(args))
        elif args.command == "sync":
            print(commands.format_sync(args))
        elif args.command == "stop":
            if args.name:
                for line in manager.stop(args.name, forget=args.forget):
                    print(f"Stopped what was left of it: {line}")
            else:
                current().stop_sync(forget=args.forget)
        elif args.command == "attach":
            return Cluster.attach(args.name)
        return None
