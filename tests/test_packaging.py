"""The wheel carries both extensions: the sidebar (jupyter-lounge) and the REST API's server
config (jupyter_lounge.serverext). That installed into a clean virtualenv they are listed
enabled and OK is tested by tests/test_binder.py, whose virtualenv is that (``pip install .``
builds this wheel and installs it beside JupyterLab).

The wheel build reuses jupyter_lounge/labextension when ``pip install -e`` already built it
(hatch-jupyter-builder's skip-if-exists); otherwise it runs jlpm and Node.js itself.
"""

from __future__ import annotations

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
def wheel(tmp_path_factory):
    """The wheel, built from this checkout."""
    problem = _build_problem()
    if problem:
        pytest.skip(problem)
    dist = tmp_path_factory.mktemp("packaging") / "dist"
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(dist), str(REPO)],
        "building the wheel",
        cwd=dist.parent,
    )
    (built,) = dist.glob("jupyter_lounge-*.whl")
    return built


def test_wheel_carries_the_lab_extension_and_the_server_config(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    data = "jupyter_lounge-{}.data/data/".format(wheel.name.split("-")[1])
    lab = f"{data}share/jupyter/labextensions/jupyter-lounge/"
    for name in ("package.json", "install.json", "static/style.js"):
        assert f"{lab}{name}" in names, f"{lab}{name} not in {wheel.name}"
    assert any(n.startswith(f"{lab}static/remoteEntry.") for n in names), names
    assert f"{data}etc/jupyter/jupyter_server_config.d/jupyter_lounge.json" in names
    assert not [n for n in names if "node_modules" in n or n.startswith("labextension/")]
