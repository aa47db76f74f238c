"""``lounge``: the shell face. A cluster started here keeps running after the command ends,
until ``lounge stop NAME``; any process can attach to it by name. What each command does is
in ``faces`` (shared with the magic)."""

from __future__ import annotations

import sys

from . import commands, faces
from .errors import LoungeError


def run(argv: list[str]) -> int:
    out = faces.run(commands.parse(argv, prog="lounge"), faces.SHELL)
    if out is not None:
        print(out)
    return 0


def main(argv: list[str] | None = None) -> None:
    try:
        code = run(sys.argv[1:] if argv is None else argv)
    except LoungeError as e:
        print(f"lounge: {e}", file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)


if __name__ == "__main__":
    main()
