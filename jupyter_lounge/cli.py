"""``lounge``: the shell face. A cluster started here keeps running after the command ends,
until ``lounge stop NAME``; any process can attach to it by name."""

from __future__ import annotations

import sys

from . import commands
from .errors import LoungeError


def run(argv: list[str]) -> int:
    from .cluster import Cluster
    from .manager import ClusterManager

    args = commands.parse(argv, prog="lounge")
    manager = ClusterManager()
    if args.command == "help":
        print(commands.usage("lounge"))
    elif args.command == "start":
        cluster = Cluster(args.n, stop_at_exit=False, **commands.start_options(args)).start_sync()
        print(f"Started {cluster.name}: {cluster.describe()}")
        print(
            f"Attach with: from jupyter_lounge import Lounge; lounge = Lounge.attach("
            f"{cluster.name!r})   or   %lounge attach {cluster.name}"
        )
    elif args.command == "scale":
        if not args.name:
            raise LoungeError("Say which cluster to scale: `lounge scale N --name NAME`.")
        manager.scale(args.name, args.n)
        print(f"Scaled {args.name} to {args.n} engines.")
    elif args.command == "interrupt":
        if not args.name:
            raise LoungeError("Say which cluster to interrupt: `lounge interrupt NAME`.")
        print(manager.interrupt(args.name))
    elif args.command == "status":
        names = [args.name] if args.name else manager.names()
        if not names:
            print("No cluster is running; start one with `lounge start N`.")
        for name in names:
            print(commands.format_status(manager.status(name)))
    elif args.command == "list":
        print(commands.format_list(manager.list()))
    elif args.command == "nodes":
        print(commands.format_nodes(args))
    elif args.command == "sync":
        print(commands.format_sync(args))
    elif args.command == "stop":
        if not args.name:
            raise LoungeError("Say which cluster to stop: `lounge stop NAME` (see `lounge list`).")
        for line in manager.stop(args.name, forget=args.forget):
            print(f"Stopped what was left of it: {line}")
        print(f"{'Forgot' if args.forget else 'Stopped'} {args.name}.")
    elif args.command == "attach":
        cluster = Cluster.attach(args.name)
        print(f"{cluster.name}: {cluster.describe()}")
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
