"""No folder of a checkout can shadow an installed distribution (issue P1).

The checkout's rooms are top-level folders (`kernels/`, `worker/`, `api/`, `core/`, `loadrunner/`) that install as
`h3batch.*`. A Python process started with the checkout on sys.path would import them under their bare names instead
of what is installed: transformers >= 5.25 imports the PyPI distribution `kernels`, and got ours. Every process the
project starts therefore runs in Python's safe-path mode (`-P`), and the suite itself runs under `python -P` with
pytest's importlib import mode. These tests hold that from the outside: a decoy checkout whose top-level packages
leave a mark when imported, and the real one.
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest
import requests

from tests.service_stack import REPO, free_port, wait_http

DECOYS = ("kernels", "worker", "api", "core", "loadrunner", "h3batch")
H3BATCH_BIN = Path(sys.executable).with_name("h3batch")


def _decoy_checkout(root: Path) -> Path:
    """A folder laid out like a checkout whose top-level packages append their name to `imported.txt` on import."""
    marks = root / "imported.txt"
    for name in DECOYS:
        (root / name).mkdir()
        (root / name / "__init__.py").write_text(
            f"with open({str(marks)!r}, 'a') as f:\n    f.write({name!r} + '\\n')\n")
    return marks


def _descendants(pid: int) -> list[int]:
    """Every live process below `pid`, read from /proc (children of children included)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [], [pid]
    while frontier:
        current = frontier.pop()
        children = [child for child, parent in parents.items() if parent == current]
        found += children
        frontier += children
    return found


def _python_flags(pid: int) -> tuple[list[str], dict[str, str]] | None:
    """(argv, environment) of a live Python process, or None for another program or one that is gone."""
    try:
        argv = (Path("/proc") / str(pid) / "cmdline").read_bytes().decode().split("\0")
        environ = (Path("/proc") / str(pid) / "environ").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return None
    if "python" not in Path(argv[0]).name:
        return None
    return argv, dict(item.split("=", 1) for item in environ if "=" in item)


def test_the_installed_kernels_distribution_is_what_a_process_in_the_checkout_imports():
    """With the PyPI `kernels` distribution installed (transformers >= 5.25 needs it), a `python -P` started in the
    checkout root imports that distribution, not the checkout's `kernels/` folder; without -P it would not."""
    assert metadata.distribution("kernels").version  # installed from the lock
    probe = "import kernels, json; print(json.dumps(kernels.__file__))"
    safe = subprocess.run([sys.executable, "-P", "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert safe.returncode == 0, safe.stderr
    assert "site-packages" in json.loads(safe.stdout)
    unsafe = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120,
                            env={k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"})
    assert json.loads(unsafe.stdout) == str(REPO / "kernels" / "__init__.py")  # the hazard this guards against


def test_serve_and_its_children_never_import_a_folder_of_the_checkout(tiny_release, tmp_path):
    """`h3batch serve` started in a checkout-like folder renders a job (the worker loads transformers and diffusers,
    which import `kernels`), and no process of it imports a top-level folder of that checkout; every Python child
    runs in safe-path mode. PYTHONSAFEPATH is removed from the environment, so each child's -P is its own."""
    marks = _decoy_checkout(tmp_path)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("H3BATCH_") and k != "PYTHONSAFEPATH"}
    env.update(HF_HUB_OFFLINE="1", H3BATCH_RELEASE=str(tiny_release),
               H3BATCH_HF_CACHE=str(tiny_release.parent / "hf-cache"))
    log = (tmp_path / "serve.log").open("wb")
    serve = subprocess.Popen([str(H3BATCH_BIN), "serve", "--port", str(port)], cwd=tmp_path, env=env, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(base + "/readyz", timeout_s=600, proc=serve)
        job = requests.post(f"{base}/jobs", json={"prompt": "a bell in fog", "seconds": 4, "width": 128,
                                                  "height": 32, "seed": 5}, timeout=30)
        assert job.status_code == 202, job.text
        deadline = time.monotonic() + 600
        while (status := requests.get(f"{base}/jobs/{job.json()['id']}?wait=30", timeout=60).json()["status"]) \
                not in ("completed", "failed", "cancelled"):
            assert time.monotonic() < deadline, status
        assert status == "completed", (tmp_path / "serve.log").read_text()[-3000:]
        pythons = {pid: flags for pid in _descendants(serve.pid) if (flags := _python_flags(pid)) is not None}
        assert len(pythons) >= 2, pythons  # the worker and the API (gunicorn master and its worker) at least
        for pid, (argv, child_env) in pythons.items():
            assert "-P" in argv[1:3] or child_env.get("PYTHONSAFEPATH"), (pid, argv)
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGTERM)
            try:
                serve.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(serve.pid, signal.SIGKILL)
                serve.wait()
        log.close()
    assert not marks.exists(), f"imported from the checkout: {marks.read_text().split()}"


@pytest.mark.parametrize("room", ["kernels", "worker", "api", "core", "loadrunner"])
def test_the_test_runner_does_not_put_the_checkout_on_sys_path(room):
    """The suite runs under `python -P` with pytest's importlib mode: none of the rooms is importable by its bare
    name from inside a test, so a test can only reach the product as `h3batch.*`."""
    spec = importlib.util.find_spec(room)
    assert spec is None or "site-packages" in str(spec.origin), (room, spec.origin)
