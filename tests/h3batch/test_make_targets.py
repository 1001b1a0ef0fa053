"""`make test-fast` is a working target (issue 30's papercut: it was declared and did nothing): its pytest command,
read from `make -n`, collects the suite without tests/system and without the slow and chaos marks."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys

from tests.h3batch.import_graph import REPO


def _recipe(target: str) -> list[str]:
    """The pytest line `make -n TARGET` would run, as argv (the venv's python swapped for this one)."""
    shown = subprocess.run(["make", "-n", "-C", str(REPO), target, "STAMP=/dev/null"], capture_output=True,
                           text=True, check=True).stdout
    line = next(line for line in shown.splitlines() if " -m pytest" in line)
    argv = shlex.split(line)
    assert argv[1:3] == ["-P", "-m"], line  # safe-path mode, as every process the project starts
    return [sys.executable, *argv[1:]]


def test_make_test_fast_collects_the_suite_without_the_system_tests_and_slow_marks():
    argv = _recipe("test-fast")
    done = subprocess.run([*argv, "--collect-only", "-p", "no:cacheprovider"], cwd=REPO, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    ids = [line for line in done.stdout.splitlines() if line.startswith("tests/") and "::" in line]
    assert len(ids) > 300, done.stdout[-2000:]
    assert not [i for i in ids if i.startswith("tests/system/")]
    assert {i.split("/")[1] for i in ids} >= {"api", "core", "worker", "kernels", "loadrunner", "client", "h3batch"}
    counts = re.search(r"(\d+)/(\d+) tests collected \((\d+) deselected\)", done.stdout)
    assert counts and int(counts.group(3)) > 0, done.stdout[-500:]  # the slow and chaos marks are left out
