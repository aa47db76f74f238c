"""The Slurm batch script as plain strings: every option, before anything is submitted."""

from __future__ import annotations

import pytest
from traitlets.config import Config

from jupyter_lounge import Lounge, commands
from jupyter_lounge.backends.slurm import SlurmBackend
from jupyter_lounge.errors import LoungeError


def directives(script: str) -> list[str]:
    return [line.split(" ", 1)[1] for line in script.splitlines() if line.startswith("#SBATCH")]


def test_defaults_one_task_per_node_and_one_srun():
    script = SlurmBackend().job_script("sweep", n=24, cdir="/shared/c", alloc=0)
    assert script.startswith("#!/bin/bash\n")
    assert directives(script) == [
        "--job-name=sweep",
        "--nodes=3",
        "--ntasks-per-node=1",
        "--cpus-per-task=8",
        "--no-kill",
        "--output=/shared/c/slurm-%j.out",
    ]
    srun = [line for line in script.splitlines() if "srun" in line]
    assert len(srun) == 1
    assert srun[0].startswith(
        "exec srun --ntasks-per-node=1 --kill-on-bad-exit=0 --output=/shared/c/agent-0.%t.log "
    )
    assert srun[0].endswith("-m jupyter_lounge.node '/shared/c/agent-0.{task}.spec'")


@pytest.mark.parametrize(
    "options, expected",
    [
        ({"partition": "gpu"}, "--partition=gpu"),
        ({"account": "cancer-lab"}, "--account=cancer-lab"),
        ({"qos": "interactive"}, "--qos=interactive"),
        ({"time_limit": "1:00:00"}, "--time=1:00:00"),
        ({"gpus_per_node": 4}, "--gres=gpu:4"),
        ({"mem_per_engine": "2G"}, "--mem=16384M"),
        ({"mem_per_engine": "500M"}, "--mem=4000M"),
        ({"cpus_per_engine": 2}, "--cpus-per-task=16"),
        ({"extra_directives": ["--constraint=a100", "exclusive"]}, "--constraint=a100"),
        ({"extra_directives": ["exclusive"]}, "--exclusive"),
    ],
)
def test_each_option_becomes_its_directive(options, expected):
    assert expected in directives(SlurmBackend(**options).job_script("c", n=8, alloc=1))


def test_engines_per_node_and_nodes_shape_the_allocation():
    backend = SlurmBackend(engines_per_node=4)
    assert [k for _, k in backend.plan(10, None)] == [4, 4, 2]
    assert "--nodes=3" in directives(backend.job_script("c", n=10))
    assert "--cpus-per-task=4" in directives(backend.job_script("c", n=10))
    assert [k for _, k in backend.plan(10, 2)] == [5, 5]


def test_no_connection_info_on_the_command_line():
    script = SlurmBackend(listen_ip="10.77.0.1").job_script("c", n=2, cdir="/x")
    for secret in ("tcp://", "10.77.0.1", "key", "registration"):
        assert secret not in script  # the agent reads them from a 0600 file on shared disk


def test_traitlets_config_and_flags_compose():
    config = Config()
    config.SlurmBackend.partition = "gpu"
    config.SlurmBackend.time_limit = "2:00:00"
    backend = SlurmBackend(config=config, time_limit="0:30:00")
    assert backend.partition == "gpu" and backend.time_limit == "0:30:00"  # flag wins

    args = commands.parse(
        "start 16 --backend slurm --partition gpu --time 1:00:00 "
        "--engines-per-node 4 --sbatch=--constraint=a100 --sbatch exclusive".split()
    )
    cluster = Lounge(args.n, **commands.start_options(args))
    script = cluster.job_script()
    assert {
        "--partition=gpu",
        "--time=1:00:00",
        "--nodes=4",
        "--constraint=a100",
        "--exclusive",
        f"--job-name={cluster.name}",
    } <= set(directives(script))


@pytest.mark.parametrize(
    "options, expected",
    [
        ({"partitionn": "gpu"}, "Unknown Slurm option 'partitionn'"),
        ({"mem_per_engine": "lots"}, "Memory per engine 'LOTS' is not a size"),
        ({"engines_per_node": 0}, "engines_per_node must be a whole number above 0, not 0"),
        ({"listen_ip": "0.0.0.0"}, "listen_ip '0.0.0.0' would listen on every interface"),
        ({"listen_ip": "::"}, "listen_ip '::' would listen on every interface"),
        ({"listen_ip": "node1"}, "listen_ip 'node1' is not an IP address"),
    ],
)
def test_bad_options_are_one_sentence(options, expected):
    with pytest.raises(LoungeError, match=expected):
        SlurmBackend(**options).job_script("c", n=2)


def test_local_backend_rejects_slurm_options():
    with pytest.raises(LoungeError, match="local backend takes no option 'partition'"):
        Lounge(2, partition="gpu")
