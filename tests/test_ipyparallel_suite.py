"""ipyparallel's own tests, the modules installed with it, run against lounge engines by the
plugin in tests/ipp_lounge.py (one lounge cluster per module in place of their ipcontroller
and ipengine processes). A stock expectation that deliberately differs is listed in the
plugin with its reason; nothing else is skipped."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import ipyparallel
import pytest

#: their modules in two groups of about equal time (2 min each here), run side by side: the
#: tests mostly wait (on heartbeats, timeouts, sleeps), so two at once take little more than one
GROUPS = [
    ["test_view_broadcast", "test_view", "test_label", "test_executor", "test_dependency",
     "test_remotefunction"],
    ["test_client", "test_magics", "test_asyncresult"],
]  # fmt: skip
#: then these, alone: they bound what happens within a wall-clock time (test_lbview's
#: test_imap_max_outstanding: 5 tasks submitted by the first result of a 0.1 s task), which
#: the two groups side by side on 2 cores missed twice in a row in make test
ALONE = ["test_lbview"]
MODULES = [m for group in GROUPS for m in group] + ALONE

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_ipyparallel_suite_passes_on_lounge_engines(tmp_path, lounge_dir):
    runs = []
    deadline = time.monotonic() + 1400

    def wait_for(runs) -> None:
        for _, out, proc in runs:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 1))
            except subprocess.TimeoutExpired:
                pass
            out.seek(0)

    try:  # all of them ended before anything is asserted, and none outlives the test
        for i, group in enumerate([*GROUPS, ALONE]):
            if group is ALONE:
                wait_for(runs)  # the groups side by side first
            where = tmp_path / f"group{i}"
            where.mkdir()
            env = {
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "JUPYTER_LOUNGE_DIR": str(lounge_dir / str(i)),
            }
            out = open(where / "out.txt", "w+")
            runs.append((where, out, subprocess.Popen(
                [
                    sys.executable, "-m", "pytest", "-p", "tests.ipp_lounge",
                    "-p", "no:cacheprovider",
                    "--rootdir",  # theirs: test ids name their modules; our conftest stays out
                    str(Path(ipyparallel.__file__).parent.parent),
                    "-c", os.devnull, "--timeout=120", "-q", "-rfEs",
                    f"--junitxml={where / 'ipp.xml'}",
                    "--pyargs", *(f"ipyparallel.tests.{m}" for m in group),
                ],
                cwd=where, env=env, stdout=out, stderr=subprocess.STDOUT, text=True,
            )))  # fmt: skip
        wait_for(runs)
    finally:
        for _, _, proc in runs:
            if proc.poll() is None:
                proc.kill()  # (its clusters are under lounge_dir: the fixture ends them)
                proc.wait()
    counts = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    ran, tails = set(), []
    for where, out, proc in runs:
        with out:
            tails.append(f"-- {where.name} (exit {proc.returncode}) --\n" + out.read()[-5000:])
        assert (where / "ipp.xml").exists(), tails[-1]
        suite = ET.parse(where / "ipp.xml").getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        for k in counts:
            counts[k] += int(suite.get(k, 0))
        ran |= {
            next((p for p in case.get("classname", "").split(".") if p.startswith("test_")), "")
            for case in suite.iter("testcase")
        }
        assert proc.returncode == 0, tails[-1]
    tail = "\n".join(tails)
    assert counts["failures"] == counts["errors"] == 0, tail
    assert ran == set(MODULES), f"modules that ran: {sorted(ran)}\n{tail}"
    # every module's tests, not a handful: stock ipyparallel 9.2 has ~300 in these modules
    assert counts["tests"] - counts["skipped"] > 250, (counts, tail)
