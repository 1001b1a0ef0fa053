"""`h3batch submit` against the live API: progress bar, MP4 download, and the exit codes 0 / 1 / 2."""
from __future__ import annotations

import subprocess
import sys
import time

import requests

from h3batch.worker.h3.mp4 import probe_mp4
from tests.api.conftest import KEY_A, auth
from tests.service_stack import REPO

CLI = [sys.executable, "-P", "-m", "h3batch.cli", "submit"]


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + list(args), cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_submit_wait_out_downloads_the_mp4(stack, tmp_path):
    """--wait --out follows the job with a progress bar to 100 % and saves a decodable MP4; exit 0."""
    out = tmp_path / "x.mp4"
    done = run_cli("a cello note", "--seconds", "4", "--width", "256", "--height", "128", "--seed", "77", "--wait",
                   "--out", str(out), "--api", stack.base, "--api-key", KEY_A)
    assert done.returncode == 0, done.stderr
    assert "completed seed=77" in done.stdout and str(out) in done.stdout
    assert "100%" in done.stderr and "denoise" in done.stderr  # tqdm bar labelled by stage
    info = probe_mp4(out)
    assert (info["width"], info["height"], info["frames"]) == (256, 128, 107)
    assert info["metadata"]["h3batch_seed"] == "77"


def test_submit_without_wait_prints_the_id(stack):
    """Without --wait the command prints the new job id and exits 0 at once."""
    done = run_cli("a gong", "--api", stack.base, "--api-key", KEY_A)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    assert requests.get(f"{stack.base}/jobs/{job_id}", headers=auth(), timeout=60).status_code == 200


def test_bad_input_and_unreachable_api_exit_2_with_one_line(compat_api):
    """A request the API refuses, a bad flag, a missing key and an unreachable API each give exit 2 and one line."""
    cases = [
        (["x", "--width", "100", "--api", compat_api.base, "--api-key", KEY_A], "unsupported_size"),
        (["x", "--seconds", "abc"], "--seconds"),
        (["x", "--api", compat_api.base], "unauthorized"),
        (["x", "--api", "http://127.0.0.1:9", "--api-key", KEY_A], "cannot reach the API"),
    ]
    for args, needle in cases:
        done = run_cli(*args, timeout=60)
        assert done.returncode == 2, (args, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("h3batch submit: "), done.stderr


def _job_ids(base: str) -> set[str]:
    return {j["id"] for j in requests.get(f"{base}/jobs?limit=100", headers=auth(), timeout=10).json()["data"]}


def _batch_ids(base: str) -> set[str]:
    return {b["id"] for b in requests.get(f"{base}/batches?limit=100", headers=auth(), timeout=10).json()["data"]}


def test_every_bad_argument_is_one_line_exit_2_and_creates_nothing(compat_api, tmp_path):
    """A malformed --api URL, a number that is not one, and an --out / --out-dir that cannot be written (through
    /proc, through a plain file, a folder as --out) are refused with exit 2 and one line, before any request: the
    server's job and batch lists are unchanged (the --out case used to render the job and then end in a traceback
    with exit 1)."""
    (tmp_path / "ok.jsonl").write_text('{"prompt": "a gong", "width": 128, "height": 32}\n')
    (tmp_path / "plain").write_text("a file, not a folder")
    api = ["--api", compat_api.base, "--api-key", KEY_A]
    cases = [
        (["x", "--api", "http://[::1"], "--api"),
        (["x", "--api", "http://[::1]:99999"], "--api"),
        (["x", "--api", "ftp://127.0.0.1/"], "--api"),
        (["x", "--api", "127.0.0.1:8000"], "--api"),
        (["x", "--seconds", "nan", *api], "--seconds"),
        (["x", "--seconds", "1e999", *api], "--seconds"),
        (["x", "--timeout", "-1", "--wait", *api], "--timeout"),
        (["--file", str(tmp_path / "ok.jsonl"), "--out-dir", str(tmp_path / "d"), "--poll", "nan", *api], "--poll"),
        (["x", "--wait", "--out", "/proc/nope/x.mp4", *api], "--out: cannot write in /proc/nope"),
        (["x", "--out", str(tmp_path / "plain" / "x.mp4"), *api], "--out: cannot write in"),
        (["x", "--out", str(tmp_path), *api], "--out: "),
        (["--file", str(tmp_path / "ok.jsonl"), "--out-dir", "/proc/1/nope", *api], "--out-dir: cannot write in"),
        (["--file", str(tmp_path / "ok.jsonl"), "--out-dir", str(tmp_path / "plain" / "d"), *api], "--out-dir: "),
    ]
    jobs, batches = _job_ids(compat_api.base), _batch_ids(compat_api.base)
    for args, needle in cases:
        done = run_cli(*args, "--no-progress", timeout=60)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, (args, done.returncode, done.stderr)
        assert lines[0].startswith("h3batch submit: ") and needle in lines[0], (args, lines)
        assert "Traceback" not in done.stderr
    assert _job_ids(compat_api.base) == jobs and _batch_ids(compat_api.base) == batches


def test_cancelled_job_exits_1(stack):
    """When the job ends cancelled (here: cancelled through the API mid-render) the CLI exits 1 saying so."""
    before = {j["id"] for j in requests.get(f"{stack.base}/jobs?limit=100", headers=auth(), timeout=60).json()["data"]}
    proc = subprocess.Popen(CLI + ["a long drone", "--wait", "--api", stack.base, "--api-key", KEY_A,
                                   "--no-progress"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 30
        job_id = None
        while job_id is None:
            assert time.monotonic() < deadline, "the CLI never created its job"
            fresh = [j["id"] for j in requests.get(f"{stack.base}/jobs?limit=100", headers=auth(),
                                                   timeout=60).json()["data"] if j["id"] not in before]
            job_id = fresh[0] if fresh else None
            time.sleep(0.05)
        assert requests.post(f"{stack.base}/jobs/{job_id}/cancel", headers=auth(), timeout=60).status_code == 202
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err
    assert err.strip() == f"h3batch submit: job {job_id} cancelled (user)", err
