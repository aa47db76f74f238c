"""ipyparallel's own tests, the modules installed with it, run against lounge engines by the
plugin in tests/ipp_lounge.py (one lounge cluster per module in place of their ipcontroller
and ipengine processes). A stock expectation that deliberately differs is listed in the
plugin with its reason; nothing else is skipped."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import ipyparallel
import pytest

MODULES = [
    "test_view_broadcast",
    "test_magics",
    "test_client",
    "test_view",
    "test_asyncresult",
    "test_lbview",
    "test_dependency",
    "test_executor",
    "test_remotefunction",
    "test_label",
]

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_ipyparallel_suite_passes_on_lounge_engines(tmp_path, lounge_dir):
    report = tmp_path / "ipp.xml"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "tests.ipp_lounge",
            "-p",
            "no:cacheprovider",
            "--rootdir",  # theirs: test ids name their modules; our conftest stays out
            str(Path(ipyparallel.__file__).parent.parent),
            "-c",
            os.devnull,
            "--timeout=120",
            "-q",
            "-rfEs",
            f"--junitxml={report}",
            "--pyargs",
            *(f"ipyparallel.tests.{m}" for m in MODULES),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=1400,
    )
    tail = (run.stdout + run.stderr)[-6000:]
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    assert counts["failures"] == counts["errors"] == 0 and run.returncode == 0, tail
    ran = {
        next(
            (part for part in case.get("classname", "").split(".") if part.startswith("test_")), ""
        )
        for case in suite.iter("testcase")
    }
    assert ran == set(MODULES), f"modules that ran: {sorted(ran)}\n{tail}"
    # every module's tests, not a handful: stock ipyparallel 9.2 has ~300 in these modules
    assert counts["tests"] - counts["skipped"] > 250, (counts, tail)
