"""The REST API's request bodies: what a start or a scale request may hold, checked before
anything starts; a mistake is one LoungeError sentence (a 400)."""

from __future__ import annotations

from ..commands import scale_request, start_request

__all__ = ["scale_request", "start_request"]
