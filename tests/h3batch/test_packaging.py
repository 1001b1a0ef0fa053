"""The installed package: built as a wheel, installed into a fresh venv outside the checkout, and run from there.

The fresh venv borrows the test venv's third-party packages through a `.pth` line (installing torch again would take
minutes), but h3batch itself comes only from the wheel: the test checks every h3batch module it runs lives in the
fresh venv, so a package or data file missing from pyproject.toml fails here.
"""
from __future__ import annotations

import re
import shutil
import site
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest
import requests

from tests.conftest import free_port
from tests.h3batch.import_graph import REPO, ROOMS


def test_every_package_folder_is_listed_in_pyproject():
    """pyproject.toml lists exactly the folders that hold an __init__.py under each room (none left out of the wheel)."""
    tool = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert tool["package-dir"] == ROOMS
    found = set()
    for package, folder in ROOMS.items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder)
            found.add(".".join([package, *rel.parts]))
    assert set(tool["packages"]) == found


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv (outside the checkout) with the h3batch wheel installed; returns its bin directory."""
    root = tmp_path_factory.mktemp("installed")
    # Build from a copy of the tracked files: setuptools writes build/ into the source tree it builds.
    source = root / "source"
    tracked = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                             capture_output=True, check=True).stdout
    for name in filter(None, tracked.decode().split("\0")):
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    wheels = root / "wheels"
    subprocess.run([sys.executable, "-P", "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(wheels), str(source)], check=True, timeout=300, cwd=root)
    wheel = next(wheels.glob("h3batch-*.whl"))
    venv = root / "venv"
    subprocess.run([sys.executable, "-P", "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    # Third-party packages from the test venv; its editable h3batch finder is a .pth there and is not processed.
    (purelib / "test_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    subprocess.run([str(venv / "bin" / "python"), "-P", "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--target", str(purelib), str(wheel)], check=True, timeout=300, cwd=root)
    return venv / "bin"


def _run(bin_dir: Path, *args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(bin_dir / "python"), "-P", "-m", "h3batch", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def test_installed_copy_is_the_one_imported(installed, tmp_path):
    """Every room imports from the fresh venv, never from the checkout."""
    code = ("import h3batch, h3batch.core, h3batch.api, h3batch.worker, h3batch.kernels, h3batch.loadrunner, sys\n"
            "print('\\n'.join(m.__file__ for n, m in sorted(sys.modules.items()) if n.startswith('h3batch')))")
    out = subprocess.run([str(installed / "python"), "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=tmp_path, check=True).stdout.split()
    venv = installed.parent
    assert out and all(Path(f).resolve().is_relative_to(venv.resolve()) for f in out), out


def test_installed_cli_help_and_check_release(installed, tmp_path):
    """`h3batch --help` lists the commands; build-tiny then check-release pass on the installed copy; a bad
    argument is one line and exit 2."""
    help_ = _run(installed, "--help", cwd=tmp_path)
    assert help_.returncode == 0 and "check-release" in help_.stdout and "duplex-server" in help_.stdout
    release = tmp_path / "tiny-release"
    built = _run(installed, "build-tiny", "--out", str(release), cwd=tmp_path, timeout=600)
    assert built.returncode == 0, built.stderr
    checked = _run(installed, "check-release", str(release), cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    bad = _run(installed, "check-release", "--no-such-flag", cwd=tmp_path)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_installed_api_serves_the_web_page(installed, tmp_path, redis_url):
    """The installed API (a real gunicorn process) serves GET / with its template and the static script."""
    port = free_port()
    env = {"H3BATCH_REDIS_URL": redis_url, "H3BATCH_ARTIFACTS_DIR": str(tmp_path / "artifacts"),
           "PATH": str(installed) + ":/usr/bin:/bin"}
    proc = subprocess.Popen([str(installed / "python"), "-P", "-m", "h3batch", "api", "--port", str(port)], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                page = requests.get(base + "/", timeout=2)
                break
            except requests.ConnectionError:
                if proc.poll() is not None:
                    pytest.fail(f"installed API exited: {proc.stdout.read()}")
                subprocess.run(["sleep", "0.1"])
        else:
            pytest.fail("installed API did not answer within 30 s")
        assert page.status_code == 200 and "<html" in page.text.lower()
        script = re.search(r'src="([^"]*app\.js[^"]*)"', page.text)
        assert script, "the page links no app.js"
        static = requests.get(base + script.group(1), timeout=60)
        assert static.status_code == 200 and len(static.content) > 100
    finally:
        proc.terminate()
        proc.wait(timeout=20)
