"""``lounge doctor``: is each lounge node ready to run engines? One row per check per node.

Each node is asked over its own SSH session, as an agent would be (a Windows PC through its
WSL2 distro, with no shell syntax): first by the node program with the base Python (the OS
and whether it is WSL, the Python, the environment ``lounge sync`` ships, the free disk in
``local_dir``, the GPUs nvidia-smi sees, and whether this machine's controller address
answers from the node: a port opened here for the doctor alone, on the address a cluster
would advertise); then, with a Python that has jupyter_lounge (the synced environment's, or
the node's own), the presence probe the agent runs, and TensorFlow's view of the GPUs.
Every row says ``ok`` or what is wrong and what to do.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import socket
import threading

from .errors import LoungeError

COLUMNS = ["node", "check", "status", "detail"]
MIN_FREE_MIB = 4096  # an environment with TensorFlow takes about 2 GiB; room for two


class _Listener:
    """A port on the controller's address that counts who connected (then closes)."""

    def __init__(self, address: str):
        self.sock = socket.create_server((address, 0))
        self.sock.settimeout(0.2)
        self.address, self.port = address, self.sock.getsockname()[1]
        self.seen = 0
        self.done = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            conn.close()
            self.seen += 1

    def close(self) -> None:
        self.done.set()
        self.sock.close()


def _python_command(node, python: str, *args: str) -> str:
    from .sync import wsl_command

    if node.windows:
        return wsl_command(node, python, *args)
    return shlex.join([python, *args])


async def _ask(backend, node, remote: str, timeout: float, stdin: bytes | None = None) -> dict:
    from .procs import call

    out = await call([*backend.ssh_command(node.name), remote], timeout=timeout, input=stdin)
    return json.loads(out.strip().splitlines()[-1])


def _said(error: Exception) -> str:
    """What the node said, without our command line: its last two lines."""
    said = str(error).rsplit("`", 1)[-1].removeprefix(":").strip().splitlines()[-2:]
    text = " ".join(line.strip() for line in said if line.strip())
    return re.sub(r"^failed with exit code -?\d+: ", "", text)[:300] or type(error).__name__


def _unreachable(node, error: Exception) -> str:
    said = _said(error)
    if node.windows and "WSL_E_DISTRO_NOT_FOUND" in said:
        return (
            f"{said}: wsl_distro {node.wsl_distro!r} is not installed in {node.user or 'the'}'s "
            f"Windows account there: run `wsl --install -d {node.wsl_distro}` in that account, "
            "or name one that `wsl -l -q` lists"
        )
    return f"{said}: check the host, its sshd and your key (ssh -v)"


async def _node(backend, node, hub: _Listener, tensorflow: bool) -> list[dict]:
    from . import envstore, sync

    fp = sync.fingerprint()
    rows: list[dict] = []

    def row(check: str, ok: bool | None, detail: str) -> None:
        status = "skipped" if ok is None else ("ok" if ok else "problem")
        rows.append({"node": node.name, "check": check, "status": status, "detail": detail})

    remote, first = sync.node_program(
        node, "doctor", node.local_dir, fp, hub.address, str(hub.port)
    )
    try:
        seen = await _ask(backend, node, remote, 60, first + envstore.program())
    except (LoungeError, ValueError, IndexError) as e:
        if "exit code 127" not in str(e):  # 127: the session ran, the base Python is missing
            row("ssh", False, _unreachable(node, e))
            return rows
        row("ssh", True, f"{node.user + '@' if node.user else ''}{node.host}:{node.port}")
        row("python", False, f"no {sync.base_python()} there, the base Python of the "
            "environment lounge sync ships: install the same Python at that path")  # fmt: skip
        return rows
    row("ssh", True, f"{node.user + '@' if node.user else ''}{node.host}:{node.port}")
    wants = f"windows (WSL2 distro {node.wsl_distro})" if node.windows else "linux"
    in_wsl = f"WSL2 distro {seen['wsl']}" if seen["wsl"] not in ("", "WSL") else seen["wsl"]
    row(
        "os",
        bool(seen["wsl"]) or not node.windows,
        (f"{in_wsl} on Windows; " if seen["wsl"] else "")
        + seen["os"]
        + ("" if seen["wsl"] or not node.windows else f": the inventory says {wants}, not WSL"),
    )
    base = sync.base_python()
    row("python", True, f"{seen['python']} at {base} (the environment's base)")
    env = seen["env"]
    if env["state"] == "present":
        row("environment", True, f"synced: {sync.env_dir(node.local_dir, fp)}")
    elif env["state"] == "refused":
        row("environment", False, env.get("problem", "refused"))
    else:
        row(
            "environment",
            None,
            f"not synced; `lounge sync` ships it (or use python = {node.python})",
        )
    row(
        "disk",
        seen["free_mib"] >= MIN_FREE_MIB,
        f"{seen['free_mib']} MiB free in {node.local_dir}"
        + ("" if seen["free_mib"] >= MIN_FREE_MIB else f": free at least {MIN_FREE_MIB} MiB"),
    )
    if seen["gpus"]:
        row("gpus", True, f"nvidia-smi: {len(seen['gpus'])} ({seen['gpus'][0]})")
    else:
        need = node.gpus > 0
        why = seen["nvidia_smi_error"] or "no GPU"
        fix = "; install the NVIDIA driver" + (" on Windows (WSL's CUDA)" if node.windows else "")
        row("gpus", False if need else None, why + (fix if need else ""))
    row(
        "controller",
        not seen["hub_error"] and hub.seen > 0,
        f"{hub.address} answers from the node"
        if not seen["hub_error"]
        else f"{hub.address} not reachable from the node: {seen['hub_error']}; open the "
        "firewall between them (engines connect to the controller there)",
    )
    python = sync.env_dir(node.local_dir, fp) + "/bin/python"
    python = python if env["state"] == "present" else node.python
    probe = ["-m", "jupyter_lounge.telemetry"] + (["--windows"] if node.windows else [])
    try:
        sample = await _ask(backend, node, _python_command(node, python, *probe), 30)
        from .telemetry import snapshot

        how, why = snapshot(node.idle, sample)
        problems = sample.get("windows_problems") or []
        row("presence", not problems, f"{how}{f' ({why})' if why else ''}" + "".join(
            f"; {p}" for p in problems))  # fmt: skip
    except (LoungeError, ValueError, IndexError) as e:
        row("presence", False, f"{python} cannot run the probe: {_said(e)}")
    if tensorflow:
        try:
            tf = await _ask(backend, node, _python_command(node, python, "-m", __name__), 180)
            row("tensorflow", *_tensorflow_row(tf, node.gpus))
        except (LoungeError, ValueError, IndexError) as e:
            row("tensorflow", None, f"not importable with {python}: {_said(e)}")
    return rows


ENGINE_WAIT_S = 120.0


def _tensorflow_row(tf: dict, gpus: int) -> tuple[bool, str]:
    """ok and the detail of the tensorflow row, from what ``main`` said on the node."""
    where = f"TensorFlow {tf['version']} in a forked engine"
    if tf.get("fork"):
        return False, f"{where} cannot be: {tf['fork']} after import tensorflow"
    if tf.get("error"):
        return False, f"{where}: {tf['error']}"
    if not tf.get("op"):
        return False, f"{where}: a sum on {tf['device']} came out wrong"
    seen = f"{where} sees {len(tf['gpus'])} GPU(s) and ran an op on {tf['device']}"
    if not tf["gpus"] and gpus:
        return False, (
            f"{seen}, and the inventory says {gpus}: install a TensorFlow built for CUDA "
            "(pip install tensorflow[and-cuda]) in the environment and sync it"
        )
    return True, seen


async def diagnose(backend, tensorflow: bool = True) -> list[dict]:
    """Every node of the ssh backend (its pool), asked at once: the rows of COLUMNS."""
    hub = _Listener(await asyncio.to_thread(backend.listen_address))
    try:
        found = await asyncio.gather(
            *(_node(backend, node, hub, tensorflow) for node in backend.nodes.values())
        )
    finally:
        hub.close()
    return [r for rows in found for r in rows]


def main() -> None:
    """``python -m jupyter_lounge.doctor`` on a node: TensorFlow as an engine has it, as JSON.
    The module is imported here, as an agent's preload is, and a child forked from this
    process (as engines are, CUDA_VISIBLE_DEVICES set after the fork) lists the GPUs and runs
    one op on the first: a preload that breaks forked engines shows here as it would there."""
    import os
    import select

    from .node import detect_gpus, fork_safety_problem

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    said = {"version": tf.__version__, "gpus": [], "fork": fork_safety_problem()}
    if said["fork"]:
        print(json.dumps(said), flush=True)
        return
    gpus = detect_gpus()
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the engine
        os.close(read_fd)
        try:
            if gpus:
                os.environ["CUDA_VISIBLE_DEVICES"] = gpus[0]
            said["gpus"] = [d.name for d in tf.config.list_physical_devices("GPU")]
            said["device"] = "/GPU:0" if said["gpus"] else "/CPU:0"
            with tf.device(said["device"]):
                said["op"] = float(tf.reduce_sum(tf.ones((64, 64))).numpy()) == 4096.0
        except BaseException as e:  # noqa: BLE001 - what broke is the answer
            said["error"] = f"{type(e).__name__}: {e}"
        os.write(write_fd, json.dumps(said).encode())
        os._exit(0)
    os.close(write_fd)
    if select.select([read_fd], [], [], ENGINE_WAIT_S)[0]:
        said = json.loads(os.read(read_fd, 1 << 20) or b"{}") or said | {
            "error": "the forked engine died before it answered"
        }
    else:
        os.kill(pid, 9)
        said["error"] = (
            f"the forked engine did not answer in {ENGINE_WAIT_S:g} s (an op run in the parent "
            "before the fork hangs its children)"
        )
    os.waitpid(pid, 0)
    print(json.dumps(said), flush=True)


if __name__ == "__main__":
    main()
