"""The Jupyter server extension: the REST API of docs/rest-api.md under
``<base_url>/jupyter-lounge/``, which the JupyterLab sidebar calls.

Enabled by ``jupyter-config/server-config/jupyter_lounge.json`` (installed as
``etc/jupyter/jupyter_server_config.d/``), or by hand:
``jupyter server extension enable jupyter_lounge.serverext``.
"""

from __future__ import annotations


def _jupyter_server_extension_points() -> list[dict]:
    return [{"module": "jupyter_lounge.serverext"}]


def _load_jupyter_server_extension(serverapp) -> None:
    from ..config import use_server_config
    from .handlers import MANAGER, routes
    from .session import ServerSession

    # c.Lounge.max_engines, c.Lounge.backend in jupyter_server_config.py; its files say
    # where each value came from (`GET backends`' defaults)
    use_server_config(serverapp.config, getattr(serverapp, "loaded_config_files", ()))

    web_app = serverapp.web_app
    base_url = web_app.settings["base_url"]
    web_app.settings[MANAGER] = ServerSession()  # one per server: it keeps the clients
    web_app.add_handlers(".*$", routes(base_url))
    serverapp.log.info("jupyter_lounge: REST API under %sjupyter-lounge/", base_url)
