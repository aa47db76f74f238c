"""The defaults of every start (issue 18): what `%lounge start 2`, `lounge start 2` and a
REST start of ``{"n": 2}`` mean comes from the built-in traits, the inventory's ``[start]``,
the traitlets config (the IPython profile, the server's config), ``--profile NAME`` and the
flags, in that order; ``lounge config`` says where each came from, and a mistake in any of
those places is one sentence naming the file, the line and the key."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from jupyter_lounge import Lounge, commands, config, defaults, faces, state
from jupyter_lounge.errors import LoungeError

from .conftest import kernel_output, processes_under
from .test_server import call, jp_server_config, wait_for  # noqa: F401 - the server's fixture

pytest_plugins = ["pytest_jupyter.jupyter_server"]

# Lines: backend 2, engines 3, preload 4. Modules no engine imports by itself, cheap to import.
PROFILE = """c = get_config()  # noqa
c.Lounge.backend = "local"
c.Lounge.engines = "dask"
c.Lounge.preload = ["colorsys", "wave"]
"""
MODULES = ["colorsys", "wave"]


def inventory_text(extra: str = "") -> str:
    """A lounge inventory with defaults only (no node). ``extra`` goes right under [start],
    on line 3 (in place of the line of the same key). Lines without it: backend 3, preload
    4, timeout 5, pool 6; [start.quick] 8, its timeout 9, its engines 10."""
    base = ['backend = "ssh"\n', 'preload = ["json"]\n', "timeout = 90\n", 'pool = "gpu"\n']
    key = extra.split("=")[0].strip()
    base = [line for line in base if not key or line.split()[0] != key]  # TOML: once each
    return (
        "# the lounge's defaults\n"
        "[start]\n"
        f"{extra}{''.join(base)}"
        "\n"
        "[start.quick]\n"
        "timeout = 45\n"
        'engines = "ipyparallel"\n'
    )


@pytest.fixture
def files(tmp_path, monkeypatch):
    """An IPython folder whose default profile is PROFILE, and an inventory with [start]:
    both found through the environment, as every face finds them."""
    ipython = tmp_path / "ipython"
    (ipython / "profile_default").mkdir(parents=True)
    profile = ipython / "profile_default" / "ipython_config.py"
    profile.write_text(PROFILE)
    inventory = tmp_path / "lounge.toml"
    inventory.write_text(inventory_text())
    inventory.chmod(0o600)
    monkeypatch.setenv("IPYTHONDIR", str(ipython))
    monkeypatch.setenv("JUPYTER_LOUNGE_INVENTORY", str(inventory))
    return SimpleNamespace(ipython=ipython, profile=profile, inventory=inventory)


@pytest.fixture
def places(files, monkeypatch):
    """``files``, read in this process as the ``lounge`` command reads them (not through an
    IPython shell or a server another test made)."""
    monkeypatch.setattr(config, "_ipython", lambda: None)
    monkeypatch.setattr(config, "_server_config", None)
    monkeypatch.setattr(config, "_server_files", [])
    return files


def env() -> dict:
    return dict(os.environ)


def lounge(*args, timeout=180):
    return subprocess.run(
        [sys.executable, "-m", "jupyter_lounge.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env(),
    )


# -- the layers -------------------------------------------------------------------------------
@pytest.mark.fast
def test_each_default_comes_from_the_highest_place_that_sets_it(places):
    inv, profile = places.inventory, places.profile
    found = defaults.resolve()
    assert (found["backend"], found.source("backend")) == ("local", f"{profile} line 2")
    assert (found["engines"], found.source("engines")) == ("dask", f"{profile} line 3")
    assert (found["preload"], found.source("preload")) == (MODULES, f"{profile} line 4")
    assert (found["timeout"], found.source("timeout")) == (90.0, f"{inv} line 5 ([start])")
    assert (found["pool"], found.source("pool")) == ("gpu", f"{inv} line 6 ([start])")
    assert (found["restart"], found.source("restart")) == (True, "built-in")
    assert (found["nodes"], found["partition"]) == (None, "")

    quick = defaults.resolve(profile="quick")  # the inventory's [start.quick]
    assert (quick["timeout"], quick.source("timeout")) == (45.0, f"{inv} line 9 ([start.quick])")
    assert quick.source("engines") == f"{inv} line 10 ([start.quick])"
    # an IPython profile of that name too: its config wins over [start.quick]
    (places.ipython / "profile_quick").mkdir()
    (places.ipython / "profile_quick" / "ipython_config.py").write_text(
        "c.Lounge.timeout = 30\nc.SlurmBackend.partition = 'debug'\n"
    )
    quick = defaults.resolve(profile="quick")
    mine = places.ipython / "profile_quick" / "ipython_config.py"
    assert (quick["timeout"], quick.source("timeout")) == (30.0, f"{mine} line 1")
    assert (quick["partition"], quick.source("partition")) == ("debug", f"{mine} line 2")
    assert quick["engines"] == "ipyparallel"

    flagged = defaults.resolve({"timeout": 7.0, "preload": "json", "nodes": None}, "quick")
    assert (flagged["timeout"], flagged.source("timeout")) == (7.0, "flag")
    assert flagged["preload"] == "json" and flagged.source("nodes") == "built-in"


@pytest.mark.fast
def test_a_json_profile_and_lazy_values_are_read_and_placed(places):
    folder = places.ipython / "profile_lab"
    folder.mkdir()
    (folder / "ipython_config.json").write_text(
        json.dumps({"Lounge": {"nodes": 2, "courtesy": True}}, indent=1)
    )
    (folder / "ipython_config.py").write_text("c.Lounge.preload.append('json')\n")
    found = defaults.resolve(profile="lab")
    assert (found["nodes"], found.source("nodes")) == (
        2,
        f"{folder / 'ipython_config.json'} line 3",
    )
    assert found.source("courtesy") == f"{folder / 'ipython_config.json'} line 4"
    # appended to what the layers below gave (the default profile's modules)
    assert found["preload"] == [*MODULES, "json"]
    assert found.source("preload") == f"{folder / 'ipython_config.py'} line 1"


@pytest.mark.fast
def test_the_flags_of_a_start_override_and_their_defaults_are_not_given(places):
    opts = commands.start_options(commands.parse(["start", "2"]))
    assert (opts["backend"], opts["engines"], opts["preload"]) == ("local", "dask", MODULES)
    assert (opts["timeout"], opts["restart"], opts["courtesy"], opts["nodes"]) == (
        90.0, True, False, None
    )  # fmt: skip
    assert "pool" not in opts  # an ssh default: not for a local start
    words = "start 2 --engines ipyparallel --preload json --timeout 5 --no-restart --courtesy"
    opts = commands.start_options(commands.parse(words.split()))
    assert (opts["engines"], opts["preload"], opts["timeout"]) == ("ipyparallel", "json", 5.0)
    assert (opts["restart"], opts["courtesy"]) == (False, True)
    # the chosen backend takes its configured options; a flag undoes a configured switch
    places.inventory.write_text(inventory_text("strict = true\n"))
    opts = commands.start_options(commands.parse("start 2 --backend ssh".split()))
    assert (opts["pool"], opts["strict"]) == ("gpu", True)
    opts = commands.start_options(commands.parse("start 2 --backend ssh --no-strict".split()))
    assert opts["strict"] is False
    # a configured dashboard is for Dask starts; a flag is always passed on (and checked)
    places.inventory.write_text(inventory_text("dashboard = true\n"))
    assert commands.start_options(commands.parse(["start", "2"]))["dashboard"] is True
    words = "start 2 --engines ipyparallel"
    assert commands.start_options(commands.parse(words.split()))["dashboard"] is False
    with pytest.raises(LoungeError, match="--dashboard is Dask's"):
        faces.run(commands.parse(f"{words} --dashboard --dry-run".split()), faces.SHELL)


@pytest.mark.fast
def test_lounge_config_says_where_each_default_came_from(places):
    inv, profile = places.inventory, places.profile
    out = lounge("config")
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line for line in out.stdout.splitlines()[3:]}
    assert rows["backend"].split()[1:] == ["local", f"{profile}", "line", "2"]
    assert rows["preload"].split()[1:] == ["colorsys,wave", f"{profile}", "line", "4"]
    assert rows["timeout"].split()[1:] == ["90", f"{inv}", "line", "5", "([start])"]
    assert rows["restart"].split()[1:] == ["true", "built-in"]
    assert rows["pool"].split()[1:] == ["(ssh)", "gpu", f"{inv}", "line", "6", "([start])"]
    out = lounge("config", "--profile", "quick", "--json", "--preload", "json")
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    assert shown["timeout"] == {"value": 45.0, "source": f"{inv} line 9 ([start.quick])"}
    assert shown["preload"] == {"value": "json", "source": "flag"}
    assert shown["backend"] == {"value": "local", "source": f"{profile} line 2"}
    assert set(shown) == set(defaults.option_names())
    out = lounge("config", "--profile", "ghost")
    assert out.returncode == 2 and out.stderr.strip() == (
        f"lounge: No profile 'ghost': there is no [start.ghost] table in {inv} and no IPython "
        f"profile folder {places.ipython / 'profile_ghost'}: add that table, make the folder "
        "(ipython profile create ghost), or start without that profile."
    )
    broken = places.ipython / "profile_broken"
    broken.mkdir()
    (broken / "ipython_config.py").write_text("c.Lounge.timeout = (\n")
    out = lounge("config", "--profile", "broken")
    assert out.returncode == 2 and out.stderr.startswith(
        f"lounge: The IPython config {broken / 'ipython_config.py'} could not be read "
        "(SyntaxError: "
    ), out.stderr
    assert out.stderr.rstrip().endswith("): fix it, or start without that profile."), out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


# -- mistakes: one sentence, with the file, the line and the key ------------------------------
PROFILE_MISTAKES = [
    (
        'c.Lounge.backend = "slurmm"',
        "c.Lounge.backend is 'slurmm', which is not a backend: use one of local, slurm, ssh.",
    ),
    ('c.Lounge.timeout = "x"', "c.Lounge.timeout must be a number of seconds above 0, not 'x'."),
    (
        'c.Lounge.preload = "tensor flow"',
        'c.Lounge.preload must be module names, e.g. ["tensorflow", "numpy"], not ["tensor flow"].',
    ),
    ("c.Lounge.nodes = 0", "c.Lounge.nodes must be a whole number above 0, not 0."),
    ('c.Lounge.courtesy = "yes"', "c.Lounge.courtesy must be true or false, not 'yes'."),
    (
        'c.SlurmBackend.partition = "gpu\\n#SBATCH --uid=0"',
        "The Slurm option partition 'gpu\\n#SBATCH --uid=0' holds a control character",
    ),
    (
        'c.SlurmBackend.engines_per_node = "8"',
        "c.SlurmBackend.engines_per_node must be a whole number, not '8'.",
    ),
    ('c.SSHBackend.pool = "-oProxyCommand=x"', "The ssh option pool '-oProxyCommand=x' may not"),
    ('c.Lounge.backnd = "ssh"', "c.Lounge.backnd is not an option of jupyter_lounge: use one of"),
]


@pytest.mark.fast
@pytest.mark.parametrize("line, sentence", PROFILE_MISTAKES)
def test_a_mistake_in_the_profile_is_one_sentence_with_its_line(places, line, sentence):
    places.profile.write_text(PROFILE + line + "\n")
    with pytest.raises(LoungeError) as shown:  # `lounge config`
        faces.run(commands.parse(["config"]), faces.SHELL)
    with pytest.raises(LoungeError) as started:  # `lounge start 2`
        commands.start_options(commands.parse(["start", "2"]))
    for info in (shown, started):
        assert str(info.value).startswith(f"{places.profile} line 5: {sentence}"), info.value
        assert "\n" not in str(info.value)


INVENTORY_MISTAKES = [
    (
        "preload = 3\n",
        '[start] preload must be module names, e.g. ["tensorflow", "numpy"], not 3.',
    ),
    (
        'engines = "spark"\n',
        "[start] engines is 'spark', which is not an engine kind: use one of ipyparallel, dask.",
    ),
    ("timeout = -1\n", "[start] timeout must be a number of seconds above 0"),
    (
        'partiton = "gpu"\n',
        "[start] has no option 'partiton': use one of backend, engines, preload, nodes, "
        "timeout, courtesy, restart, dashboard, partition, account,",
    ),
    (
        'partition = "gpu\\n#SBATCH --uid=0"\n',
        "The Slurm option partition 'gpu\\n#SBATCH --uid=0' holds a control character",
    ),
    ("strict = 1\n", "[start] strict must be true or false, not 1."),
]


@pytest.mark.fast
@pytest.mark.parametrize("line, sentence", INVENTORY_MISTAKES)
def test_a_mistake_in_the_inventory_is_one_sentence_with_its_line(places, line, sentence):
    places.inventory.write_text(inventory_text(line))
    with pytest.raises(LoungeError) as info:
        commands.start_options(commands.parse(["start", "2"]))
    assert str(info.value).startswith(f"{places.inventory} line 3: {sentence}"), info.value


@pytest.mark.fast
def test_the_cli_says_a_mistake_in_one_line(places):
    places.profile.write_text(PROFILE + 'c.Lounge.backend = "slurmm"\n')
    out = lounge("start", "2")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == (
        f"lounge: {places.profile} line 5: c.Lounge.backend is 'slurmm', which is not a "
        "backend: use one of local, slurm, ssh.\n"
    )
    assert state.list_states() == []


@pytest.mark.fast
@pytest.mark.parametrize(
    "words, sentence",
    [
        ("start 2 --backend cloud", "Unknown backend 'cloud': use one of local, slurm, ssh."),
        ("start 2 --engines spark", "Unknown engine kind 'spark': use one of ipyparallel, dask"),
        ("start 2 --timeout -1", "--timeout must be a number of seconds above 0, not -1"),
        ("start 2 --preload tensor-flow", "Preload module 'tensor-flow' is not a module name"),
        ("start 2 --partition gpu", "The local backend takes no option 'partition'; it is for"),
        ("start 2 --profile ../x", "Profile name '../x' is not valid: use 1-64 letters"),
    ],
)
def test_a_mistake_in_a_flag_is_its_one_sentence(places, words, sentence):
    with pytest.raises(LoungeError, match=sentence.replace("(", "\\(")):
        faces.run(commands.parse([*words.split(), "--dry-run"]), faces.SHELL)
    assert state.list_states() == []


@pytest.mark.fast
def test_a_bad_default_does_not_stop_a_stop_but_a_bad_limit_says_where(places):
    places.profile.write_text(PROFILE + 'c.Lounge.timeout = "x"\n')
    assert config.settings().max_engines == 4096  # a stop, a list, the keeper read only this
    places.profile.write_text(PROFILE + 'c.Lounge.max_engines = "many"\n')
    with pytest.raises(LoungeError) as info:
        config.settings()
    assert str(info.value) == (
        f"{places.profile} line 5: c.Lounge.max_engines must be a whole number, not 'many'."
    )


@pytest.mark.fast
def test_the_servers_config_file_wins_and_its_mistake_names_its_line(places, monkeypatch):
    """In the server, jupyter_server_config.py (the files the server read) sits over the
    profile: its value wins with its file and line, and its mistake is one sentence naming
    them, in GET backends' defaults_error and as a start's 400."""
    from traitlets.config.loader import PyFileConfigLoader

    from jupyter_lounge.serverext import requests

    server = places.ipython / "jupyter_server_config.py"

    def serve(lines: str) -> None:
        server.write_text(f"c = get_config()  # noqa\nc.ServerApp.port = 0\n{lines}")
        loaded = PyFileConfigLoader(server.name, str(server.parent)).load_config()
        monkeypatch.setattr(config, "_server_config", loaded)
        monkeypatch.setattr(config, "_server_files", [str(server)])

    serve('c.Lounge.backend = "slurm"\n')
    shown = defaults.for_rest()
    assert shown["defaults_error"] is None, shown
    assert shown["defaults"]["backend"] == {"value": "slurm", "source": f"{server} line 3"}
    assert shown["defaults"]["engines"] == {"value": "dask", "source": f"{places.profile} line 3"}
    serve('c.Lounge.courtesy = True\nc.Lounge.backend = "slurmm"\n')
    sentence = (
        f"{server} line 4: c.Lounge.backend is 'slurmm', which is not a backend: use one of "
        "local, slurm, ssh."
    )
    assert defaults.for_rest()["defaults_error"] == sentence
    with pytest.raises(LoungeError) as info:
        requests.start_request({"n": 2})
    assert str(info.value) == sentence


@pytest.mark.fast
def test_an_inventory_others_may_change_gives_no_defaults(places):
    places.inventory.chmod(0o666)
    with pytest.raises(LoungeError, match="can be changed by someone other than you or root"):
        defaults.resolve()


@pytest.mark.fast
def test_no_inventory_and_no_profile_is_the_built_in_defaults(places, tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_LOUNGE_INVENTORY", str(tmp_path / "none.toml"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "empty"))
    found = defaults.resolve()
    assert {n: found.source(n) for n in defaults.option_names()} == dict.fromkeys(
        defaults.option_names(), "built-in"
    )
    assert (found["backend"], found["engines"], found["timeout"]) == (
        config.DEFAULT_BACKEND,
        config.DEFAULT_ENGINES,
        config.DEFAULT_TIMEOUT,
    )
    with pytest.raises(LoungeError, match=r"No profile 'x': there is no lounge inventory at "):
        defaults.resolve(profile="x")


# -- the faces start on the configured defaults -----------------------------------------------
def preloaded(cluster) -> list[list[str]]:
    """Which of MODULES each engine has imported (the agent imported them before forking)."""
    df = cluster.map(
        lambda _: sorted(m for m in ("colorsys", "wave") if m in __import__("sys").modules),
        range(cluster.n),
        progress=False,
    )
    return list(df.result)


def test_a_kernel_starts_on_the_profiles_defaults(files, lounge_dir):
    """A real ipykernel with the profile: `%lounge start 2` is a local Dask cluster whose
    engines have the profile's modules; `%lounge config` in it names the profile's lines."""
    from jupyter_client.manager import start_new_kernel

    from jupyter_lounge.manager import ClusterManager

    km, kc = start_new_kernel(kernel_name="python3", env=env())
    out, keep = kernel_output()

    code = (
        "%load_ext jupyter_lounge\n"
        "%lounge config\n"
        "lounge = %lounge start 2 --name kern\n"
        "print('kind', lounge.kind.name, lounge.backend.name, lounge.timeout)\n"
    )
    cell = "import sys\nprint('has', sorted(m for m in ('colorsys', 'wave') if m in sys.modules))"
    try:
        reply = kc.execute_interactive(code, output_hook=keep, timeout=240)
        assert reply["content"]["status"] == "ok", "".join(out)
        reply = kc.execute_interactive(f"%%lounge\n{cell}", output_hook=keep, timeout=240)
        assert reply["content"]["status"] == "ok", "".join(out)
        reply = kc.execute_interactive("%lounge stop", output_hook=keep, timeout=120)
        assert reply["content"]["status"] == "ok", "".join(out)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
        for data in state.list_states():
            ClusterManager().stop(data["name"])
    text = "".join(out)
    preload = next(line for line in text.splitlines() if line.startswith("preload "))
    assert preload.split() == ["preload", "colorsys,wave", f"{files.profile}", "line", "4"]
    assert f"{files.inventory} line 5 ([start])" in text  # timeout, in the kernel too
    assert "kind dask local 90.0" in text, text
    assert text.count("has ['colorsys', 'wave']") == 2, text
    assert state.list_states() == []
    assert processes_under(str(lounge_dir)) == []


def test_the_cli_starts_on_the_defaults_and_a_flag_overrides(files, lounge_dir):
    out = lounge("start", "2", "--name", "cli", "--timeout", "60", "--wait")
    try:
        assert out.returncode == 0, out.stderr
        listing = lounge("list").stdout
        row = next(line.split() for line in listing.splitlines() if line.startswith("cli "))
        assert row[1:3] == ["dask", "local"] and row[-1] == "colorsys,wave", listing
        data = state.load_state("cli")
        assert (data["timeout"], data["engines"], data["preload"]) == (60.0, "dask", MODULES)
        assert preloaded(Lounge.attach("cli")) == [MODULES, MODULES]
    finally:
        stopped = lounge("stop", "cli")
    assert stopped.returncode == 0, stopped.stderr
    assert state.list_states() == []
    assert processes_under(str(lounge_dir)) == []


async def backends(jp_fetch, profile: str) -> tuple[int, dict]:
    """``GET backends?profile=NAME``."""
    response = await jp_fetch(
        "jupyter-lounge", "backends", params={"profile": profile}, raise_error=False
    )
    return response.code, json.loads(response.body)


async def test_a_rest_start_takes_the_servers_defaults(jp_fetch, jp_serverapp, files, lounge_dir):
    """A real Jupyter server: ``GET backends`` carries the defaults and their sources (a
    profile's set with ``?profile=``), and ``POST {"n": 2}`` starts on them."""
    from jupyter_lounge.serverext.handlers import MANAGER

    code, body = await call(jp_fetch, "GET", "backends")
    assert code == 200 and body["defaults_error"] is None, body
    shown = body["defaults"]
    assert set(shown) == set(defaults.option_names(rest=True))
    assert "extra_directives" not in shown and "scratch" not in shown  # flags only
    assert shown["backend"] == {"value": "local", "source": f"{files.profile} line 2"}
    assert shown["preload"] == {"value": MODULES, "source": f"{files.profile} line 4"}
    assert shown["pool"] == {"value": "gpu", "source": f"{files.inventory} line 6 ([start])"}
    assert shown["nodes"] == {"value": None, "source": "built-in"}
    assert shown["courtesy"] == {"value": False, "source": "built-in"}

    jp_serverapp.config.SSHBackend.pool = "cpu"  # the server's own config wins
    code, body = await backends(jp_fetch, "quick")
    assert code == 200, body
    assert body["defaults"]["pool"] == {"value": "cpu", "source": "the Jupyter server's config"}
    assert body["defaults"]["timeout"] == {
        "value": 45.0,
        "source": f"{files.inventory} line 9 ([start.quick])",
    }
    code, body = await backends(jp_fetch, "ghost")
    assert code == 400 and body["message"].startswith("No profile 'ghost': there is no [start.")
    for bad, message in [
        ({"n": 2, "profile": "../x"}, "Profile name '../x' is not valid: use 1-64 letters"),
        ({"n": 2, "profile": 3}, "The option 'profile' must be a string, not 3."),
        ({"n": 2, "restart": "no"}, "The option 'restart' must be true or false, not 'no'."),
    ]:
        code, body = await call(jp_fetch, "POST", "clusters", body=bad)
        assert code == 400 and body["message"].startswith(message), body

    files.profile.write_text(PROFILE + "c.Lounge.nodes = -1\n")  # a mistake: said, not a 500
    code, body = await call(jp_fetch, "GET", "backends")
    assert code == 200 and body["defaults"]["nodes"]["source"] == "built-in"
    assert body["defaults_error"] == (
        f"{files.profile} line 5: c.Lounge.nodes must be a whole number above 0, not -1."
    )
    code, body = await call(jp_fetch, "POST", "clusters", body={"n": 2, "name": "web"})
    assert code == 400 and body["message"].startswith(f"{files.profile} line 5: c.Lounge.nodes")
    files.profile.write_text(PROFILE)

    manager = jp_serverapp.web_app.settings[MANAGER]
    try:
        code, body = await call(jp_fetch, "POST", "clusters", body={"n": 2, "name": "web"})
        assert (code, body) == (202, {"name": "web", "status": "starting"})

        async def running():
            code, row = await call(jp_fetch, "GET", "clusters", "web")
            assert code == 200 and row["status"] != "failed", row
            return row if row["status"] == "running" and row["ready"] >= 2 else None

        row = await wait_for(running, 180, "2 engines of 'web'")
        assert (row["engines"], row["backend"], row["preload"]) == (
            "dask",
            "local",
            "colorsys,wave",
        )
        assert state.load_state("web")["timeout"] == 90.0  # the inventory's [start]
        cluster = await asyncio.to_thread(Lounge.attach, "web")
        assert await asyncio.to_thread(preloaded, cluster) == [MODULES, MODULES]
        await asyncio.to_thread(cluster.disconnect)
        assert await call(jp_fetch, "DELETE", "clusters", "web") == (204, None)
    finally:
        for data in state.list_states():
            await manager.remove(data["name"])
        await manager.close()
    assert processes_under(str(lounge_dir)) == []
    assert state.list_states() == []


def test_the_readme_shows_the_defaults():
    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert "## Defaults for every start" in text and "lounge config" in text


def test_the_configured_backend_and_its_options_reach_slurm(files, lounge_dir):
    """The configured backend is not the built-in one: `lounge start 2` with a profile that
    says Slurm, one engine a node and a preload runs on two testbed nodes, in one job, with
    the preload imported; `--engines-per-node 2` on the same command puts both on one node."""
    import socket

    from .conftest import slurm_testbed_problem, wait_until

    problem = slurm_testbed_problem()
    if problem:
        pytest.skip(problem)
    files.profile.write_text(
        'c.Lounge.backend = "slurm"\nc.Lounge.preload = "colorsys,wave"\n'
        "c.SlurmBackend.engines_per_node = 1\n"
    )

    def squeue() -> list[str]:
        out = subprocess.run(
            ["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=30
        )
        return out.stdout.split()

    def hosts(cluster) -> list[str]:
        df = cluster.map(lambda _: socket.gethostname(), range(8), progress=False)
        return sorted(set(df.result))

    shown = lounge("config").stdout
    assert f"{files.profile} line 1" in next(
        line for line in shown.splitlines() if line.startswith("backend ")
    ), shown
    for flags, nodes in (((), 2), (("--engines-per-node", "2"), 1)):
        out = lounge("start", "2", "--name", "slurmy", "--wait", *flags, timeout=240)
        try:
            assert out.returncode == 0, out.stderr
            data = state.load_state("slurmy")
            assert (data["backend"], data["preload"]) == ("slurm", MODULES), data
            assert len(squeue()) == 1
            cluster = Lounge.attach("slurmy")
            assert len(hosts(cluster)) == nodes and preloaded(cluster) == [MODULES] * 2
            cluster.disconnect()
        finally:
            stopped = lounge("stop", "slurmy")
        assert stopped.returncode == 0, stopped.stderr
        wait_until(lambda: squeue() == [], 30, "the job of 'slurmy' to leave squeue")
    assert state.list_states() == []
    assert processes_under(str(lounge_dir)) == []
