"""The bodies of the REST API's requests (the sidebar's words), checked before anything
runs: a mistake is a LoungeError of one sentence, which the handlers answer with a 400.

The backend options a start request may hold, and their types, are the backends' own
declarations (``backends.options``); the values then go through the backend's checks as a
flag's do."""

from __future__ import annotations

from .. import defaults, validate
from ..backends.options import BACKENDS, KIND_WORDS, of_kind, start_options
from ..config import settings
from ..errors import LoungeError

#: What a start request may hold besides each backend's options.
START_KEYS = ("n", "backend", "engines", "pool", "preload", "name", "nodes", "timeout")
START_KEYS += ("courtesy", "restart", "dashboard", "profile")


def _engines_wanted(body: dict, example: int) -> int:
    if "n" not in body:
        raise LoungeError(f'Say how many engines, e.g. {{"n": {example}}}.')
    return validate.count(body["n"], "The number of engines", settings().max_engines)


def backend_option_types() -> dict[str, type]:
    """Each backend option a REST start may give, and its type."""
    return {o.name: o.kind for b in BACKENDS for o in start_options(b) if o.rest}


def start_request(body: dict) -> dict:
    """The Cluster arguments of a start request of the REST API (``POST clusters``), or a
    LoungeError naming the first mistake. What the body leaves out (or gives as null) takes
    the server's defaults (``defaults``: the config, the inventory's ``[start]``, and
    ``"profile"``'s set)."""
    if not isinstance(body, dict):
        raise LoungeError('The request body must be a JSON object, e.g. {"n": 4}.')
    types = backend_option_types()
    unknown = sorted(set(body) - set(START_KEYS) - set(types))
    if unknown:
        raise LoungeError(
            f"Unknown option {unknown[0]!r}: use {', '.join(START_KEYS)} or an option of "
            "the backend (GET /jupyter-lounge/backends lists them)."
        )
    n = _engines_wanted(body, 4)
    given = {key: body[key] for key in ("backend", "engines") if body.get(key)}
    given["nodes"] = body.get("nodes")
    preload = body.get("preload")
    if preload is not None and (
        not isinstance(preload, (str, list)) or not all(isinstance(m, str) for m in preload)
    ):
        raise LoungeError(
            f'preload must be module names, e.g. "tensorflow,numpy", not {preload!r}.'
        )
    given["preload"] = preload
    timeout = body.get("timeout")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0
    ):
        raise LoungeError(f"The timeout must be a number of seconds above 0, not {timeout!r}.")
    given["timeout"] = timeout
    for key in sorted({"courtesy", "restart", "dashboard", *types} & set(body)):
        value = body[key]
        if value is None:
            continue
        kind = types.get(key, bool)
        if not of_kind(value, kind):
            raise LoungeError(f"The option {key!r} must be {KIND_WORDS[kind]}, not {value!r}.")
        given[key] = value
    profile = body.get("profile")
    if profile is not None and not isinstance(profile, str):
        raise LoungeError(f"The option 'profile' must be {KIND_WORDS[str]}, not {profile!r}.")
    found = defaults.resolve(given, profile=profile)
    return {"n": n, "name": body.get("name"), **found.cluster_options()}


def dry_run(body) -> bool:
    """Whether a start request asks only for the batch script it would submit
    (``"dry_run": true``); the field is taken out of ``body``."""
    if not isinstance(body, dict) or "dry_run" not in body:
        return False
    value = body.pop("dry_run")
    if not isinstance(value, bool):
        raise LoungeError(f"The option 'dry_run' must be {KIND_WORDS[bool]}, not {value!r}.")
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
