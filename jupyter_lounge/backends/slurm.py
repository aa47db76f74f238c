"""Slurm: one allocation per start (or scale-up), one ``srun`` task per node running the node
agent, which forks that node's engines after importing the preload set once.

The Slurm specifics are data: the three commands and the ``#SBATCH`` header built from
options. ``job_script()`` shows exactly what will be submitted, before anything is.
Options come from keyword arguments (the magic and CLI flags) over traitlets config
(``c.SlurmBackend.partition = "gpu"`` in the IPython profile).
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import shlex
import socket
import time
from pathlib import Path

from traitlets import Float, Integer, List, Unicode
from traitlets.config import Configurable

from .. import treestore, validate
from ..config import settings
from ..errors import LoungeError, LoungeTimeout
from ..procs import call, run, tail
from .base import Backend

#: Partition, account and QOS names (a comma-separated list where Slurm takes one).
LIST_RE = re.compile(r"^[A-Za-z0-9_.+-]+(,[A-Za-z0-9_.+-]+)*\Z")
#: Slurm's time formats: minutes, m:s, h:m:s, d-h, d-h:m, d-h:m:s, or no limit.
TIME_RE = re.compile(r"^(\d+(-\d+)?(:\d+){0,2}|UNLIMITED|INFINITE|unlimited|infinite)\Z")
#: One more #SBATCH option: --name or --name=value, nothing sbatch would split or unquote.
DIRECTIVE_RE = re.compile(r"^--[A-Za-z][A-Za-z0-9-]*(=[^\s'\"\\]+)?\Z")

#: An agent reports every 2 s (node.PROBE_EVERY_S): this long without one, its node is lost
#: (a power cut leaves the job RUNNING until slurmctld's SlurmdTimeout, minutes later).
REPORT_SILENCE_S = 8
RUNNING = {"RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "STAGE_OUT"}
#: Pending reasons that no amount of waiting cures: the request exceeds what the partition,
#: account or QOS allows. Reported at once instead of after the start timeout.
HOPELESS = {
    "PartitionNodeLimit",
    "PartitionTimeLimit",
    "PartitionConfig",
    "BadConstraints",
    "InvalidAccount",
    "InvalidQOS",
    "AccountNotAllowed",
    "QOSNotAllowed",
}


class SlurmBackend(Configurable, Backend):
    name = "slurm"
    grows_in_place = False
    submit_command = "sbatch"
    cancel_command = "scancel"
    status_command = "squeue"

    # Each option once: its type, default and help; ``option=True`` makes it a flag of
    # ``%lounge start`` and ``lounge start`` and a REST field too (see backends/options.py).
    partition = Unicode(
        "", help="Slurm partition (#SBATCH --partition); none: the cluster's default"
    ).tag(config=True, option=True, metavar="P")
    account = Unicode("", help="account to charge (#SBATCH --account)").tag(
        config=True, option=True, metavar="A"
    )
    qos = Unicode("", help="quality of service (#SBATCH --qos)").tag(
        config=True, option=True, metavar="Q"
    )
    time_limit = Unicode("", help="walltime, e.g. 1:00:00 (#SBATCH --time)").tag(
        config=True, option=True, flag="--time", metavar="1:00:00"
    )
    engines_per_node = Integer(
        8,
        help="engines one node agent forks: N engines take N/K nodes (#SBATCH --nodes, "
        "--ntasks-per-node=1) unless --nodes M says how many",
    ).tag(config=True, option=True, metavar="K", positive=True)
    cpus_per_engine = Integer(1, help="CPUs reserved per engine (#SBATCH --cpus-per-task=K*C)").tag(
        config=True, option=True, metavar="C", positive=True
    )
    mem_per_engine = Unicode(
        "", help="memory per engine, e.g. 2G or 500M (#SBATCH --mem=K*2G)"
    ).tag(config=True, option=True, metavar="2G")
    gpus_per_node = Integer(
        0,
        help="GPUs per node (#SBATCH --gres=gpu:G); each engine gets its own "
        "CUDA_VISIBLE_DEVICES from those",
    ).tag(config=True, option=True, metavar="G")
    # A list of raw directives: a flag (repeatable) only, as the sidebar has no field for it.
    extra_directives = List(
        Unicode(), help="any other #SBATCH directive, e.g. --constraint=a100"
    ).tag(config=True, option=True, flag="--sbatch", metavar="--constraint=a100", rest=False)
    scratch = Unicode(
        "", help="node-local folder --stage copies data sets to; default: the job's $TMPDIR"
    ).tag(config=True, option=True, metavar="/local/scratch", rest=False)
    listen_ip = Unicode(
        "", help="address the controller listens on; default: the one that routes to the nodes"
    ).tag(config=True)
    call_timeout = Float(30.0, help="seconds any sbatch/squeue/scancel call may take").tag(
        config=True
    )

    def __init__(self, config=None, **options):
        from .options import configure

        known = sorted(self.class_trait_names(config=True))
        configure(self, "Slurm", known, config, options)
        self._check_values()
        self._jobs: dict[str, tuple[str, str]] = {}
        self._jobs_at = 0.0
        self._ended: dict[str, str] = {}

    def _check_values(self, limits=None) -> None:
        """Every value that lands in the batch script: one line each, in Slurm's own syntax,
        or one sentence saying what was wrong (a newline would start a line bash runs).
        ``limits``: ``config.settings()``, when the caller has read them."""
        for key, pattern, example in (
            ("partition", LIST_RE, "gpu or gpu,debug"),
            ("account", LIST_RE, "proj42"),
            ("qos", LIST_RE, "normal"),
            ("time_limit", TIME_RE, "1:00:00, 90 or 2-00:00:00"),
        ):
            value = validate.no_control(getattr(self, key), f"The Slurm option {key}")
            if value and not pattern.match(value):
                raise LoungeError(
                    f"The Slurm option {key} {value!r} is not valid: use a value like {example}."
                )
        if self.mem_per_engine:
            _megabytes(validate.no_control(self.mem_per_engine, "mem_per_engine"))
        limit = (limits or settings()).max_engines
        validate.count(self.engines_per_node, "engines_per_node", limit)
        validate.count(self.cpus_per_engine, "cpus_per_engine", 4096)
        if not 0 <= self.gpus_per_node <= 64:
            raise LoungeError(f"gpus_per_node must be 0 to 64, not {self.gpus_per_node}.")
        for d in self.extra_directives:
            text = validate.no_control(d, "The #SBATCH directive")
            if not DIRECTIVE_RE.match(text if text.startswith("-") else f"--{text}"):
                raise LoungeError(
                    f"The #SBATCH directive {d!r} is not valid: give one option, like "
                    "--constraint=a100 or --exclusive, with no spaces or quotes."
                )
        if self.listen_ip:
            import ipaddress

            try:
                address = ipaddress.ip_address(self.listen_ip)
            except ValueError:
                raise LoungeError(
                    f"c.SlurmBackend.listen_ip {self.listen_ip!r} is not an IP address."
                ) from None
            if address.is_unspecified:
                raise LoungeError(
                    f"c.SlurmBackend.listen_ip {self.listen_ip!r} would listen on every "
                    "interface: give the one address the compute nodes reach this machine at."
                )

    # -- placement -------------------------------------------------------------------------
    def plan(self, n: int, nodes: int | None) -> list[tuple[str | None, int]]:
        per_node = math.ceil(n / nodes) if nodes else self.engines_per_node
        counts = [per_node] * (n // per_node) + ([n % per_node] if n % per_node else [])
        return [(None, k) for k in counts]  # Slurm picks the nodes

    def job_script(
        self,
        cluster: str = "lounge",
        n: int = 8,
        cdir: str | Path = ".",
        alloc: int = 0,
        nodes: int | None = None,
    ) -> str:
        """The batch script one start (or scale-up) of ``n`` engines submits."""
        return self._script(cluster, [k for _, k in self.plan(n, nodes)], Path(cdir), alloc)

    def _script(self, cluster: str, counts: list[int], cdir: Path, alloc: int) -> str:
        if re.search(r"[\s'\"\\]", str(cdir)):
            raise LoungeError(
                f"The cluster folder {cdir} has a space or a quote in its path, which an "
                "#SBATCH line cannot hold: set JUPYTER_LOUNGE_DIR to a plain path."
            )
        n, per_node = sum(counts), max(counts)
        lines = ["#!/bin/bash", *(f"#SBATCH {d}" for d in self._directives(cluster, counts, cdir))]
        spec = cdir / f"agent-{alloc}.{{task}}.spec"
        agent = " ".join(shlex.quote(part) for part in self.agent_command(str(spec)))
        lines += [
            f"# {n} engines: {len(counts)} node agent(s), up to {per_node} engines each",
            "export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}",
            f"exec srun --ntasks-per-node=1 --kill-on-bad-exit=0 "
            f"--output={shlex.quote(str(cdir / f'agent-{alloc}.%t.log'))} {agent}",
        ]
        return "\n".join(lines) + "\n"

    def _directives(self, cluster: str, counts: list[int], cdir: Path) -> list[str]:
        per_node = max(counts)
        out = [
            f"--job-name={cluster}",
            f"--nodes={len(counts)}",
            "--ntasks-per-node=1",
            f"--cpus-per-task={per_node * self.cpus_per_engine}",
            "--no-kill",  # a node that fails takes its engines, not the whole allocation
            f"--output={cdir / 'slurm-%j.out'}",
        ]
        if self.mem_per_engine:
            out.append(f"--mem={_megabytes(self.mem_per_engine) * per_node}M")
        for flag, value in (
            ("--partition", self.partition),
            ("--account", self.account),
            ("--qos", self.qos),
            ("--time", self.time_limit),
        ):
            if value:
                out.append(f"{flag}={value}")
        if self.gpus_per_node:
            out.append(f"--gres=gpu:{self.gpus_per_node}")
        out += [d if d.startswith("-") else f"--{d}" for d in self.extra_directives]
        return out

    def listen_address(self) -> str:
        return self.listen_ip or self._route_to_nodes()

    def _route_to_nodes(self) -> str:
        """The local address that routes to the partition's first node (no packet is sent)."""
        cmd = ["sinfo", "-h", "-N", "-o", "%o"] + (["-p", self.partition] if self.partition else [])
        out = run(cmd, timeout=self.call_timeout).split()
        if not out:
            raise LoungeError(
                f"`{shlex.join(cmd)}` lists no node; check the partition, or set "
                "c.SlurmBackend.listen_ip."
            )
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((out[0], 9))
            return s.getsockname()[0]

    async def stage_data(self, stage: dict[str, str], nodes: list[str], cdir) -> dict:
        """Nothing is shipped: each data set's manifest is written to the cluster's folder
        (hashed here once; the nodes read it on the shared file system), and each agent
        copies the files its node's scratch lacks before it forks (treestore.stage_copy)."""
        from .. import stage as staging

        entries = []
        for name, folder in sorted(stage.items()):
            path = Path(cdir) / f"stage-{name}.manifest"
            if not path.exists():  # a scale reuses the start's
                tree = await asyncio.to_thread(staging.scan, Path(folder), name)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(treestore.pack({"tree": tree.id, "entries": tree.entries}))
            entries.append({"name": name, "source": folder, "manifest": str(path)})
        return {"stage": entries, "scratch": self.scratch or None}

    async def place(self, agents: list[dict], cdir: Path, cluster: str) -> None:
        alloc = agents[0]["alloc"]
        script = cdir / f"job-{alloc}.sh"
        script.write_text(self._script(cluster, [len(a["ranks"]) for a in agents], cdir, alloc))
        script.chmod(0o700)
        job = await self._call([self.submit_command, "--parsable", str(script)])
        job = job.strip().split(";")[0]
        if not job.isdigit():
            raise LoungeError(f"`sbatch` answered {job!r}, not a job id.")
        for a in agents:
            a.update(
                job=job, files={**a["files"], "log": str(cdir / f"agent-{alloc}.{a['task']}.log")}
            )
        self._jobs_at = 0.0

    async def release(self, agents: list[dict], grace: float) -> None:
        jobs = sorted({a["job"] for a in agents if a.get("job")})
        if not jobs:
            return
        await self._call([self.cancel_command, *jobs], ok_if_gone=True)
        deadline = time.monotonic() + max(grace, 5) + self.call_timeout
        while True:
            listed = await self._call(
                [self.status_command, "-h", "-o", "%i", "-j", ",".join(jobs)], ok_if_gone=True
            )
            if not set(listed.split()) & set(jobs):
                break
            if time.monotonic() > deadline:
                raise LoungeTimeout(
                    f"Slurm job(s) {', '.join(jobs)} still in squeue "
                    f"{deadline:.0f} s after scancel; check `squeue -j`."
                )
            await asyncio.sleep(0.25)
        self._jobs_at = 0.0

    # -- state -----------------------------------------------------------------------------
    def agent_state(self, agent: dict) -> tuple[str, str]:
        job = agent.get("job")
        if not job:
            return "pending", "not submitted yet"
        jobs = self._job_states()
        if job not in jobs:
            return "lost", f"Slurm job {job} has ended{self._end_reason(job, agent)}"
        state, reason = jobs[job]
        if state == "PENDING" and reason in HOPELESS:
            return "lost", (
                f"Slurm job {job} can never start ({reason}): ask for fewer nodes, "
                "a shorter --time, or another --partition"
            )
        if state == "PENDING":
            return "pending", f"Slurm job {job} pending: {reason}"
        if state not in RUNNING:
            return "lost", f"Slurm job {job} is {state}: {reason}"
        from ..protocol import read_report

        report = read_report(agent["files"]["report"])
        if report is None:
            return "alive", ""
        if report.status in ("stopped", "failed", "controller-lost"):
            return "lost", f"its agent has {report.status} (Slurm job {job} is {state})"
        # An agent reports every 2 s, except while it imports the preload modules (one long
        # call, slower still on a busy node) or copies data sets to its scratch (as long as
        # the shared file system takes): then only the start's own timeout applies.
        silent = time.time() - report.time
        quiet = {"preloading": 300, "staging": 3600}.get(report.status, REPORT_SILENCE_S)
        if silent > quiet:
            return "lost", f"its node stopped answering (no report for {silent:.0f} s)"
        return "alive", ""

    def _job_states(self) -> dict[str, tuple[str, str]]:
        """job id -> (state, reason) for this user's jobs; one squeue a second at most."""
        if time.monotonic() - self._jobs_at < 1.0:
            return self._jobs
        cmd = [self.status_command, "-h", "--me", "-o", "%i|%T|%r"]
        try:
            out = run(cmd, timeout=self.call_timeout)
        except LoungeTimeout:
            return self._jobs  # keep the last answer; the caller's own timeout still runs
        jobs = {}
        for line in out.splitlines():
            job, state, reason = (line.split("|") + ["", ""])[:3]
            jobs[job.strip()] = (state.strip(), reason.strip())
        self._jobs, self._jobs_at = jobs, time.monotonic()
        return jobs

    def _end_reason(self, job: str, agent: dict) -> str:
        """Why the job ended, from sacct where accounting runs, else its output file."""
        if job not in self._ended:
            try:
                out = run(["sacct", "-n", "-X", "-j", job, "-o", "State,ExitCode"], timeout=5)
                out = out.split()
            except LoungeError:  # no accounting here: the job's output file says more
                out = []
            if not out:
                out = tail(Path(agent["files"]["spec"]).parent / f"slurm-{job}.out", 2).split()
            self._ended[job] = f" ({' '.join(out)})" if out else ""
        return self._ended[job]

    async def _call(self, cmd: list[str], ok_if_gone: bool = False) -> str:
        try:
            return await call(cmd, timeout=self.call_timeout)
        except FileNotFoundError:
            raise LoungeError(
                f"`{cmd[0]}` was not found: is Slurm installed on this machine?"
            ) from None
        except LoungeError as e:
            if ok_if_gone and "Invalid job id" in str(e):
                return ""
            raise


def _megabytes(text: str) -> int:
    units = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
    text = text.strip().upper().rstrip("B")
    try:
        if text and text[-1] in units:
            return max(1, math.ceil(float(text[:-1]) * units[text[-1]]))
        return int(text)
    except ValueError:
        raise LoungeError(
            f"Memory per engine {text!r} is not a size: use e.g. 2G or 500M."
        ) from None
