"""Every backend's options, read from its traits: the one declaration of each option.

A backend declares an option once, as a traitlets trait with its type, default and help,
tagged ``config=True`` (``c.SlurmBackend.partition = "gpu"`` in a config file) and, when a
start may also give it, ``option=True`` (a flag of ``%lounge start`` and ``lounge start``, a
field of a REST start request). The flags, the usage text, the REST checks, ``GET
/jupyter-lounge/backends`` and the README's tables are all derived from this list, so they
cannot disagree.

Further tags: ``flag`` (the flag when it is not ``--`` plus the name with dashes),
``metavar`` (the example value the usage text shows), ``positive`` (a count above 0, which
the parser checks before the backend does), ``rest=False`` (a flag only: no REST field).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from traitlets import Bool, Float, Integer, List, TraitType, Unicode

from ..errors import LoungeError

BACKENDS = ("local", "slurm", "ssh")
#: The Python type a value of each kind of trait has (a flag's, a REST field's).
KINDS = {Unicode: str, Integer: int, Float: float, Bool: bool, List: list}
#: How to say a value of each kind (a REST field's, a config value's).
KIND_WORDS = {
    str: "a string",
    int: "a whole number",
    float: "a number",
    bool: "true or false",
    list: "a list of strings",
}


@dataclass(frozen=True)
class Option:
    name: str  # the keyword and the trait: time_limit
    backend: str  # slurm
    owner: str  # the Configurable class, as config files name it: SlurmBackend
    kind: type  # str, int, float, bool or list (of str)
    default: Any
    help: str
    flag: str  # --time; "" for config only
    metavar: str  # what the usage text shows after the flag: 1:00:00
    positive: bool  # a whole number above 0
    rest: bool  # a field of a REST start request (and of the sidebar's form)

    @property
    def start(self) -> bool:
        """A start may give it (a flag); config alone sets the others."""
        return bool(self.flag)


def configure(backend, what: str, known: list[str], config, options: dict) -> dict:
    """Set a Configurable backend's traits from ``config`` and then ``options`` (flags, REST
    fields; None: not given): an unknown option or a value of the wrong type is one sentence
    naming ``what`` (``Slurm``, ``ssh``). Returns the options given."""
    from traitlets import TraitError
    from traitlets.config import Configurable

    from .base import Backend

    unknown = sorted(set(options) - set(known))
    if unknown:
        raise LoungeError(f"Unknown {what} option {unknown[0]!r}: use one of {', '.join(known)}.")
    options = {k: v for k, v in options.items() if v is not None}
    try:
        Configurable.__init__(backend, config=config, **options)
    except TraitError as e:  # a value of the wrong type
        article = "An" if what[0].lower() in "aeios" else "A"
        raise LoungeError(f"{article} {what} option has a value of the wrong type: {e}") from None
    Backend.__init__(backend, **options)
    return options


def of_kind(value: Any, kind: type) -> bool:
    """Whether ``value`` is a value of the option kind ``kind`` (a bool is no number; a
    whole number is a float)."""
    if kind is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind is float:
        return isinstance(value, (int, float))
    if kind is list:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return isinstance(value, kind)


def check(backend: str, name: str, value: Any, limits) -> Any:
    """``value`` for the option ``name`` of ``backend`` (of its kind: see ``of_kind``),
    checked by the backend's own checks of its values, as a start checks its flags and its
    config; a mistake is the backend's LoungeError. Nothing is started or read (no
    inventory, no Slurm; ``limits``: ``config.settings()``, read once by the caller)."""
    from traitlets.config import Configurable

    cls = backend_class(backend)
    probe = cls.__new__(cls)  # the traits only: not the backend's __init__
    Configurable.__init__(probe, **{name: value})
    probe._check_values(limits)
    return getattr(probe, name)


def backend_class(name: str) -> type:
    if name == "local":
        from .local import LocalBackend

        return LocalBackend
    if name == "slurm":
        from .slurm import SlurmBackend

        return SlurmBackend
    if name == "ssh":
        from .ssh import SSHBackend

        return SSHBackend
    raise LoungeError(f"Unknown backend {name!r}: use one of {', '.join(BACKENDS)}.")


def _kind(trait: TraitType) -> type:
    for cls, kind in KINDS.items():
        if isinstance(trait, cls):
            return kind
    raise TypeError(f"no option kind for the trait {trait!r}")  # a new trait type: add it


def _describe(backend: str, owner: str, name: str, trait: TraitType) -> Option:
    tags = trait.metadata
    flag = tags.get("flag") or f"--{name.replace('_', '-')}"
    return Option(
        name=name,
        backend=backend,
        owner=owner,
        kind=_kind(trait),
        default=trait.default(),
        help=trait.help,
        flag=flag if tags.get("option") else "",
        metavar=tags.get("metavar", ""),
        positive=bool(tags.get("positive")),
        rest=bool(tags.get("option")) and tags.get("rest", True),
    )


def declared(backend: str) -> list[Option]:
    """Every config option of ``backend``, in the order its class declares them (the order
    the sidebar and the usage text show)."""
    cls = backend_class(backend)
    found: dict[str, Option] = {}
    for klass in reversed(cls.__mro__):  # a subclass's trait replaces its base's
        for name, trait in vars(klass).items():
            if isinstance(trait, TraitType) and trait.metadata.get("config"):
                found[name] = _describe(backend, cls.__name__, name, trait)
    return list(found.values())


def start_options(backend: str | None = None) -> list[Option]:
    """The options a start may give (flags; REST fields unless ``rest=False``): of
    ``backend``, or of every backend."""
    names = BACKENDS if backend is None else (backend,)
    return [o for b in names for o in declared(b) if o.start]


def rest_names(backend: str) -> list[str]:
    """The option fields of a REST start request for ``backend`` (GET backends lists them)."""
    return [o.name for o in start_options(backend) if o.rest]


def owner_of(name: str) -> str | None:
    """The backend that has the option ``name`` (config alone, or a flag too), or None."""
    return next((b for b in BACKENDS for o in declared(b) if o.name == name), None)


def usage_words(backend: str) -> list[str]:
    """The backend's flags as the usage text shows them: ``[--partition P]``."""
    words = []
    for o in start_options(backend):
        if o.kind is list:
            words.append(f"[{o.flag}={o.metavar} ...]")
        else:
            words.append(f"[{o.flag} {o.metavar}]" if o.metavar else f"[{o.flag}]")
    return words


def _cell(value: Any) -> str:
    if value in ("", [], None) or value is False:
        return "none" if not isinstance(value, bool) else "off"
    return f"`{value}`"


def markdown_table(backend: str) -> str:
    """The README's table of ``backend``'s options: each flag, its config name, its default
    and its help, from the declarations (``python -m jupyter_lounge.backends.options``)."""
    rows = ["| flag | config | default | meaning |", "| --- | --- | --- | --- |"]
    for o in declared(backend):
        if o.kind is list:
            flag = f"`{o.flag}={o.metavar}` (repeatable)"
        elif o.flag:
            flag = f"`{o.flag} {o.metavar}`" if o.metavar else f"`{o.flag}`"
        else:
            flag = "(config only)"
        rows.append(f"| {flag} | `c.{o.owner}.{o.name}` | {_cell(o.default)} | {o.help} |")
    return "\n".join(rows)


def main() -> None:
    for backend in BACKENDS[1:]:
        print(f"{backend}:\n\n{markdown_table(backend)}\n")


if __name__ == "__main__":
    main()
