"""One declaration per option: each backend's traits give the flags, the REST fields, the
usage text and the README's tables; and the IPython profile's config (``c.SlurmBackend...``)
reaches the batch script alike in a real kernel, the ``lounge`` command and (see
test_server.py) the server extension."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from traitlets.config import Config

from jupyter_lounge import commands, config, faces, state
from jupyter_lounge.backends import make_backend
from jupyter_lounge.backends.options import BACKENDS, markdown_table, rest_names, start_options
from jupyter_lounge.errors import LoungeError
from jupyter_lounge.serverext.requests import backend_option_types

from .conftest import kernel_output

ROOT = Path(__file__).resolve().parent.parent
PROFILE = 'c.SlurmBackend.partition = "debug"\nc.SlurmBackend.time_limit = "0:07:00"\n'


def directives(script: str) -> list[str]:
    return [line.split(" ", 1)[1] for line in script.splitlines() if line.startswith("#SBATCH")]


def write_profile(folder: Path, text: str = PROFILE) -> Path:
    """An IPython folder (``$IPYTHONDIR``) whose default profile's config is ``text``."""
    (folder / "profile_default").mkdir(parents=True)
    (folder / "profile_default" / "ipython_config.py").write_text(text)
    return folder


@pytest.fixture
def profile(tmp_path, monkeypatch):
    """This process reads config as the ``lounge`` command does: from $IPYTHONDIR's profile
    (not from an IPython shell another test made, nor a server's config)."""
    folder = write_profile(tmp_path / "ipython")
    monkeypatch.setenv("IPYTHONDIR", str(folder))
    monkeypatch.setattr(config, "_ipython", lambda: None)
    monkeypatch.setattr(config, "_server_config", None)
    return folder


# -- the declarations and what is derived from them ---------------------------------------------
def test_the_flags_are_spelled_as_before():
    flags = {o.flag for o in start_options()}
    assert flags == set(
        "--partition --account --qos --time --engines-per-node --cpus-per-engine "
        "--mem-per-engine --gpus-per-node --sbatch --scratch --pool --inventory "
        "--strict --sync".split()
    )
    start = commands.build_parser()._subparsers._group_actions[0].choices["start"]
    assert flags <= {s for action in start._actions for s in action.option_strings}


def test_rest_fields_and_their_types_are_the_declared_ones():
    assert backend_option_types() == {
        "partition": str,
        "account": str,
        "qos": str,
        "time_limit": str,
        "engines_per_node": int,
        "cpus_per_engine": int,
        "mem_per_engine": str,
        "gpus_per_node": int,
        "pool": str,
        "inventory": str,
        "strict": bool,
        "sync": bool,
    }
    assert rest_names("local") == []
    assert rest_names("ssh") == ["pool", "inventory", "strict", "sync"]  # the sidebar's order


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "local"])
def test_the_readme_holds_the_declared_table(backend):
    """The README's table is generated: after changing an option, paste what
    ``python -m jupyter_lounge.backends.options`` prints."""
    assert markdown_table(backend) in (ROOT / "README.md").read_text()


def test_the_usage_shows_every_flag():
    text = commands.usage()
    for option in start_options():
        assert option.flag in text
    assert "[--dry-run]" in text
    from jupyter_lounge.backends import BACKENDS
    from jupyter_lounge.engines import KINDS

    assert f"[--backend {'|'.join(BACKENDS)}]" in text and f"[--engines {'|'.join(KINDS)}]" in text


def test_flags_reach_the_backend():
    args = commands.parse("start 2 --backend ssh --pool gpu --strict".split())
    options = commands.start_options(args)
    assert (options["pool"], options["strict"]) == ("gpu", True)
    assert "sync" not in options and "partition" not in options  # not given: config holds


@pytest.mark.parametrize(
    "option, sentence",
    [
        ("partition", "The local backend takes no option 'partition'; it is for --backend slurm."),
        (
            "known_hosts",
            "The local backend takes no option 'known_hosts'; it is for --backend ssh.",
        ),
        ("turbo", "The local backend takes no option 'turbo', and no backend has one of that"),
    ],
)
def test_the_local_backend_says_whose_option_it_is(option, sentence):
    with pytest.raises(LoungeError, match=sentence.replace("(", "\\(")):
        make_backend("local", **{option: "x"})


# -- config: where it comes from, and that it is checked like a flag ----------------------------
def test_the_cli_reads_the_profile_and_flags_win(profile):
    backend = make_backend("slurm", partition="gpu")
    assert (backend.partition, backend.time_limit) == ("gpu", "0:07:00")


def test_the_servers_config_wins_over_the_profile(profile, monkeypatch):
    server = Config({"SlurmBackend": {"time_limit": "0:09:00"}, "Lounge": {"max_engines": 50}})
    monkeypatch.setattr(config, "_server_config", server)
    backend = make_backend("slurm")
    assert (backend.partition, backend.time_limit) == ("debug", "0:09:00")
    assert config.settings().max_engines == 50
    assert server == Config(
        {"SlurmBackend": {"time_limit": "0:09:00"}, "Lounge": {"max_engines": 50}}
    )


def test_a_broken_profile_is_one_warning(tmp_path, monkeypatch):
    """Warned as IPython does, not raised: a stop must work while the profile is broken."""
    folder = write_profile(tmp_path / "broken", "c.SlurmBackend.partition = \n")
    monkeypatch.setenv("IPYTHONDIR", str(folder))
    monkeypatch.setattr(config, "_ipython", lambda: None)
    monkeypatch.setattr(config, "_server_config", None)
    with pytest.warns(UserWarning, match="ipython_config.py could not be read"):
        assert config.load_config() == Config()


@pytest.mark.parametrize(
    "key, value, sentence",
    [
        ("inventory", "-oProxyCommand=touch x", "may not start with '-'"),
        ("known_hosts", "a\ntouch x", "holds a control character"),
        ("ssh_config", "-F", "may not start with '-'"),
    ],
)
def test_ssh_config_values_are_checked_as_flags_are(key, value, sentence, profile, monkeypatch):
    monkeypatch.setattr(config, "_server_config", Config({"SSHBackend": {key: value}}))
    with pytest.raises(LoungeError, match=sentence):
        make_backend("ssh")


def test_slurm_config_values_are_checked_as_flags_are(profile, monkeypatch):
    bad = Config({"SlurmBackend": {"partition": "gpu\n#SBATCH --uid=0"}})
    monkeypatch.setattr(config, "_server_config", bad)
    with pytest.raises(LoungeError, match="holds a control character"):
        make_backend("slurm")


def test_the_ssh_backends_options_come_from_config_too(tmp_path, profile, monkeypatch):
    inventory = tmp_path / "lounge.toml"
    inventory.write_text(
        '[[node]]\nname = "pc1"\nhost = "10.77.0.11"\npools = ["gpu"]\n\n'
        '[[node]]\nname = "pc2"\nhost = "10.77.0.12"\npools = ["cpu"]\n'
    )
    server = Config({"SSHBackend": {"inventory": str(inventory), "pool": "gpu", "strict": True}})
    monkeypatch.setattr(config, "_server_config", server)
    backend = make_backend("ssh")
    assert list(backend.nodes) == ["pc1"] and backend.may_skip_nodes is False
    assert list(make_backend("ssh", pool="cpu").nodes) == ["pc2"]  # a flag wins


# -- --dry-run: the script a start would submit, from every face ---------------------------------
def test_dry_run_starts_nothing(profile, lounge_dir):
    args = commands.parse("start 4 --backend slurm --dry-run --name dry".split())
    script = faces.run(args, faces.SHELL)
    assert {"--partition=debug", "--time=0:07:00", "--job-name=dry"} <= set(directives(script))
    assert state.list_states() == []
    assert not (lounge_dir / "dry").exists()
    with pytest.raises(LoungeError, match="The local backend submits no job script"):
        faces.run(commands.parse("start 2 --dry-run".split()), faces.SHELL)


def lounge(*args, env):
    return subprocess.run(
        [sys.executable, "-m", "jupyter_lounge.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_the_profile_reaches_the_job_script_in_the_cli(tmp_path, lounge_dir):
    env = {**os.environ, "IPYTHONDIR": str(write_profile(tmp_path / "ipython"))}
    out = lounge("start", "4", "--backend", "slurm", "--dry-run", env=env)
    assert out.returncode == 0, out.stderr
    assert {"--partition=debug", "--time=0:07:00"} <= set(directives(out.stdout))
    out = lounge("start", "4", "--backend", "slurm", "--dry-run", "--time", "1:00:00", env=env)
    assert {"--partition=debug", "--time=1:00:00"} <= set(directives(out.stdout))  # flag wins
    assert state.list_states() == []
    out = lounge("start", "4", "--dry-run", env=env)
    assert out.returncode == 2 and "The local backend submits no job script." in out.stderr


def test_the_profile_reaches_the_job_script_in_a_kernel(tmp_path, lounge_dir):
    """A real ipykernel, started with $IPYTHONDIR: the kernel's shell has the profile."""
    from jupyter_client.manager import start_new_kernel

    env = {**os.environ, "IPYTHONDIR": str(write_profile(tmp_path / "ipython"))}
    km, kc = start_new_kernel(kernel_name="python3", env=env)
    out, keep = kernel_output()

    code = (
        "%load_ext jupyter_lounge\n"
        "%lounge start 4 --backend slurm --dry-run\n"
        "from jupyter_lounge import Lounge\n"
        "print(Lounge(4, backend='slurm', time_limit='1:00:00').job_script())\n"
    )
    try:
        reply = kc.execute_interactive(code, output_hook=keep, timeout=120)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    text = "".join(out)
    assert reply["content"]["status"] == "ok", text
    magic, python = text.split("#!/bin/bash")[1:]
    assert {"--partition=debug", "--time=0:07:00"} <= set(directives(magic))
    assert {"--partition=debug", "--time=1:00:00"} <= set(directives(python))  # keyword wins
    assert state.list_states() == []


def test_both_faces_share_one_table_of_commands():
    choices = commands.build_parser()._subparsers._group_actions[0].choices
    assert set(faces.COMMANDS) == set(choices)
