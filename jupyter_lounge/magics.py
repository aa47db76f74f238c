"""``%lounge`` and ``%%lounge``: the notebook face of the cluster API. What each command
does is in ``faces`` (shared with the ``lounge`` command)."""

from __future__ import annotations

import shlex

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class

from . import commands, faces
from .errors import LoungeError


@magics_class
class LoungeMagics(Magics):
    @line_cell_magic
    def lounge(self, line: str, cell: str | None = None):
        """Start, scale, inspect and stop engine clusters; as a cell magic, run the cell on
        every engine of the current cluster (``%%lounge NAME`` for another one)."""
        try:
            if cell is not None:
                name = line.strip() or None
                cluster = faces.MAGIC.cluster(name, "")
                faces.follow(cluster)  # a cell right after a start waits for every engine
                short = faces.ran(cluster.execute(cell))
                if short:
                    print(short, end="")
                return None
            return self._line(shlex.split(line))
        except LoungeError as e:
            raise UsageError(str(e)) from None

    def _line(self, words: list[str]):
        out = faces.run(commands.parse(words), faces.MAGIC)
        if isinstance(out, str):  # text is printed; a Cluster is the magic's value
            print(out)
            return None
        return out
