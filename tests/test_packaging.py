"""The wheel carries both extensions: built here, installed with JupyterLab into a clean
virtualenv, where ``jupyter labextension list`` shows the sidebar (jupyter-lounge) and
``jupyter server extension list`` shows the REST API (jupyter_lounge.serverext), each
enabled and OK.

The wheel build reuses jupyter_lounge/labextension when ``pip install -e`` already built it
(hatch-jupyter-builder's skip-if-exists); otherwise it runs jlpm and Node.js itself. The
clean virtualenv gets the versions this venv has (a constraints file from ``pip freeze``),
so pip's cache serves them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BUILT = [
    REPO / "jupyter_lounge" / "labextension" / "package.json",
    REPO / "jupyter_lounge" / "labextension" / "static" / "style.js",
]
ANSI = re.compile(r"\x1b\[[0-9;]*m")

pytestmark = pytest.mark.timeout(900)


def _run(cmd: list[str], what: str, timeout: float = 600, **kwargs) -> str:
    """Run a command; its stdout and stderr together, without colours, or a failure that
    quotes them."""
    proc = subprocess.run(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        **kwargs,
    )
    out = ANSI.sub("", proc.stdout)
    if proc.returncode != 0:
        pytest.fail(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n{out[-4000:]}")
    return out


def _build_problem() -> str | None:
    """Why the wheel cannot be built here, or None."""
    if not (REPO / "labextension" / "package.json").exists():
        return "no labextension/package.json: not a source checkout"
    if not all(p.exists() for p in BUILT) and not shutil.which("node"):
        return (
            "the JupyterLab extension is not built (jupyter_lounge/labextension) and Node.js, "
            "needed to build it, is not on PATH: install Node.js >= 20"
        )
    try:
        import venv  # noqa: F401
    except ImportError:
        return "this Python has no venv module (Debian: apt-get install python3-venv)"
    return None


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(wheel, venv, env) with the wheel and JupyterLab installed in a clean virtualenv."""
    problem = _build_problem()
    if problem:
        pytest.skip(problem)
    tmp = tmp_path_factory.mktemp("packaging")
    dist = tmp / "dist"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(dist), str(REPO)],
        "building the wheel",
        cwd=tmp,
    )
    (wheel,) = dist.glob("jupyter_lounge-*.whl")

    frozen = _run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"], "pip freeze", timeout=120
    )
    constraints = tmp / "constraints.txt"
    constraints.write_text(
        "".join(f"{line}\n" for line in frozen.splitlines() if re.match(r"^[\w.-]+==", line))
    )

    venv = tmp / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    _run([base, "-m", "venv", str(venv)], "creating a clean virtualenv", timeout=300)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    _run(
        [*pip, "-c", str(constraints), str(wheel), "jupyterlab"],
        "installing the wheel and JupyterLab into the clean virtualenv",
        cwd=tmp,
    )

    # Only the clean venv's own Jupyter paths: no user config, no other venv on PATH.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER", "PYTHON"))}
    env.pop("VIRTUAL_ENV", None)
    env.update(
        VIRTUAL_ENV=str(venv),
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', os.defpath)}",
        JUPYTER_CONFIG_DIR=str(tmp / "user-config"),
        JUPYTER_DATA_DIR=str(tmp / "user-data"),
        JUPYTER_RUNTIME_DIR=str(tmp / "runtime"),
    )
    return wheel, venv, env


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


def test_wheel_carries_the_lab_extension_and_the_server_config(installed):
    wheel, _, _ = installed
    names = zipfile.ZipFile(wheel).namelist()
    data = "jupyter_lounge-{}.data/data/".format(wheel.name.split("-")[1])
    lab = f"{data}share/jupyter/labextensions/jupyter-lounge/"
    for name in ("package.json", "install.json", "static/style.js"):
        assert f"{lab}{name}" in names, f"{lab}{name} not in {wheel.name}"
    assert any(n.startswith(f"{lab}static/remoteEntry.") for n in names), names
    assert f"{data}etc/jupyter/jupyter_server_config.d/jupyter_lounge.json" in names
    assert not [n for n in names if "node_modules" in n or n.startswith("labextension/")]


def test_jupyter_labextension_list_shows_the_sidebar_enabled_and_ok(installed):
    _, venv, env = installed
    out = _run(
        [str(venv / "bin" / "jupyter"), "labextension", "list"],
        "jupyter labextension list",
        timeout=180,
        env=env,
        cwd=venv,
    )
    where = str(venv / "share" / "jupyter" / "labextensions")
    lines = _sections(out, "").get(where, [])
    assert any(re.match(r"jupyter-lounge v\S+ enabled\s+OK\b", line) for line in lines), (
        f"jupyter-lounge is not enabled and OK in {where}:\n{out}"
    )


def test_jupyter_server_extension_list_shows_the_api_enabled_and_ok(installed):
    _, venv, env = installed
    out = _run(
        [str(venv / "bin" / "jupyter"), "server", "extension", "list"],
        "jupyter server extension list",
        timeout=180,
        env=env,
        cwd=venv,
    )
    where = str(venv / "etc" / "jupyter")
    lines = _sections(out, "Config dir:").get(where, [])
    assert "jupyter_lounge.serverext enabled" in lines, (
        f"jupyter_lounge.serverext is not enabled in {where}:\n{out}"
    )
    assert any(re.match(r"jupyter_lounge\.serverext\b.*\bOK$", line) for line in lines), (
        f"jupyter_lounge.serverext did not validate OK:\n{out}"
    )
