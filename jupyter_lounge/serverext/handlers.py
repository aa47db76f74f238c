"""HTTP only: each handler turns one route of docs/rest-api.md into a ServerSession call.

Every verb needs Jupyter's auth (``web.authenticated``, then ``authorized`` on the resource
``lounge``), so a request without a token or cookie gets 403, and writes need XSRF like the
rest of the Jupyter API. Errors are ``{"message": one sentence}``: a LoungeError is a 400,
an unknown cluster or run a 404.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

from ..errors import LoungeError, NoSuchCluster
from . import requests
from .session import ServerSession

MANAGER = "jupyter_lounge_manager"  # its key in the web app's settings
AUTH_RESOURCE = "lounge"


def answers_errors(method):
    """Turn a LoungeError into a 400 and an unknown cluster or run into a 404, each one
    sentence."""

    @functools.wraps(method)
    async def wrapper(self: LoungeHandler, *args: Any, **kwargs: Any) -> None:
        try:
            await method(self, *args, **kwargs)
        except NoSuchCluster as e:
            self.reply(404, {"message": str(e)})
        except LoungeError as e:
            self.reply(400, {"message": str(e)})

    return wrapper


class LoungeHandler(APIHandler):
    auth_resource = AUTH_RESOURCE

    @property
    def manager(self) -> ServerSession:
        return self.settings[MANAGER]

    def reply(self, status: int, body: Any = None) -> None:
        self.set_status(status)
        self.finish(None if body is None else json.dumps(body))

    def json_body(self) -> Any:
        try:
            return json.loads(self.request.body or b"")
        except ValueError:
            raise LoungeError('The request body must be JSON, e.g. {"n": 4}.') from None

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """Jupyter's own errors (403, 500, ...) in the same shape: one sentence."""
        error = (kwargs.get("exc_info") or (None, None, None))[1]
        text = self._reason
        if status_code == 403:
            text = "Forbidden: this needs Jupyter's token (or its login cookie and XSRF)"
        if isinstance(error, web.HTTPError) and error.log_message:
            text = error.log_message
            try:
                text = text % error.args if error.args else text
            except (TypeError, ValueError):
                pass
        elif error is not None and not isinstance(error, web.HTTPError):
            text = f"Unexpected {type(error).__name__} in jupyter_lounge: {error}"
        message = text if text.endswith(".") else f"{text}."
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"message": message}))


class ClustersHandler(LoungeHandler):
    @web.authenticated
    @authorized
    @answers_errors
    async def get(self) -> None:
        self.reply(200, {"clusters": await self.manager.summaries()})

    @web.authenticated
    @authorized
    @answers_errors
    async def post(self) -> None:
        body = self.json_body()
        if requests.dry_run(body):  # only the batch script it would submit: nothing starts
            self.reply(200, {"job_script": requests.job_script(body)})
            return
        name = await self.manager.create(body)
        self.reply(202, {"name": name, "status": "starting"})


class ClusterHandler(LoungeHandler):
    @web.authenticated
    @authorized
    @answers_errors
    async def get(self, name: str) -> None:
        self.reply(200, await self.manager.summary(name))

    @web.authenticated
    @authorized
    @answers_errors
    async def patch(self, name: str) -> None:
        self.reply(200, await self.manager.patch(name, self.json_body()))

    @web.authenticated
    @authorized
    @answers_errors
    async def delete(self, name: str) -> None:
        await self.manager.remove(name)
        self.reply(204)


class InterruptHandler(LoungeHandler):
    @web.authenticated
    @authorized
    @answers_errors
    async def post(self, name: str) -> None:
        self.reply(200, {"message": await self.manager.interrupt_work(name)})


class RunsHandler(LoungeHandler):
    @web.authenticated
    @authorized
    @answers_errors
    async def get(self, name: str) -> None:
        self.reply(200, {"runs": await self.manager.runs(name)})


class RunHandler(LoungeHandler):
    @web.authenticated
    @authorized
    @answers_errors
    async def get(self, name: str, run: str) -> None:
        self.reply(200, await self.manager.run(name, run))

    @web.authenticated
    @authorized
    @answers_errors
    async def delete(self, name: str, run: str) -> None:
        await self.manager.delete_run(name, run)
        self.reply(204)


class CancelRunHandler(LoungeHandler):
    @web.authenticated
    @authorized
    @answers_errors
    async def post(self, name: str, run: str) -> None:
        self.reply(200, {"message": await self.manager.cancel_run(name, run)})


class NodesHandler(LoungeHandler):
    @web.authenticated
    @authorized
    @answers_errors
    async def get(self) -> None:
        self.reply(200, {"nodes": await self.manager.nodes()})


class BackendsHandler(LoungeHandler):
    @web.authenticated
    @authorized
    @answers_errors
    async def get(self) -> None:
        profile = self.get_argument("profile", None) or None  # ?profile=NAME: its defaults
        self.reply(200, await self.manager.backends(profile))


def routes(base_url: str) -> list[tuple[str, type]]:
    root = url_path_join(base_url, "jupyter-lounge")
    cluster = url_path_join(root, "clusters", "(?P<name>[^/]+)")
    run = url_path_join(cluster, "runs", "(?P<run>[^/]+)")
    return [
        (url_path_join(root, "clusters"), ClustersHandler),
        (cluster, ClusterHandler),
        (url_path_join(cluster, "interrupt"), InterruptHandler),
        (url_path_join(cluster, "runs"), RunsHandler),
        (run, RunHandler),
        (url_path_join(run, "cancel"), CancelRunHandler),
        (url_path_join(root, "nodes"), NodesHandler),
        (url_path_join(root, "backends"), BackendsHandler),
    ]
