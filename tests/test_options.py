"""One declaration per option: each backend's traits give the flags, the REST fields, the
usage text and the README's tables."""

from __future__ import annotations

from pathlib import Path

import pytest

from jupyter_lounge import commands
from jupyter_lounge.backends import make_backend
from jupyter_lounge.backends.options import BACKENDS, markdown_table, rest_names, start_options
from jupyter_lounge.errors import LoungeError
from jupyter_lounge.serverext.requests import backend_option_types

ROOT = Path(__file__).resolve().parent.parent


# -- the declarations and what is derived from them ---------------------------------------------
def test_the_flags_are_spelled_as_before():
    flags = {o.flag for o in start_options()}
    assert flags == set(
        "--partition --account --qos --time --engines-per-node --cpus-per-engine "
        "--mem-per-engine --gpus-per-node --sbatch --pool --inventory --strict --sync".split()
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


def test_both_faces_share_one_table_of_commands():
    from jupyter_lounge import faces

    choices = commands.build_parser()._subparsers._group_actions[0].choices
    assert set(faces.COMMANDS) == set(choices)
