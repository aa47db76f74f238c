"""The REST API of docs/rest-api.md on a real Jupyter server (pytest-jupyter's ``jp_fetch``):
auth on every route, one-sentence errors, a real local cluster started, scaled and stopped
through it, clusters started by other processes seen in it, and their runs listed, cancelled
and deleted."""

from __future__ import annotations

import asyncio
import json
import re
import time

import pytest
from traitlets.config import Config

from jupyter_lounge import Lounge, LoungeError, state
from jupyter_lounge.serverext.handlers import MANAGER

from .conftest import processes_under

pytest_plugins = ["pytest_jupyter.jupyter_server"]

CLUSTER_KEYS = {
    "name",
    "engines",
    "backend",
    "status",
    "n",
    "ready",
    "target",
    "nodes",
    "age_s",
    "preload",
    "pending",
    "error",
    "connect_code",
    "runs",
    "driver",
}
RUN_KEYS = {
    *("name", "cluster", "status", "error", "done", "total", "errors", "started", "finished"),
    *("pool", "load_code"),
}
NODE_KEYS = {
    "name",
    "host",
    "backend",
    "state",
    "why",
    "cpu",
    "mem",
    "gpus",
    "users",
    "engines",
    "pools",
}
NODE_STATUS_KEYS = {
    *("node", "status", "why", "ready", "target", "error", "cpu", "mem", "gpus", "users")
}
GHOST = "No cluster named 'ghost' (running: none); see `lounge list`."


@pytest.fixture
def jp_server_config(request):
    """Our extension on; ``allow_unauthenticated_access`` False as the extension template
    tests it, or (param True) Jupyter's default, where only our decorators guard the routes."""
    return Config(
        {
            "ServerApp": {
                "jpserver_extensions": {
                    "jupyter_lounge.serverext": True,
                    "jupyter_server_terminals": False,  # not ours; spares its auth warning
                },
                "allow_unauthenticated_access": getattr(request, "param", False),
            }
        }
    )


@pytest.fixture(autouse=True)
def manager(jp_serverapp, jp_asyncio_loop):
    """The extension's manager; afterwards, whatever a failed test left is stopped and every
    client the server opened is closed."""
    manager = jp_serverapp.web_app.settings[MANAGER]
    yield manager
    for data in state.list_states():
        jp_asyncio_loop.run_until_complete(manager.remove(data["name"]))
    jp_asyncio_loop.run_until_complete(manager.close())


async def call(jp_fetch, method, *path, body=None, token=True, root="jupyter-lounge"):
    """(status, parsed JSON or None) of one request to /jupyter-lounge/..."""
    kwargs = {"method": method, "raise_error": False}
    if method in ("POST", "PATCH"):
        kwargs["body"] = body if isinstance(body, str) else json.dumps(body or {})
    headers = {} if token else {"Authorization": ""}  # no token, no cookie
    response = await jp_fetch(root, *path, headers=headers, **kwargs)
    return response.code, json.loads(response.body) if response.body else None


async def wait_for(probe, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.2)


async def ready_row(jp_fetch, name: str, n: int) -> dict | None:
    code, row = await call(jp_fetch, "GET", "clusters", name)
    assert code == 200, row
    return row if row["status"] == "running" and row["ready"] >= n else None


ROUTES = [
    ("GET", ("clusters",)),
    ("POST", ("clusters",)),
    ("GET", ("clusters", "ghost")),
    ("PATCH", ("clusters", "ghost")),
    ("DELETE", ("clusters", "ghost")),
    ("POST", ("clusters", "ghost", "interrupt")),
    ("GET", ("clusters", "ghost", "runs")),
    ("GET", ("clusters", "ghost", "runs", "r1")),
    ("DELETE", ("clusters", "ghost", "runs", "r1")),
    ("POST", ("clusters", "ghost", "runs", "r1", "cancel")),
    ("GET", ("nodes",)),
    ("GET", ("backends",)),
]


@pytest.mark.parametrize("jp_server_config", [False, True], indirect=True)
@pytest.mark.parametrize("method, path", ROUTES)
async def test_every_route_needs_a_token(jp_fetch, method, path):
    code, body = await call(jp_fetch, method, *path, body={"n": 1}, token=False)
    assert code == 403 and set(body) == {"message"}, body
    assert state.list_states() == []


@pytest.mark.parametrize("jp_server_config", [False, True], indirect=True)
async def test_no_registered_route_answers_without_a_token(jp_serverapp, jp_fetch):
    from tornado.web import RequestHandler

    def rules(router):
        for rule in router.rules:
            if hasattr(rule.target, "rules"):
                yield from rules(rule.target)
            else:
                yield rule

    ours = [
        r
        for r in rules(jp_serverapp.web_app.default_router)
        if "jupyter-lounge" in getattr(getattr(r.matcher, "regex", None), "pattern", "")
    ]
    assert len(ours) == 8
    base = jp_serverapp.base_url
    for rule in ours:
        pattern = rule.matcher.regex.pattern.rstrip("$")
        path = re.sub(r"\(\?P<\w+>[^)]*\)", "ghost", pattern)[len(base) :]
        handler = rule.target
        methods = [
            m
            for m in handler.SUPPORTED_METHODS
            if m not in ("OPTIONS", "HEAD")
            and getattr(handler, m.lower()) is not getattr(RequestHandler, m.lower())
        ]
        assert methods, handler
        for method in methods:
            code, body = await call(jp_fetch, method, body={"n": 1}, token=False, root=path)
            assert code == 403, (method, path, code, body)


@pytest.mark.parametrize("method", ["GET", "PATCH", "DELETE"])
async def test_a_missing_cluster_is_404(jp_fetch, method):
    code, body = await call(jp_fetch, method, "clusters", "ghost", body={"n": 2})
    assert (code, body) == (404, {"message": GHOST})


async def test_interrupting_a_missing_cluster_is_404(jp_fetch):
    code, body = await call(jp_fetch, "POST", "clusters", "ghost", "interrupt")
    assert (code, body) == (404, {"message": GHOST})


@pytest.mark.parametrize("method, path", [r for r in ROUTES if "runs" in r[1]])
async def test_the_runs_of_a_missing_cluster_are_404(jp_fetch, method, path):
    assert await call(jp_fetch, method, *path) == (404, {"message": GHOST})


async def test_a_name_no_cluster_can_have_is_404(jp_fetch):
    code, body = await call(jp_fetch, "GET", "clusters", "bad name")
    assert code == 404 and body["message"].startswith("No cluster named 'bad name'")


@pytest.mark.parametrize(
    "body, message",
    [
        ("n=4", 'The request body must be JSON, e.g. {"n": 4}.'),
        ("[4]", 'The request body must be a JSON object, e.g. {"n": 4}.'),
        ({}, 'Say how many engines, e.g. {"n": 4}.'),
        ({"n": 0}, "The number of engines must be a whole number above 0, not 0."),
        ({"n": "x"}, "The number of engines must be a whole number above 0, not 'x'."),
        ({"n": 2, "backend": "cloud"}, "Unknown backend 'cloud': use one of local, slurm, ssh."),
        (
            {"n": 2, "engines": "spark"},
            "Unknown engine kind 'spark': use one of ipyparallel, dask (e.g. --engines dask).",
        ),
        (
            {"n": 2, "turbo": True},
            "Unknown option 'turbo': use n, backend, engines, pool, preload, name, nodes, "
            "timeout, courtesy, restart, dashboard, profile or an option of the backend "
            "(GET /jupyter-lounge/backends lists them).",
        ),
        (
            {"n": 2, "partition": "gpu"},
            "The local backend takes no option 'partition'; it is for --backend slurm.",
        ),
        (
            {"n": 2, "backend": "slurm", "engines_per_node": "8"},
            "The option 'engines_per_node' must be a whole number, not '8'.",
        ),
        ({"n": 2, "timeout": -1}, "The timeout must be a number of seconds above 0, not -1."),
        (
            {"n": 2, "timeout": float("inf")},  # JSON's Infinity, which Python's json reads
            "The timeout must be a number of seconds above 0 and at most 604800, not inf.",
        ),
        (
            {"n": 10**9},
            "The number of engines is 1000000000, above the limit of 4096; ask for fewer, or "
            "raise c.Lounge.max_engines in your config.",
        ),
        (
            {"n": 8, "nodes": 9},
            "9 nodes for 8 engines would leave nodes empty: ask for at most 8 nodes.",
        ),
        (
            {"n": 2, "backend": "slurm", "partition": "gpu\n#SBATCH --uid=0"},
            "The Slurm option partition 'gpu\\n#SBATCH --uid=0' holds a control character (a "
            "newline, a tab, ...): give it on one line, without them.",
        ),
        (
            {"n": 2, "name": "web\n"},
            "Cluster name 'web\\n' is not valid: use 1-64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit.",
        ),
    ],
)
async def test_a_bad_start_is_400_with_one_sentence(jp_fetch, body, message):
    code, answer = await call(jp_fetch, "POST", "clusters", body=body)
    assert (code, answer) == (400, {"message": message})
    assert state.list_states() == []


@pytest.mark.parametrize("kind", ["ipyparallel", "dask"])
async def test_start_scale_stop_a_real_cluster(jp_fetch, lounge_dir, kind):
    body = {"n": 2, "name": "web", "engines": kind}
    code, body = await call(jp_fetch, "POST", "clusters", body=body)
    assert (code, body) == (202, {"name": "web", "status": "starting"})
    # the name is taken from the moment the start is accepted
    code, body = await call(jp_fetch, "POST", "clusters", body={"n": 1, "name": "web"})
    assert code == 400 and body["message"].startswith("A cluster named 'web' is already in use")
    code, listing = await call(jp_fetch, "GET", "clusters")
    assert [c["name"] for c in listing["clusters"]] == ["web"]
    assert listing["clusters"][0]["status"] in ("starting", "running")

    row = await wait_for(lambda: ready_row(jp_fetch, "web", 2), 120, "2 engines of 'web'")
    assert set(row) == CLUSTER_KEYS | {"nodes_status"}
    assert row["driver"] == "running"  # its run driver, started with it
    assert row["engines"] == kind and row["backend"] == "local"
    assert (row["n"], row["target"], row["nodes"], row["error"]) == (2, 2, 1, None)
    assert row["connect_code"] == (
        'from jupyter_lounge import Lounge\nlounge = Lounge.attach("web")\nclient = lounge.client'
    )
    assert [set(r) for r in row["nodes_status"]] == [NODE_STATUS_KEYS]
    assert row["nodes_status"][0]["ready"] == 2

    for bad, message in [
        ({"n": 0}, "The number of engines must be a whole number above 0, not 0."),
        ({}, 'Say how many engines, e.g. {"n": 6}.'),
        ({"n": 3, "pool": "gpu"}, "Unknown option 'pool': a scale request takes only n."),
        (
            {"n": 10**9},  # answered at once: no loop over a billion ranks
            "The number of engines is 1000000000, above the limit of 4096; ask for fewer, or "
            "raise c.Lounge.max_engines in your config.",
        ),
    ]:
        assert await call(jp_fetch, "PATCH", "clusters", "web", body=bad) == (
            400,
            {"message": message},
        )
    code, row = await call(jp_fetch, "PATCH", "clusters", "web", body={"n": 3})
    assert code == 200 and row["target"] == 3 and row["n"] == 3
    await wait_for(lambda: ready_row(jp_fetch, "web", 3), 60, "3 engines of 'web'")

    code, body = await call(jp_fetch, "POST", "clusters", "web", "interrupt")
    assert code == 200 and body["message"].startswith("Interrupted 3 engines of 'web': "), body
    assert (await call(jp_fetch, "GET", "clusters", "web"))[1]["ready"] == 3

    async def three_here():
        code, body = await call(jp_fetch, "GET", "nodes")
        return body["nodes"][0]["engines"] == 3

    await wait_for(three_here, 30, "3 engines counted on this machine")

    code, body = await call(jp_fetch, "DELETE", "clusters", "web")
    assert (code, body) == (204, None)
    assert processes_under(str(lounge_dir)) == []
    assert await call(jp_fetch, "GET", "clusters") == (200, {"clusters": []})
    assert (await call(jp_fetch, "GET", "clusters", "web"))[0] == 404


async def test_a_failed_start_shows_until_deleted(jp_fetch, lounge_dir):
    body = {"n": 1, "name": "broken", "preload": "definitely_not_a_module"}
    assert (await call(jp_fetch, "POST", "clusters", body=body))[0] == 202

    async def failed():
        code, body = await call(jp_fetch, "GET", "clusters", "broken")
        return body if body["status"] == "failed" else None

    row = await wait_for(failed, 120, "the start of 'broken' to fail")
    assert "definitely_not_a_module" in row["error"] and row["ready"] == 0
    assert processes_under(str(lounge_dir)) == []  # a failed start stops what it started
    code, listing = await call(jp_fetch, "GET", "clusters")
    assert [c["status"] for c in listing["clusters"]] == ["failed"]
    assert (await call(jp_fetch, "PATCH", "clusters", "broken", body={"n": 2}))[0] == 400
    assert (await call(jp_fetch, "DELETE", "clusters", "broken"))[0] == 204
    assert await call(jp_fetch, "GET", "clusters") == (200, {"clusters": []})


async def test_a_start_deleted_at_once_leaves_nothing(jp_fetch, lounge_dir):
    assert (await call(jp_fetch, "POST", "clusters", body={"n": 2, "name": "brief"}))[0] == 202
    assert await call(jp_fetch, "DELETE", "clusters", "brief") == (204, None)  # cancels it
    assert processes_under(str(lounge_dir)) == []
    assert await call(jp_fetch, "GET", "clusters") == (200, {"clusters": []})


async def test_a_cluster_of_another_process_shows_at_once(jp_fetch, manager, lounge_dir):
    lounge = Lounge(2, name="kernel")
    await asyncio.to_thread(lounge.start_sync)  # as a kernel would (its own loop)
    try:
        code, listing = await call(jp_fetch, "GET", "clusters")
        assert [c["name"] for c in listing["clusters"]] == ["kernel"]
        assert listing["clusters"][0]["status"] == "running"
        await wait_for(lambda: ready_row(jp_fetch, "kernel", 2), 60, "2 engines of 'kernel'")
        code, body = await call(jp_fetch, "POST", "clusters", body={"n": 1, "name": "kernel"})
        assert (code, body) == (
            400,
            {
                "message": "A cluster named 'kernel' is already in use: choose another "
                "--name, or stop it with `lounge stop kernel`."
            },
        )
    finally:
        await asyncio.to_thread(lounge.stop_sync)
    assert await call(jp_fetch, "GET", "clusters") == (200, {"clusters": []})
    assert "kernel" not in manager._clusters  # its client was closed with it
    assert processes_under(str(lounge_dir)) == []


async def test_nodes_without_an_inventory_is_this_machine(jp_fetch):
    code, body = await call(jp_fetch, "GET", "nodes")
    assert code == 200 and len(body["nodes"]) == 1
    here = body["nodes"][0]
    assert set(here) == NODE_KEYS
    assert (here["name"], here["host"], here["backend"]) == ("this machine", "localhost", "local")
    assert here["state"] in ("idle", "in use") and here["engines"] == 0
    assert isinstance(here["cpu"], float) and isinstance(here["users"], list)
    assert here["pools"] == ["local"] and isinstance(here["gpus"], list)


async def test_nodes_and_backends_with_an_inventory(jp_fetch, tmp_path, monkeypatch):
    inventory = tmp_path / "lounge.toml"
    inventory.write_text(
        '[[node]]\nname = "pc01"\nhost = "127.0.0.1"\nport = 1\npools = ["gpu", "nlp"]\n'
        f'known_hosts = "{tmp_path / "known_hosts"}"\n'
    )
    monkeypatch.setenv("JUPYTER_LOUNGE_INVENTORY", str(inventory))
    code, body = await call(jp_fetch, "GET", "nodes")
    assert code == 200 and [n["name"] for n in body["nodes"]] == ["this machine", "pc01"]
    pc = body["nodes"][1]
    assert set(pc) == NODE_KEYS
    assert (pc["host"], pc["backend"], pc["pools"]) == ("127.0.0.1", "ssh", ["gpu", "nlp"])
    assert pc["state"] == "offline" and pc["why"] and pc["engines"] == 0  # nothing listens

    code, body = await call(jp_fetch, "GET", "backends")
    ssh = next(b for b in body["backends"] if b["name"] == "ssh")
    assert ssh == {
        "name": "ssh",
        "available": True,
        "why": "",
        "options": ["pool", "inventory", "strict", "sync"],
        "pools": ["gpu", "nlp"],
    }


async def test_backends(jp_fetch):
    code, body = await call(jp_fetch, "GET", "backends")
    assert code == 200 and body["engines"] == ["ipyparallel", "dask"]
    local, slurm, ssh = body["backends"]
    assert local == {"name": "local", "available": True, "why": "", "options": []}
    assert slurm["name"] == "slurm" and isinstance(slurm["available"], bool)
    assert slurm["available"] or slurm["why"]  # unavailable says why
    assert slurm["options"] == [
        "partition",
        "account",
        "qos",
        "time_limit",
        "engines_per_node",
        "cpus_per_engine",
        "mem_per_engine",
        "gpus_per_node",
    ]
    assert ssh["name"] == "ssh" and ssh["available"] is False and ssh["pools"] == []
    assert ssh["why"].startswith("No lounge inventory at ")


async def test_the_profile_reaches_the_job_script(jp_fetch, jp_serverapp, tmp_path, monkeypatch):
    """``"dry_run": true``: the batch script this start would submit, with the IPython
    profile's ``c.SlurmBackend`` under the server's own config; nothing starts."""
    from .test_options import directives, write_profile

    monkeypatch.setenv("IPYTHONDIR", str(write_profile(tmp_path / "ipython")))
    body = {"n": 4, "backend": "slurm", "dry_run": True}
    code, answer = await call(jp_fetch, "POST", "clusters", body=body)
    assert code == 200 and set(answer) == {"job_script"}, answer
    assert {"--partition=debug", "--time=0:07:00"} <= set(directives(answer["job_script"]))

    jp_serverapp.config.SlurmBackend.time_limit = "0:09:00"  # the server's config wins
    code, answer = await call(jp_fetch, "POST", "clusters", body={**body, "partition": "gpu"})
    assert code == 200, answer
    assert {"--partition=gpu", "--time=0:09:00"} <= set(directives(answer["job_script"]))
    assert state.list_states() == []

    for bad, message in [
        ({"n": 2, "dry_run": True}, "The local backend submits no job script."),
        ({**body, "dry_run": "yes"}, "The option 'dry_run' must be true or false, not 'yes'."),
        ({**body, "partition": "a b"}, "The Slurm option partition 'a b' is not valid"),
    ]:
        code, answer = await call(jp_fetch, "POST", "clusters", body=bad)
        assert code == 400 and answer["message"].startswith(message), answer


async def test_runs_listed_cancelled_and_deleted(jp_fetch, lounge_dir):
    """A kernel's maps on its cluster, seen and handled through the REST API; the runs stay
    listed after the cluster is stopped."""
    lounge = Lounge(2, name="sweeps", wait=True)
    await asyncio.to_thread(lounge.start_sync)  # as a kernel would (its own loop)

    def slow(v):
        import time

        time.sleep(0.5)
        return v

    try:
        await asyncio.to_thread(lounge.map, lambda v: v, range(10), name="r1", progress=False)
        code, answer = await call(jp_fetch, "GET", "clusters", "sweeps", "runs")
        assert code == 200 and [r["name"] for r in answer["runs"]] == ["r1"]
        r1 = answer["runs"][0]
        assert set(r1) == RUN_KEYS
        counts = (r1["cluster"], r1["status"], r1["done"], r1["total"], r1["errors"])
        assert counts == ("sweeps", "done", 10, 10, 0)
        assert r1["load_code"] == (
            "from jupyter_lounge import run\ndf = run('r1', cluster='sweeps').result()"
        )
        assert await call(jp_fetch, "GET", "clusters", "sweeps", "runs", "r1") == (200, r1)
        code, listing = await call(jp_fetch, "GET", "clusters")
        assert listing["clusters"][0]["runs"] == [r1]

        code, body = await call(jp_fetch, "GET", "clusters", "sweeps", "runs", "nope")
        assert (code, body) == (
            404,
            {
                "message": "Cluster 'sweeps' has no run named 'nope' (its runs: r1); see "
                "`lounge runs sweeps`."
            },
        )
        code, body = await call(jp_fetch, "GET", "clusters", "sweeps", "runs", "no pe")
        assert code == 400 and body["message"].startswith("Run name 'no pe' is not valid: ")
        code, body = await call(jp_fetch, "POST", "clusters", "sweeps", "runs", "r1", "cancel")
        assert (code, body) == (
            200,
            {"message": "Run 'r1' of 'sweeps' is already done: there is nothing to cancel."},
        )

        long = asyncio.create_task(
            asyncio.to_thread(lounge.map, slow, range(200), name="long", progress=False)
        )

        async def long_is(status):
            code, run = await call(jp_fetch, "GET", "clusters", "sweeps", "runs", "long")
            return run if code == 200 and run["status"] == status and run["done"] else None

        await wait_for(lambda: long_is("running"), 60, "the run 'long' to have rows")
        code, body = await call(jp_fetch, "DELETE", "clusters", "sweeps", "runs", "long")
        assert (code, body) == (
            400,
            {
                "message": "Run 'long' is still running: cancel it first "
                "(run('long', cluster='sweeps').cancel())."
            },
        )
        code, body = await call(jp_fetch, "POST", "clusters", "sweeps", "runs", "long", "cancel")
        assert (code, body) == (
            200,
            {"message": "Cancelled run 'long' of 'sweeps'; its rows so far stay readable."},
        )
        run = await wait_for(lambda: long_is("cancelled"), 60, "the run 'long' to be cancelled")
        assert run["done"] < 200 and run["finished"] is not None
        with pytest.raises(LoungeError, match="Run 'long' cancelled"):
            await long  # the kernel following it is told

        assert await call(jp_fetch, "DELETE", "clusters", "sweeps", "runs", "r1") == (204, None)
        assert (await call(jp_fetch, "GET", "clusters", "sweeps", "runs", "r1"))[0] == 404
        assert (await call(jp_fetch, "DELETE", "clusters", "sweeps", "runs", "r1"))[0] == 404
    finally:
        await asyncio.to_thread(lounge.stop_sync)
    assert await call(jp_fetch, "GET", "clusters") == (200, {"clusters": []})
    code, answer = await call(jp_fetch, "GET", "clusters", "sweeps", "runs")
    assert code == 200 and [(r["name"], r["status"]) for r in answer["runs"]] == [
        ("long", "cancelled")
    ]
    assert await call(jp_fetch, "DELETE", "clusters", "sweeps", "runs", "long") == (204, None)
    assert processes_under(str(lounge_dir)) == []
