"""The lounge over SSH: one OpenSSH session per node from the inventory, all opened at once,
each running that node's agent, which forks the node's engines.

The nodes share no file system with this machine: each session is driven by a local relay
(``ssh_relay.py``, this backend's local half) that sends the agent its spec, the connection
file and every control change on the session's stdin, and writes the agent's reports from
its stdout to the cluster's report file. The agent keeps its files in a private folder under
the node's ``local_dir``. Host keys are checked against known_hosts (``BatchMode``,
``StrictHostKeyChecking=yes``). The short sessions (sync, stage, the survey) ride one
connection per node kept open a while (``persist``, see ``_kept``); an agent's never does.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path

from traitlets import Bool, Integer, Unicode
from traitlets.config import Configurable

from .. import validate
from ..errors import LoungeError
from ..procs import kill_group, ours, spawn, started
from ..sync import remote_path
from .base import Backend


class SSHBackend(Configurable, Backend):
    name = "ssh"
    grows_in_place = True

    # Each option once (see backends/options.py); ``option=True``: a flag and a REST field.
    pool = Unicode("", help="the inventory pool whose nodes run the engines; none: every node").tag(
        config=True, option=True, metavar="P"
    )
    inventory = Unicode(
        "",
        help="the lounge inventory; none: $JUPYTER_LOUNGE_INVENTORY or "
        "~/.config/jupyter_lounge/lounge.toml",
    ).tag(config=True, option=True, metavar="lounge.toml")
    strict = Bool(False, help="fail the start if a node cannot be reached, not skip it").tag(
        config=True, option=True
    )
    sync = Bool(
        False, help="first ship this environment to the nodes that lack it (see lounge sync)"
    ).tag(config=True, option=True)
    known_hosts = Unicode(
        "", help="known_hosts file for every node; none: each node's own, else ssh's"
    ).tag(config=True)
    ssh_config = Unicode("", help="an ssh_config file for every session (ssh -F)").tag(config=True)
    persist = Integer(
        300,
        help="seconds a node's SSH connection stays open, unused, after a sync, stage or "
        "survey, so the next starts without a new handshake (OpenSSH ControlPersist); 0: one "
        "connection per session",
    ).tag(config=True)

    def __init__(self, config=None, **options):
        from .options import configure, declared

        for key in ("inventory", "pool", "known_hosts", "ssh_config"):
            if options.get(key) is not None:  # a number says "must be text" in our words
                validate.no_control(options[key], f"The ssh option {key}")
        configure(self, "ssh", [o.name for o in declared("ssh")], config, options)
        self._check_values()
        self.may_skip_nodes = not self.strict
        from .. import inventory

        self.inv = inventory.load(self.inventory or None)
        self.nodes = {n.name: n for n in self.inv.select(self.pool or None)}

    def _check_values(self, limits=None) -> None:
        """Paths and names that land on an ssh command line: one line each, never an option
        of ssh's (config values too, not only flags). (No limit applies to them.)"""
        for key in ("inventory", "pool", "known_hosts", "ssh_config"):
            value = validate.no_control(getattr(self, key), f"The ssh option {key}")
            if value.startswith("-"):
                raise LoungeError(f"The ssh option {key} {value!r} may not start with '-'.")
        if not 0 <= self.persist <= MAX_PERSIST_S:
            raise LoungeError(
                f"The ssh option persist is {self.persist}: give the seconds a connection stays "
                f"open, from 0 (none) to {MAX_PERSIST_S}."
            )

    def plan(self, n: int, nodes: int | None) -> list[tuple[str | None, int]]:
        chosen = list(self.nodes.values())[: nodes or None]
        slots = sum(node.engines for node in chosen)
        if n > slots:
            raise LoungeError(
                f"{n} engines do not fit on {len(chosen)} lounge node(s) with {slots} engine "
                f"slots ({self.inv.path}); ask for fewer or raise their 'engines'."
            )
        plan, left = [], n
        for node in chosen:  # spread evenly, within each node's slots
            share = min(node.engines, -(-left // (len(chosen) - len(plan))))
            if share:
                plan.append((node.name, share))
            left -= share
        return plan

    def pool_nodes(self, pool: str) -> list[str]:
        validate.no_control(pool, "The pool")
        return [n.name for n in self.inv.select(pool)]  # an unknown pool: its sentence

    def spec_for(self, node: str | None) -> dict:
        """The node-local folder its agent keeps its files in (see ssh_relay.py); on a
        Windows PC, that presence is seen from the Windows side (see windows.py)."""
        if node not in self.nodes:
            return {}
        found = self.nodes[node]
        return {"local_dir": found.local_dir, "presence": found.os}

    def courtesy_for(self, node: str | None) -> dict | None:
        """Lounge PCs belong to people first: their inventory idle policy always applies."""
        from dataclasses import asdict

        return asdict(self.nodes[node].idle) if node in self.nodes else None

    def listen_address(self) -> str:
        first = next(iter(self.nodes.values()))
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((socket.gethostbyname(first.host), 9))  # no packet is sent
                return s.getsockname()[0]
        except OSError as e:
            raise LoungeError(
                f"No route to lounge node {first.name!r} ({first.host}): {e}."
            ) from None

    def ssh_command(self, node_name: str, reuse: bool = False) -> list[str]:
        """ssh to the node, ending before the remote command. ``reuse``: the session rides
        a connection kept open to the node (made by the first such session, with these same
        options; see ``_kept``), where an agent's session (``reuse`` False) has a connection
        of its own: it lives and dies with its cluster, whatever ssh_config says."""
        node = self.nodes[node_name]
        cmd = [
            "ssh",
            "-o",
            "BatchMode=yes",  # never a password prompt
            "-o",
            "StrictHostKeyChecking=yes",  # a host key we know, or no connection
            "-o",
            "ForwardAgent=no",  # a node must not borrow our keys to reach further
            "-o",
            "ForwardX11=no",
            "-o",
            "ClearAllForwardings=yes",  # no tunnels either way, whatever ssh_config says
            "-o",
            "PermitLocalCommand=no",
            "-o",
            "ConnectTimeout=10",
            # a node that went silent (a power cut, a pulled cable) ends its session after
            # about 8 s: 3 probes 2 s apart unanswered; its agent is then lost, and a map's
            # batches there run elsewhere (mapping: the controller's heartbeat is slow)
            "-o",
            "ServerAliveInterval=2",
            "-o",
            "ServerAliveCountMax=3",
            "-p",
            str(node.port),
        ]
        if self.ssh_config:
            cmd += ["-F", self.ssh_config]
        known_hosts = self.known_hosts or node.known_hosts
        if known_hosts:
            cmd += ["-o", f"UserKnownHostsFile={known_hosts}"]
        if node.key:
            cmd += ["-i", node.key, "-o", "IdentitiesOnly=yes"]
        if node.user:
            cmd += ["-l", node.user]
        cmd += self._kept(cmd, node.host) if reuse else ["-o", "ControlPath=none"]
        return [*cmd, "--", node.host]  # then the remote command: one word, already quoted

    def reusing_ssh_command(self, node_name: str) -> list[str]:
        """``ssh_command`` for a short session (a sync, a stage, a survey of the nodes): on a
        connection kept open to the node. (``lounge doctor`` makes its own: it checks what an
        agent's session would meet.)"""
        return self.ssh_command(node_name, reuse=True)

    def _kept(self, cmd: list[str], host: str) -> list[str]:
        """The options that make a session use the connection kept open to ``host`` by
        sessions with exactly these options (``cmd``: port, user, key, known_hosts, ssh_config)
        from this lounge folder, or become it: OpenSSH's ControlMaster, its socket in a private
        folder (see ``connections_dir``), open ``persist`` s after its last session. A new
        connection's handshake (key exchange, authentication: ~0.2 s of the testbed's 0.3 s
        session) is then paid once, not by every sync. No such folder, or persist 0: a
        connection per session."""
        import hashlib

        from ..paths import lounge_dir

        folder = connections_dir()
        if not self.persist or folder is None:
            return ["-o", "ControlPath=none"]
        key = hashlib.sha256("\0".join([str(lounge_dir()), *cmd, host]).encode()).hexdigest()
        return [
            "-o",
            "ControlMaster=auto",
            "-o",
            f"ControlPath={folder}/{key[:24]}",
            "-o",
            f"ControlPersist={self.persist}",
        ]

    def close_connections(self, timeout: float = 10.0) -> None:
        """End the connections kept open to this backend's nodes now (``ssh -O exit``), with
        any session still on them."""
        import subprocess

        for name in self.nodes:
            cmd = self.reusing_ssh_command(name)
            if "ControlMaster=auto" in cmd:
                subprocess.run(
                    [*cmd[:-2], "-O", "exit", *cmd[-2:]],
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=timeout,
                    check=False,
                )

    async def sync_env(
        self, names: list[str] | None = None, force: bool = False, progress: bool = False
    ) -> list[dict]:
        """Preposition this environment on the nodes (see ``jupyter_lounge.sync``); the agents
        started after it run the prepositioned python. Bars (``progress``) are the faces'
        to ask for: a start from the core draws none."""
        from ..sync import sync

        nodes = [self.nodes[n] for n in (list(self.nodes) if names is None else names)]
        return await sync(nodes, self.reusing_ssh_command, force, progress)

    async def stage_data(self, stage: dict[str, str], nodes: list[str], cdir) -> dict:
        """Ship each data set to these nodes' own disks (``lounge stage``; present ones are
        only asked): the agents find them there. A node that cannot have one fails the start,
        saying why."""
        import asyncio

        from .. import stage as staging

        for name, folder in sorted(stage.items()):
            rows = await asyncio.to_thread(
                staging.stage, [self.nodes[n] for n in nodes], self.reusing_ssh_command,
                folder, name, progress=False,
            )  # fmt: skip
            failed = [r for r in rows if r["status"].startswith("failed")]
            if failed:
                raise LoungeError(
                    f"Data set {name!r} could not be staged on "
                    + "; ".join(
                        f"{r['node']} ({r['status'].removeprefix('failed: ')})" for r in failed
                    )  # fmt: skip
                    + "."
                )
        return {}

    async def place(self, agents: list[dict], cdir: Path, cluster: str) -> None:
        from .. import sync

        synced = {}  # node -> fingerprint of the synced environment its agent runs
        if self.sync:
            import warnings

            names = sorted({a["node"] for a in agents})
            synced = sync.remembered([self.nodes[n] for n in names])  # this very environment
            unknown = [n for n in names if n not in synced]
            for row in await self.sync_env(unknown) if unknown else []:
                if row["status"].startswith("failed"):
                    warnings.warn(
                        f"Lounge node {row['node']!r}: the environment could not be synced "
                        f"({row['status'].removeprefix('failed: ')}).",
                        stacklevel=2,
                    )
                else:
                    synced[row["node"]] = row["env"].rsplit("/", 1)[-1]
        for agent in agents:
            node = self.nodes[agent["node"]]
            relay = [
                sys.executable,
                "-m",
                "jupyter_lounge.backends.ssh_relay",
                agent["files"]["spec"],
            ]
            if node.name in synced:
                # the node program checks the env's folders, then becomes its agent
                python = sync.env_dir(node.local_dir, synced[node.name]) + "/bin/python"
                remote, first = sync.launch_command(node, synced[node.name])
                relay += ["--program"] + (["--first", first.decode()] if first else [])
            elif node.windows:  # the agent in the PC's WSL2 distro: no shell on either side
                python = node.python
                remote = sync.wsl_command(node, python, "-m", "jupyter_lounge.node", "--stdio")
            else:
                python = node.python
                remote = f"exec {remote_path(python)} -m jupyter_lounge.node --stdio"
            proc = spawn(
                [*relay, "--", *self.ssh_command(node.name), remote],
                Path(agent["files"]["log"]),
            )
            agent.update(pid=proc.pid, start=started(proc.pid), host=node.host, python=python)

    async def release(self, agents: list[dict], grace: float) -> None:
        # The control files already say stop; give the agents a moment, then end sessions.
        deadline = asyncio.get_running_loop().time() + grace
        while any(ours(a.get("pid"), a.get("start")) for a in agents):
            if asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.1)
        await asyncio.gather(*(kill_group(a.get("pid"), a.get("start"), grace=1.0) for a in agents))

    def agent_state(self, agent: dict) -> tuple[str, str]:
        if ours(agent.get("pid"), agent.get("start")):
            return "alive", ""
        return "lost", f"the SSH session to {agent.get('host')} ended"


#: The longest a kept connection may stay open unused (a day).
MAX_PERSIST_S = 86400


def connections_dir(places: list[str] | None = None) -> str | None:
    """The private folder (0700, ours: see trust.py) the kept connections' sockets are in:
    ``$XDG_RUNTIME_DIR/lounge-ssh``, else ``/tmp/lounge-ssh-UID``. None where neither can be
    trusted (someone else made it first), where the path is too long for a socket's (about
    100 bytes, the socket's name and ssh's temporary suffix included) or has characters an
    ssh option value cannot hold, and on Windows: sessions then make their own connections."""
    import re

    from ..trust import UntrustedPath, private_dir

    if sys.platform == "win32":
        return None
    if places is None:
        places = [f"/tmp/lounge-ssh-{os.geteuid()}"]
        runtime = os.environ.get("XDG_RUNTIME_DIR", "")
        if runtime.startswith("/") and os.path.isdir(runtime):  # never made here: the login's
            places.insert(0, os.path.join(runtime, "lounge-ssh"))
    for path in places:
        if len(path) > 56 or not re.fullmatch(r"[\w./+-]+", path):
            continue
        try:
            return private_dir(path, "SSH connection folder")
        except (UntrustedPath, OSError):
            continue
    return None
