"""The words of ``%lounge`` and ``lounge``: one parser for the magic and the CLI, and the
tables they print. Bad input becomes one LoungeError sentence, never an argparse exit.

The backend flags are the backends' own option declarations (``backends.options``); what
each command does is in ``faces``."""

from __future__ import annotations

import argparse
import json
import math
import time

from .backends import options as backend_options
from .errors import LoungeError

USAGE = """\
%lounge start N [--engines {kinds}] [--backend {backends}] [--nodes M] [--name NAME]
               [--preload mod1,mod2] [--wait] [--timeout S] [--no-restart] [--courtesy]
               [--dashboard] (Dask's, on loopback)  [--no-tls] (local only: no encryption)
               [--profile NAME] (a set of defaults)  (--restart, --no-courtesy, --no-strict,
               ... undo a configured default; what is left out: see %lounge config)
               [--dry-run] (Slurm: print the batch script it would submit; start nothing)
               [--stage NAME=DIR] (a data set on each node's disk: lounge.data("NAME"))
{slurm}
%lounge scale N [--name NAME]     %lounge status [NAME]     %lounge list
%lounge stop [NAME] [--forget]    %lounge attach NAME
%lounge interrupt [NAME]          (stop the running work on every engine; the cluster stays)
%lounge start N --backend ssh {ssh}
%lounge nodes [--pool P] [--live] [--json] [--inventory lounge.toml]   (the lounge's PCs)
%lounge sync [--pool P] [--inventory lounge.toml] [--force]   (ship this env to them once)
%lounge doctor [NODE] [--pool P] [--inventory lounge.toml] [--quick] [--json]   (ready?)
%lounge stage DIR [--name NAME] [--pool P] [--force]   (a data set on each node's own disk)
%lounge stage --list | --remove NAME  [--pool P] [--inventory lounge.toml] [--json]
%lounge runs [CLUSTER]            (each map is a run: its progress, kept after a stop)
%lounge config [--profile NAME] [--json] [start options]   (a start's defaults, and whence)
%lounge run NAME [--cluster C] [--csv FILE] [--wait] [--cancel] [--delete]
%%lounge [NAME]                   (as a cell magic: run the cell on every engine)"""
INDENT = " " * 15  # where the lines of start's options begin


def _wrap(words: list[str], first: str, indent: str, width: int = 90) -> list[str]:
    """``words`` on lines of at most ``width`` characters (a word is never split)."""
    lines = [first + words[0]]
    for word in words[1:]:
        if len(lines[-1]) + 1 + len(word) > width:
            lines.append(indent + word)
        else:
            lines[-1] += " " + word
    return lines


def usage_text() -> str:
    """The usage of ``%lounge``, its backend flags from the backends' declarations."""
    slurm = _wrap(backend_options.usage_words("slurm"), f"{INDENT}Slurm: ", INDENT)
    ssh = " ".join(backend_options.usage_words("ssh"))
    from .engines import KINDS

    return USAGE.format(
        slurm="\n".join(slurm), ssh=ssh, kinds="|".join(KINDS),
        backends="|".join(backend_options.BACKENDS),
    )  # fmt: skip


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


def _add_flag(parser: argparse.ArgumentParser, option: backend_options.Option) -> None:
    """A backend option's flag (and ``--no-X`` for a switch); None when not given, so that
    the configured default holds."""
    if option.kind is bool:
        _switch(parser, option.flag[2:], option.name)
        return
    if option.kind is list:
        kind = {"action": "append"}
    else:
        kind = {"type": positive_int if option.positive else option.kind}
    parser.add_argument(option.flag, dest=option.name, default=None, **kind)


def _switch(parser: argparse.ArgumentParser, flag: str, dest: str = "") -> None:
    """``--flag`` and ``--no-flag`` (into ``dest``, else ``flag``); None when neither is
    given."""
    dest = dest or flag
    parser.add_argument(f"--{flag}", dest=dest, action="store_const", const=True, default=None)
    parser.add_argument(f"--no-{flag}", dest=dest, action="store_const", const=False)


def _add_default_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of the options a start takes from its defaults when they are left out
    (``defaults``): every one is None when not given."""
    parser.add_argument("--engines")  # checked by engine_kind()
    parser.add_argument("--backend")  # checked by make_backend()
    parser.add_argument("--nodes", type=positive_int)
    parser.add_argument("--preload")
    parser.add_argument("--timeout", type=positive_float)
    for name in ("restart", "courtesy", "dashboard"):
        _switch(parser, name)
    parser.add_argument("--profile")  # a named set of defaults
    for option in backend_options.start_options():
        _add_flag(parser, option)


def build_parser(prog: str = "%lounge") -> argparse.ArgumentParser:
    parser_class = type("Parser", (_Parser,), {"hint": f"{prog} help"})
    parser = parser_class(prog=prog, add_help=False)
    sub = parser.add_subparsers(dest="command", parser_class=parser_class, required=True)
    start = sub.add_parser("start", add_help=False)
    start.add_argument("n", type=positive_int)
    _add_default_flags(start)
    start.add_argument("--name")
    start.add_argument("--wait", action="store_true")
    start.add_argument("--tls", dest="tls", action="store_true", default=True)  # the default
    start.add_argument("--no-tls", dest="tls", action="store_false")  # local only
    start.add_argument("--dry-run", action="store_true")  # print the job script only
    start.add_argument("--stage", action="append", metavar="NAME=DIR")  # data sets
    shown = sub.add_parser("config", add_help=False)  # the defaults of a start, and whence
    _add_default_flags(shown)
    shown.add_argument("--json", action="store_true")
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
    stage = sub.add_parser("stage", add_help=False)
    stage.add_argument("dir", nargs="?")
    stage.add_argument("--name")
    stage.add_argument("--inventory")
    stage.add_argument("--pool")
    stage.add_argument("--list", action="store_true")
    stage.add_argument("--remove", metavar="NAME")
    stage.add_argument("--force", action="store_true")  # ship every file again
    stage.add_argument("--json", action="store_true")
    doctor = sub.add_parser("doctor", add_help=False)
    doctor.add_argument("node", nargs="?")
    doctor.add_argument("--inventory")
    doctor.add_argument("--pool")
    doctor.add_argument("--quick", action="store_true")  # no TensorFlow import on the nodes
    doctor.add_argument("--json", action="store_true")
    sub.add_parser("runs", add_help=False).add_argument("name", nargs="?")
    run = sub.add_parser("run", add_help=False)
    run.add_argument("run")
    run.add_argument("--cluster")
    run.add_argument("--csv")  # write its table there
    run.add_argument("--wait", action="store_true")  # follow it until it ends first
    run.add_argument("--cancel", action="store_true")
    run.add_argument("--delete", action="store_true")
    sub.add_parser("help", add_help=False)
    return parser


def usage(prog: str = "%lounge") -> str:
    text = usage_text()
    if prog == "%lounge":
        return text
    return "\n".join(text.replace("%lounge", prog).splitlines()[:-1])


def parse(words: list[str], prog: str = "%lounge") -> argparse.Namespace:
    if not words:
        raise LoungeError(f"Say what to do, e.g. `{prog} start 8`; see `{prog} help`.")
    known = ("start", "scale", "status", "interrupt", "stop", "attach", "list", "nodes", "sync")
    known += ("stage", "doctor", "runs", "run", "config", "help")
    if words[0] not in known:
        raise LoungeError(f"Unknown command {words[0]!r}: use one of {', '.join(known)}.")
    return build_parser(prog).parse_args(words)


def given_defaults(args: argparse.Namespace) -> dict:
    """The flags of a parsed ``start`` or ``config`` that override a default (``defaults``):
    those given, by option name."""
    from .config import START_KEYS

    names = [*START_KEYS, *(o.name for o in backend_options.start_options())]
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def resolve(args: argparse.Namespace):
    """The defaults of a parsed ``start`` or ``config``: its flags over its ``--profile``,
    the config and the inventory's ``[start]`` (``defaults.Defaults``)."""
    from . import defaults

    return defaults.resolve(given_defaults(args), profile=args.profile)


def start_options(args: argparse.Namespace) -> dict:
    """The Cluster arguments of a parsed ``start``: what the flags give, the defaults for
    what they leave out, and the options that have no default (name, wait, tls, stage)."""
    return resolve(args).cluster_options() | {
        "name": args.name,
        "wait": args.wait,
        "tls": args.tls,
        "stage": args.stage,
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
    if status.get("driver") == "lost":
        head += (
            "\nIts run driver is gone: following a run, `lounge runs "
            f"{status['name']}` or the next map starts it again, and it resumes the runs."
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


def format_rows(rows: list[dict], columns: list[str], as_json: bool = False) -> str:
    """Rows as a table of ``columns``, or as JSON (every key)."""
    return json.dumps(rows, indent=1) if as_json else format_table(rows, columns)


#: The columns of ``lounge nodes``: from the inventory, or asked of each node (``--live``).
NODE_COLUMNS = ["name", "host", "user", "port", "gpus", "engines", "pools"]
LIVE_COLUMNS = ["name", "host", "state", "cpu", "mem", "gpu", "users", "pools", "why"]
SYNC_COLUMNS = ["node", "status", "files", "MiB", "seconds", "env"]


def node_cells(row: dict) -> dict:
    """A node row (``survey``'s shape) as table cells."""
    return {
        **row,
        "gpu": ",".join(f"{g['util_percent']}%" for g in row["gpus"]),
        "users": ",".join(row["users"]),
        "pools": ",".join(row["pools"]),
    }


#: The columns of ``lounge runs``.
RUN_COLUMNS = ["cluster", "name", "status", "done", "errors", "started", "pool", "error"]


def run_cells(row: dict) -> dict:
    """A run's summary as table cells: ``done`` as done/total, ``started`` as a UTC time."""
    return {
        **row,
        "done": f"{row['done']}/{row['total']}",
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(row["started"])),
    }


def format_list(rows: list[dict]) -> str:
    for r in rows:
        r["age"] = time.strftime("%H:%M:%S", time.gmtime(r["age_s"]))
    return format_table(
        rows, ["name", "engines", "backend", "n", "nodes", "status", "age", "preload", "error"]
    )
