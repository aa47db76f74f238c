"""Checks of values that reach a command line, a batch script, a remote shell or a loop.

Every value from a user, a file or a request passes one of these before it is used: a value
that could change the meaning of what it lands in (a newline in a ``#SBATCH`` line, a host
that ssh would read as an option) is refused with one sentence, never silently cleaned.
"""

from __future__ import annotations

import math
import re

from .errors import LoungeError

MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*\Z")


def no_control(value: str, what: str) -> str:
    """``value`` unless it holds a control character (a newline ends a script line)."""
    if not isinstance(value, str):
        raise LoungeError(f"{what} must be text, not {value!r}.")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise LoungeError(
            f"{what} {value!r} holds a control character (a newline, a tab, ...): give it "
            "on one line, without them."
        )
    return value


def count(value, what: str, most: int) -> int:
    """A whole number from 1 to ``most``."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise LoungeError(f"{what} must be a whole number above 0, not {value!r}.")
    if value > most:
        raise LoungeError(
            f"{what} is {value}, above the limit of {most}; ask for fewer, or raise "
            "c.Lounge.max_engines in your config."
        )
    return value


def seconds(value, what: str, most: float) -> float:
    """A finite number of seconds above 0, at most ``most``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise LoungeError(f"{what} must be a number of seconds above 0, not {value!r}.")
    value = float(value)
    if not math.isfinite(value) or value <= 0 or value > most:
        raise LoungeError(
            f"{what} must be a number of seconds above 0 and at most {most:g}, not {value:g}."
        )
    return value


def module_list(value):
    """Module names as a list: a comma-separated string split (``"tensorflow, numpy"``), a
    list as it is, anything else returned for its checker to refuse."""
    if isinstance(value, str):
        return [m.strip() for m in value.split(",") if m.strip()]
    return value


def module_names(names: list[str]) -> list[str]:
    """Importable module names (``tensorflow``, ``sklearn.ensemble``), nothing else."""
    for name in names:
        if not isinstance(name, str) or not MODULE_RE.match(name):
            raise LoungeError(
                f"Preload module {name!r} is not a module name: use dotted names such as "
                "tensorflow or sklearn.ensemble, separated by commas."
            )
    return names
