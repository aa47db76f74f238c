"""Binder smoke test: a fresh virtualenv built only from binder/'s files, as mybinder.org does.

The repository's tracked files are copied to a temporary folder (so nothing built here, no
labextension and no node_modules, is reused); a new venv gets ``binder/requirements.txt``,
then ``binder/postBuild`` runs in the copy (it installs jupyter_lounge from it, building the
sidebar and the wheel). Then JupyterLab there must list both extensions, the sidebar and the
REST API, enabled and OK in the venv's own folders, and
``examples/01-quickstart.ipynb`` must execute in that venv's kernel, through
``binder/start``, leaving no cluster behind.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_lounge import state

from .conftest import processes_under

ROOT = Path(__file__).resolve().parent.parent
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _run(cmd, *, cwd, env, timeout, what):
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (
        f"{what} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout + done.stderr


def _sections(output: str, header: str) -> dict[str, list[str]]:
    """The lines of a ``jupyter ... list`` output under each directory it names: a line
    starting with ``header`` (``Config dir:``), or with ``/`` when header is empty."""
    sections: dict[str, list[str]] = {}
    current = ""
    for line in output.splitlines():
        stripped = line.strip()
        if header and stripped.startswith(header):
            current = stripped[len(header) :].strip()
            sections.setdefault(current, [])
        elif not header and stripped.startswith("/"):
            current = stripped
            sections.setdefault(current, [])
        elif stripped:
            sections.setdefault(current, []).append(stripped)
    return sections


def labextension_problem(out: str, venv: Path) -> str | None:
    """Why ``jupyter labextension list`` (its output ``out``) does not show the sidebar
    enabled and OK in ``venv``'s own labextensions folder; None when it does."""
    where = str(venv / "share" / "jupyter" / "labextensions")
    lines = _sections(ANSI.sub("", out), "").get(where, [])
    if any(re.match(r"jupyter-lounge v\S+ enabled\s+OK\b", line) for line in lines):
        return None
    return f"jupyter-lounge is not enabled and OK in {where}:\n{out}"


def serverext_problem(out: str, venv: Path) -> str | None:
    """Why ``jupyter server extension list`` (``out``) does not show the REST API enabled and
    validated OK in ``venv``'s own config; None when it does."""
    where = str(venv / "etc" / "jupyter")
    lines = _sections(ANSI.sub("", out), "Config dir:").get(where, [])
    if "jupyter_lounge.serverext enabled" not in lines:
        return f"jupyter_lounge.serverext is not enabled in {where}:\n{out}"
    if not any(re.match(r"jupyter_lounge\.serverext\b.*\bOK$", line) for line in lines):
        return f"jupyter_lounge.serverext did not validate OK:\n{out}"
    return None


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a venv, pip, a lab build: 6 min here (each step has its own)
def test_binder_files_alone_give_lab_with_the_extension_and_a_running_quickstart(
    tmp_path, lounge_dir
):
    if not shutil.which("git") or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout to copy the tracked files from")
    repo = tmp_path / "repo"
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
    ).stdout.split(b"\0")
    for name in filter(None, (f.decode() for f in files)):
        if not (ROOT / name).exists():
            continue  # deleted in the working tree, not yet committed
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, repo / name)

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    bin_ = venv / "bin"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("VIRTUAL_ENV", "PYTHONPATH", "JUPYTER_PATH", "JUPYTER_CONFIG_DIR")
    }
    env.update(
        PATH=f"{bin_}:{env['PATH']}",
        VIRTUAL_ENV=str(venv),
        HOME=str(tmp_path / "home"),  # a Binder user's own, empty home
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_CACHE_DIR=os.environ.get("PIP_CACHE_DIR", os.path.expanduser("~/.cache/pip")),
        YARN_GLOBAL_FOLDER=os.path.expanduser("~/.yarn/berry"),  # this machine's package cache
        JUPYTER_LOUNGE_DIR=str(lounge_dir),
    )
    (tmp_path / "home").mkdir()
    pip = [str(bin_ / "python"), "-m", "pip", "install", "--quiet"]
    _run(
        [*pip, "-r", "binder/requirements.txt"],
        cwd=repo,
        env=env,
        timeout=1200,
        what="pip install -r binder/requirements.txt",
    )
    _run(["bash", "binder/postBuild"], cwd=repo, env=env, timeout=1200, what="binder/postBuild")

    labext = _run(
        ["binder/start", str(bin_ / "jupyter"), "labextension", "list"],
        cwd=repo,
        env=env,
        timeout=120,
        what="jupyter labextension list",
    )
    problem = labextension_problem(labext, venv)
    assert problem is None, problem
    serverext = _run(
        ["binder/start", str(bin_ / "jupyter"), "server", "extension", "list"],
        cwd=repo,
        env=env,
        timeout=120,
        what="jupyter server extension list",
    )
    problem = serverext_problem(serverext, venv)
    assert problem is None, problem

    out = tmp_path / "executed.ipynb"
    _run(
        [
            "binder/start",
            str(bin_ / "jupyter"),
            "nbconvert",
            "--to",
            "notebook",
            "--execute",
            "--ExecutePreprocessor.timeout=600",
            "--ExecutePreprocessor.kernel_name=python3",
            f"--output={out}",
            "examples/01-quickstart.ipynb",
        ],
        cwd=repo,
        env=env,
        timeout=900,
        what="executing examples/01-quickstart.ipynb",
    )
    import nbformat

    nb = nbformat.read(out, as_version=4)
    text = "".join(
        o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
    )
    assert "3/3 engines ready" in text and "140" in text, text[-2000:]
    assert str(venv) in _run(  # the kernel was the Binder venv's, not this one's
        [str(bin_ / "python"), "-c", "import jupyter_lounge; print(jupyter_lounge.__file__)"],
        cwd=tmp_path,
        env=env,
        timeout=60,
        what="import jupyter_lounge in the Binder venv",
    )
    assert state.list_states() == []
    assert processes_under(str(lounge_dir)) == []
