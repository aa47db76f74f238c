"""The errors a user sees: one sentence that names the thing and what to do."""

from __future__ import annotations


class LoungeError(Exception):
    """A failure explained in one sentence; shown without a traceback by the magics and CLI."""


class LoungeTimeout(LoungeError, TimeoutError):
    """A wait ran past its limit; the message names what was waited for."""


class NoSuchCluster(LoungeError):
    """No cluster has that name (the REST API answers 404)."""


class NoSuchRun(NoSuchCluster):
    """No run of that name (in that cluster); a 404 too."""
