"""The words of ``%lounge`` and ``lounge``: one parser for the magic and the CLI, and the
tables they print. Bad input becomes one LoungeError sentence, never an argparse exit."""

from __future__ import annotations

import argparse
import math
import time

from .backends import OPTIONS as _BACKEND_FLAGS
from .errors import LoungeError

USAGE = """\
%lounge start N [--engines ipyparallel|dask] [--backend local|slurm] [--nodes M] [--name NAME]
               [--preload mod1,mod2] [--wait] [--timeout S] [--no-restart] [--courtesy]
               [--dashboard] (Dask's, on loopback)  [--no-tls] (local only: no encryption)
               Slurm: [--partition P] [--account A] [--qos Q] [--time 1:00:00]
               [--engines-per-node K] [--cpus-per-engine C] [--mem-per-engine 2G]
               [--gpus-per-node G] [--sbatch=--constraint=a100 ...]
%lounge scale N [--name NAME]     %lounge status [NAME]     %lounge list
%lounge stop [NAME] [--forget]    %lounge attach NAME
%lounge interrupt [NAME]          (stop the running work on every engine; the cluster stays)
%lounge start N --backend ssh [--pool P] [--inventory lounge.toml] [--strict] [--sync]
%lounge nodes [--pool P] [--live] [--json] [--inventory lounge.toml]   (the lounge's PCs)
%lounge sync [--pool P] [--inventory lounge.toml] [--force]   (ship this env to them once)
%%lounge [NAME]                   (as a cell magic: run the cell on every engine)"""


def _positive(cast, what: str):
    """An argparse type: a number above 0, or a message saying what was wrong."""

    def convert(text: str):
        try:
            value = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what} above 0, not {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, not {text!r}")
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be {what} above 0, not {value:g}")
        return value

    return convert


positive_int = _positive(int, "a whole number")
positive_float = _positive(float, "a number of seconds")


class _Parser(argparse.ArgumentParser):
    hint = "%lounge help"

    def error(self, message: str):  # argparse would print and exit; we raise one sentence
        hint = self.hint
        if message.startswith("unrecognized arguments:"):
            extra = message.split(":", 1)[1].strip()
            raise LoungeError(f"Unknown option {extra}: see `{hint}` for the options.")
        if "required: n" in message:
            raise LoungeError(
                f"Say how many engines, e.g. `{hint.split()[0]} {self.prog.split()[-1]} 8`."
            )
        if message.startswith("argument "):
            what, _, why = message[len("argument ") :].partition(": ")
            names = {
                "n": "The number of engines",
                "--nodes": "--nodes",
                "--timeout": "--timeout",
                "--engines": "--engines",
                "--backend": "--backend",
                "command": "The command",
            }
            what = names.get(what.split("/")[0], what)
            raise LoungeError(f"{what} {why} (see `{hint}`).")
        raise LoungeError(f"{message[0].upper()}{message[1:]} (see `{hint}`).")


def build_parser(prog: str = "%lounge") -> argparse.ArgumentParser:
    parser_class = type("Parser", (_Parser,), {"hint": f"{prog} help"})
    parser = parser_class(prog=prog, add_help=False)
    sub = parser.add_subparsers(dest="command", parser_class=parser_class, required=True)
    start = sub.add_parser("start", add_help=False)
    start.add_argument("n", type=positive_int)
    start.add_argument("--engines", default="ipyparallel")  # checked by engine_kind()
    start.add_argument("--backend", default="local")  # checked by make_backend()
    start.add_argument("--nodes", type=positive_int, default=None)
    start.add_argument("--name")
    start.add_argument("--preload", default="")
    start.add_argument("--wait", action="store_true")
    start.add_argument("--timeout", type=positive_float, default=120.0)
    start.add_argument("--no-restart", dest="restart", action="store_false")
    start.add_argument("--tls", dest="tls", action="store_true", default=True)  # the default
    start.add_argument("--no-tls", dest="tls", action="store_false")  # local only
    start.add_argument("--dashboard", action="store_true")
    start.add_argument("--courtesy", action="store_true")
    slurm = {
        "--partition": str,
        "--account": str,
        "--qos": str,
        "--time": str,
        "--engines-per-node": positive_int,
        "--cpus-per-engine": positive_int,
        "--mem-per-engine": str,
        "--gpus-per-node": int,
    }
    for flag, kind in slurm.items():
        dest = "time_limit" if flag == "--time" else flag[2:].replace("-", "_")
        start.add_argument(flag, dest=dest, type=kind, default=None)
    start.add_argument("--sbatch", dest="extra_directives", action="append", default=None)
    start.add_argument("--pool", default=None)  # ssh: which inventory pool
    start.add_argument("--inventory", default=None)  # ssh: which lounge.toml
    start.add_argument("--strict", action="store_const", const=True, default=None)
    start.add_argument("--sync", action="store_const", const=True, default=None)
    scale = sub.add_parser("scale", add_help=False)
    scale.add_argument("n", type=positive_int)
    scale.add_argument("--name")
    sub.add_parser("status", add_help=False).add_argument("name", nargs="?")
    sub.add_parser("interrupt", add_help=False).add_argument("name", nargs="?")
    stop = sub.add_parser("stop", add_help=False)
    stop.add_argument("name", nargs="?")
    stop.add_argument("--forget", action="store_true")
    sub.add_parser("attach", add_help=False).add_argument("name")
    sub.add_parser("list", add_help=False)
    nodes = sub.add_parser("nodes", add_help=False)
    nodes.add_argument("--inventory")
    nodes.add_argument("--pool")
    nodes.add_argument("--live", action="store_true")  # ask each node over SSH now
    nodes.add_argument("--json", action="store_true")
    sync = sub.add_parser("sync", add_help=False)
    sync.add_argument("--inventory")
    sync.add_argument("--pool")
    sync.add_argument("--force", action="store_true")  # ship even where it is present
    sync.add_argument("--json", action="store_true")
    sub.add_parser("help", add_help=False)
    return parser


def usage(prog: str = "%lounge") -> str:
    if prog == "%lounge":
        return USAGE
    return "\n".join(USAGE.replace("%lounge", prog).splitlines()[:-1])


def parse(words: list[str], prog: str = "%lounge") -> argparse.Namespace:
    if not words:
        raise LoungeError(f"Say what to do, e.g. `{prog} start 8`; see `{prog} help`.")
    known = ("start", "scale", "status", "interrupt", "stop", "attach", "list", "nodes", "sync")
    known += ("help",)
    if words[0] not in known:
        raise LoungeError(f"Unknown command {words[0]!r}: use one of {', '.join(known)}.")
    return build_parser(prog).parse_args(words)


# The magic's backend flags: what a start request may give each backend, and --sbatch.
BACKEND_OPTIONS = (*_BACKEND_FLAGS["ssh"], *_BACKEND_FLAGS["slurm"], "extra_directives")


def start_options(args: argparse.Namespace) -> dict:
    backend_options = {k: getattr(args, k) for k in BACKEND_OPTIONS if getattr(args, k) is not None}
    return backend_options | {
        "name": args.name,
        "engines": args.engines,
        "backend": args.backend,
        "nodes": args.nodes,
        "preload": args.preload,
        "wait": args.wait,
        "timeout": args.timeout,
        "restart": args.restart,
        "tls": args.tls,
        "dashboard": args.dashboard,
        "courtesy": args.courtesy or None,
    }


def format_table(rows: list[dict], columns: list[str]) -> str:
    if not rows:
        return "(none)"
    cells = [[str(r.get(c, "") if r.get(c) is not None else "") for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


def format_status(status: dict) -> str:
    head = (
        f"{status['name']}: {status['engines']} on {status['backend']}, "
        f"{status['status']}, {status['ready']}/{status['target']} engines ready"
    )
    return (
        head
        + "\n"
        + format_table(
            status["nodes_status"],
            [
                "node",
                "status",
                "ready",
                "target",
                "cpu",
                "mem",
                "gpu",
                "users",
                "agent",
                "launch",
                "error",
            ],
        )
    )


def format_nodes(args: argparse.Namespace) -> str:
    """The inventory as a table (or JSON); with --live, each node's state asked over SSH."""
    import json

    from . import inventory

    inv = inventory.load(args.inventory)
    names = {n.name for n in inv.select(args.pool)}  # an unknown pool is an error
    if args.live:
        from ._loop import run_sync
        from .backends.ssh import SSHBackend
        from .survey import ask_lounge

        rows = run_sync(ask_lounge(SSHBackend(inventory=str(inv.path), pool=args.pool)))
        if not args.json:
            rows = [node_cells(row) for row in rows]
        columns = ["name", "host", "state", "cpu", "mem", "gpu", "users", "pools", "why"]
    else:
        rows = [r for r in inv.rows() if r["name"] in names]
        columns = ["name", "host", "user", "port", "gpus", "engines", "pools"]
    if args.json:
        return json.dumps(rows, indent=1)
    return f"{inv.path}:\n" + format_table(rows, columns)


def node_cells(row: dict) -> dict:
    """A node row (``survey``'s shape) as table cells."""
    return {
        **row,
        "gpu": ",".join(f"{g['util_percent']}%" for g in row["gpus"]),
        "users": ",".join(row["users"]),
        "pools": ",".join(row["pools"]),
    }


def format_sync(args: argparse.Namespace) -> str:
    """Preposition this environment on the lounge's nodes; one row per node saying what
    happened. Raises when no node has it afterwards."""
    import json

    from ._loop import run_sync
    from .backends.ssh import SSHBackend

    backend = SSHBackend(inventory=args.inventory, pool=args.pool)
    rows = run_sync(backend.sync(force=args.force))
    if not any(r["status"] in ("present", "shipped") for r in rows):
        why = "; ".join(f"{r['node']}: {r['status'].removeprefix('failed: ')}" for r in rows)
        raise LoungeError(f"No lounge node has the environment now ({why}).")
    if args.json:
        return json.dumps(rows, indent=1)
    return format_table(rows, ["node", "status", "MiB", "seconds", "env"])


def format_list(rows: list[dict]) -> str:
    for r in rows:
        r["age"] = time.strftime("%H:%M:%S", time.gmtime(r["age_s"]))
    return format_table(
        rows, ["name", "engines", "backend", "n", "nodes", "status", "age", "preload", "error"]
    )


# -- the REST API's bodies (the sidebar's words) -----------------------------------------------
#: What a start request may hold besides each backend's options (``backends.OPTIONS``).
START_KEYS = ("n", "backend", "engines", "pool", "preload", "name", "nodes", "timeout")
#: The type each backend option takes in a start request, and how to say it.
OPTION_TYPES = {str: "a string", int: "a whole number", bool: "true or false"}
OPTION_TYPE = {
    "partition": str,
    "account": str,
    "qos": str,
    "time_limit": str,
    "mem_per_engine": str,
    "engines_per_node": int,
    "cpus_per_engine": int,
    "gpus_per_node": int,
    "pool": str,
    "inventory": str,
    "strict": bool,
    "sync": bool,
}


def _engines_wanted(body: dict, example: int) -> int:
    if "n" not in body:
        raise LoungeError(f'Say how many engines, e.g. {{"n": {example}}}.')
    n = body["n"]
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise LoungeError(f"The number of engines must be a whole number above 0, not {n!r}.")
    return n


def start_request(body: dict) -> dict:
    """The Cluster arguments of a start request of the REST API (``POST clusters``), or a
    LoungeError naming the first mistake."""
    from .backends import OPTIONS

    if not isinstance(body, dict):
        raise LoungeError('The request body must be a JSON object, e.g. {"n": 4}.')
    backend_keys = {k for names in OPTIONS.values() for k in names}
    unknown = sorted(set(body) - set(START_KEYS) - backend_keys)
    if unknown:
        raise LoungeError(
            f"Unknown option {unknown[0]!r}: use {', '.join(START_KEYS)} or an option of "
            "the backend (GET /jupyter-lounge/backends lists them)."
        )
    options = {
        "n": _engines_wanted(body, 4),
        "name": body.get("name"),
        "backend": body.get("backend") or "local",
        "engines": body.get("engines") or "ipyparallel",
        "nodes": body.get("nodes"),
    }
    preload = body.get("preload") or []
    if not isinstance(preload, (str, list)) or not all(isinstance(m, str) for m in preload):
        raise LoungeError(
            f'preload must be module names, e.g. "tensorflow,numpy", not {preload!r}.'
        )
    timeout = body.get("timeout")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0
    ):
        raise LoungeError(f"The timeout must be a number of seconds above 0, not {timeout!r}.")
    options["preload"], options["timeout"] = preload, timeout or 120.0
    for key in sorted(backend_keys & set(body)):
        value = body[key]
        if value is None:
            continue
        kind = OPTION_TYPE[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise LoungeError(f"The option {key!r} must be {OPTION_TYPES[kind]}, not {value!r}.")
        options[key] = value
    return options


def scale_request(body: dict) -> int:
    """The engine count of a scale request of the REST API (``PATCH clusters/NAME``)."""
    if not isinstance(body, dict):
        raise LoungeError('The request body must be a JSON object, e.g. {"n": 6}.')
    unknown = sorted(set(body) - {"n"})
    if unknown:
        raise LoungeError(f"Unknown option {unknown[0]!r}: a scale request takes only n.")
    return _engines_wanted(body, 6)
