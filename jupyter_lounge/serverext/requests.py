"""The bodies of the REST API's requests (the sidebar's words), checked before anything
runs: a mistake is a LoungeError of one sentence, which the handlers answer with a 400.

The backend options a start request may hold, and their types, are the backends' own
declarations (``backends.options``); the values then go through the backend's checks as a
flag's do."""

from __future__ import annotations

from .. import validate
from ..backends.options import BACKENDS, start_options
from ..config import DEFAULT_BACKEND, DEFAULT_ENGINES, DEFAULT_TIMEOUT, settings
from ..errors import LoungeError

#: What a start request may hold besides each backend's options.
START_KEYS = ("n", "backend", "engines", "pool", "preload", "name", "nodes", "timeout")
#: How to say the type each backend option takes in a start request.
OPTION_TYPES = {str: "a string", int: "a whole number", bool: "true or false"}


def _engines_wanted(body: dict, example: int) -> int:
    if "n" not in body:
        raise LoungeError(f'Say how many engines, e.g. {{"n": {example}}}.')
    return validate.count(body["n"], "The number of engines", settings().max_engines)


def backend_option_types() -> dict[str, type]:
    """Each backend option a REST start may give, and its type."""
    return {o.name: o.kind for b in BACKENDS for o in start_options(b) if o.rest}


def start_request(body: dict) -> dict:
    """The Cluster arguments of a start request of the REST API (``POST clusters``), or a
    LoungeError naming the first mistake."""
    if not isinstance(body, dict):
        raise LoungeError('The request body must be a JSON object, e.g. {"n": 4}.')
    types = backend_option_types()
    unknown = sorted(set(body) - set(START_KEYS) - set(types))
    if unknown:
        raise LoungeError(
            f"Unknown option {unknown[0]!r}: use {', '.join(START_KEYS)} or an option of "
            "the backend (GET /jupyter-lounge/backends lists them)."
        )
    options = {
        "n": _engines_wanted(body, 4),
        "name": body.get("name"),
        "backend": body.get("backend") or DEFAULT_BACKEND,
        "engines": body.get("engines") or DEFAULT_ENGINES,
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
    options["preload"], options["timeout"] = preload, timeout or DEFAULT_TIMEOUT
    for key in sorted(set(types) & set(body)):
        value = body[key]
        if value is None:
            continue
        kind = types[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise LoungeError(f"The option {key!r} must be {OPTION_TYPES[kind]}, not {value!r}.")
        options[key] = value
    return options


def dry_run(body) -> bool:
    """Whether a start request asks only for the batch script it would submit
    (``"dry_run": true``); the field is taken out of ``body``."""
    if not isinstance(body, dict) or "dry_run" not in body:
        return False
    value = body.pop("dry_run")
    if not isinstance(value, bool):
        raise LoungeError(f"The option 'dry_run' must be {OPTION_TYPES[bool]}, not {value!r}.")
    return value


def job_script(body: dict) -> str:
    """The batch script a start request would submit (``"dry_run": true``): the request is
    checked as a start's is, and nothing is started or submitted."""
    from ..cluster import Cluster
    from ..faces import job_script

    options = start_request(body)
    return job_script(Cluster(options.pop("n"), stop_at_exit=False, **options))


def scale_request(body: dict) -> int:
    """The engine count of a scale request of the REST API (``PATCH clusters/NAME``)."""
    if not isinstance(body, dict):
        raise LoungeError('The request body must be a JSON object, e.g. {"n": 6}.')
    unknown = sorted(set(body) - {"n"})
    if unknown:
        raise LoungeError(f"Unknown option {unknown[0]!r}: a scale request takes only n.")
    return _engines_wanted(body, 6)
