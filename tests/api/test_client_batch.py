"""`h3batch submit --file` against the live stack (API under gunicorn, the real worker on the tiny release): one
4-item batch interrupted with SIGTERM, resumed to completion (same batch, no second one) with every MP4 decoded,
re-run as a no-op, re-found by its Idempotency-Key, its archive continued from a partial file, and fetched item by
item; a failed item and its exit code; a bad file and a refused batch that queue nothing. Five renders in all."""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time

import requests

from h3batch.client import cli_batch as client_batch
from h3batch.worker.h3.mp4 import probe_mp4
from tests.api.conftest import KEY_A, KEY_B, auth
from tests.service_stack import REPO

CLI = [sys.executable, "-P", "-m", "h3batch.cli", "submit"]
CANVAS = {"width": 128, "height": 64, "seconds": 4}
"""The smallest canvas the tiny release takes (aspect 2:1, multiples of 32): the renders stay short."""
NAMES = ["rain", "gong", "0002", "surf"]
"""The files of the 4-item batch: custom_id, or the input index for the line without one."""


def run_cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + list(args), cwd=REPO, capture_output=True, text=True, timeout=timeout)


def prompts_file(path, lines: list[dict]):
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def four_items(path):
    return prompts_file(path, [
        {"custom_id": "rain", "prompt": "rain on a tin roof", "seed": 1, **CANVAS},
        {"custom_id": "gong", "prompt": "a temple gong", "seed": 2, **CANVAS},
        {"prompt": "wind in tall grass", "seed": 3, **CANVAS},
        {"custom_id": "surf", "prompt": "surf on a reef", "seed": 4, **CANVAS},
    ])


def batch_ids(base: str, key: str = KEY_A) -> list[str]:
    reply = requests.get(f"{base}/batches?limit=100", headers=auth(key), timeout=60)
    assert reply.status_code == 200, reply.text
    body = reply.json()
    return [b["id"] for b in body.get("data", body.get("batches", []))]


def job_count(base: str, key: str) -> int:
    reply = requests.get(f"{base}/jobs?limit=100", headers=auth(key), timeout=60)
    assert reply.status_code == 200, reply.text
    return len(reply.json()["data"])


def state_of(out_dir) -> dict:
    return json.loads((out_dir / client_batch.STATE_NAME).read_text())


def assert_clips(out_dir, names: list[str]) -> None:
    """Each named MP4 is in out_dir and decodes with PyAV at the test canvas (4 s: 107 frames)."""
    for name in names:
        info = probe_mp4(out_dir / f"{name}.mp4")
        assert (info["width"], info["height"], info["frames"]) == (128, 64, 107), name
        assert info["audio_samples"] > 0 and info["channels"] == 2, name
    assert not list(out_dir.glob(".*.partial")), list(out_dir.iterdir())


def test_batch_interrupted_resumed_completed_and_rerun(stack, tmp_path):
    """One 4-item batch through every resume path. SIGTERM mid-run: exit 130 saying how to resume. The same command
    again: re-attaches to the same batch (no second one), one bar counting items with the server's ETA, the archive
    unzipped into --out-dir with every MP4 decoded and manifest.jsonl beside them. Again: nothing downloaded. With
    the state file lost (as if killed between the POST and its write): the Idempotency-Key gets the same batch. A
    half-downloaded archive is continued with a Range request. --no-archive after losing two clips fetches those two."""
    src = four_items(tmp_path / "prompts.jsonl")
    out = tmp_path / "clips"
    before = set(batch_ids(stack.base))
    args = ["--file", str(src), "--out-dir", str(out), "--poll", "0.2", "--api", stack.base, "--api-key", KEY_A]
    proc = subprocess.Popen(CLI + args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600  # a hang guard, not a time bound
        while not (out / client_batch.STATE_NAME).exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the CLI never wrote its state"
            time.sleep(0.05)
        batch_id = state_of(out)["batch_id"]
        while True:  # mid-run: an item rendering or rendered, not all of them
            batch = requests.get(f"{stack.base}/batches/{batch_id}", headers=auth(), timeout=60).json()
            if batch["counts"]["in_progress"] + batch["counts"]["completed"] >= 1:
                break
            assert time.monotonic() < deadline, batch
            time.sleep(0.05)
        assert batch["counts"]["completed"] < 4, "the batch finished before the CLI could be interrupted"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=300)  # a hang guard: it exits at the signal (test_client_batch_file.py)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert f"interrupted (batch {batch_id} keeps running on the server; run the same command again to resume)" in err

    done = run_cli(*args)
    assert done.returncode == 0, done.stderr
    assert f"resuming batch {batch_id}" in done.stderr
    assert done.stdout.strip().startswith(f"{batch_id} completed: 4/4 items completed -> {out} (archive "), done.stdout
    assert "4/4 items" in done.stderr and "eta " in done.stderr  # the one tqdm bar: items and the server's ETA
    assert set(batch_ids(stack.base)) - before == {batch_id}  # no duplicate batch
    assert_clips(out, NAMES)
    manifest = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines() if line.strip()]
    assert [(m["index"], m["custom_id"], m["status"]) for m in manifest] == \
        [(0, "rain", "completed"), (1, "gong", "completed"), (2, None, "completed"), (3, "surf", "completed")]
    state = state_of(out)
    assert state["batch_id"] == batch_id and state["api"] == stack.base
    assert set(state["files"]) >= {f"{n}.mp4" for n in NAMES}

    again = run_cli(*args)
    assert again.returncode == 0, again.stderr
    assert f"resuming batch {batch_id} (completed)" in again.stderr
    assert again.stdout.strip().endswith("(all files already here)"), again.stdout

    (out / client_batch.STATE_NAME).unlink()
    third = run_cli(*args)
    assert third.returncode == 0, third.stderr
    assert "resuming" not in third.stderr and third.stdout.startswith(f"{batch_id} completed"), third.stdout
    assert state_of(out)["batch_id"] == batch_id
    assert set(batch_ids(stack.base)) - before == {batch_id}

    # A partial archive is continued with a Range request: keep its first half in a fresh out-dir and run there.
    archive = requests.get(f"{stack.base}/batches/{batch_id}/archive", headers=auth(), timeout=30).content
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    copy = dict(state, files={})
    copy.pop("archive", None)
    client_batch.save_state(resumed, copy)
    (resumed / f".{batch_id}.zip.partial").write_bytes(archive[: len(archive) // 2])
    fourth = run_cli(*args[:3], str(resumed), *args[4:])
    assert fourth.returncode == 0, fourth.stderr
    assert f"resumed at byte {len(archive) // 2})" in fourth.stdout, fourth.stdout
    assert_clips(resumed, NAMES)

    # --no-archive into the first out-dir after losing two clips: only those two are fetched, item by item.
    (out / "rain.mp4").unlink()
    (out / "surf.mp4").write_bytes(b"truncated")
    kept = (out / "gong.mp4").stat().st_mtime_ns
    fifth = run_cli(*args, "--no-archive")
    assert fifth.returncode == 0, fifth.stderr
    assert fifth.stdout.strip().endswith("(4 files)"), fifth.stdout
    assert_clips(out, NAMES)
    assert (out / "gong.mp4").stat().st_mtime_ns == kept
    assert set(batch_ids(stack.base)) - before == {batch_id}


def test_failed_item_is_one_line_and_exit_1(stack, tmp_path):
    """With --on-invalid skip a line the server refuses is reported as skipped (by its file line) and the rest runs;
    an item the worker fails (it asks for a release the worker does not serve) is listed at the end with its error
    code; the completed item is still saved; exit 1."""
    src = prompts_file(tmp_path / "p.jsonl", [
        {"custom_id": "fine", "prompt": "a kettle whistling", "seed": 5, **CANVAS},
        {"custom_id": "wrong", "prompt": "a kettle", "release": "someone/else@v9", **CANVAS},
        {"custom_id": "odd", "prompt": "a kettle", **CANVAS, "width": 100},
    ])
    out = tmp_path / "clips"
    done = run_cli("--file", str(src), "--out-dir", str(out), "--poll", "0.3", "--on-invalid", "skip",
                   "--api", stack.base, "--api-key", KEY_A)
    assert done.returncode == 1, done.stderr
    assert "h3batch submit: skipped p.jsonl line 3: width" in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("h3batch submit: item ")]
    assert len(lines) == 1 and lines[0].startswith("h3batch submit: item 1 [wrong]: failed (release_mismatch: "), \
        done.stderr
    assert "1/2 items completed" in done.stdout, done.stdout
    assert_clips(out, ["fine"])
    assert not (out / "wrong.mp4").exists()


def test_bad_file_and_refused_batch_queue_nothing(stack, tmp_path):
    """A line without a prompt stops the CLI before sending (exit 2, one line naming it); a line the server refuses
    (a width that is no multiple of 32) is the server's 422 printed one line per bad item, with the file's line
    numbers; neither leaves a batch or a job behind (checked with a key that is used nowhere else)."""
    out = tmp_path / "clips"
    jobs_before, batches_before = job_count(stack.base, KEY_B), len(batch_ids(stack.base, KEY_B))
    missing = prompts_file(tmp_path / "missing.jsonl", [{"prompt": "ok"}, {"seconds": 4}])
    done = run_cli("--file", str(missing), "--out-dir", str(out), "--api", stack.base, "--api-key", KEY_B)
    assert done.returncode == 2
    assert done.stderr.strip() == "h3batch submit: missing.jsonl line 2: prompt: missing", done.stderr

    refused = tmp_path / "refused.jsonl"
    refused.write_text(json.dumps({"prompt": "ok", **CANVAS}) + "\n\n" +
                       json.dumps({"prompt": "too wide", **CANVAS, "width": 100}) + "\n" +
                       json.dumps({"prompt": "too long", **CANVAS, "seconds": 60}) + "\n")
    done = run_cli("--file", str(refused), "--out-dir", str(out), "--api", stack.base, "--api-key", KEY_B)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 3, done.stderr
    assert lines[0].startswith("h3batch submit: refused.jsonl line 3: width") and \
        lines[1].startswith("h3batch submit: refused.jsonl line 4: seconds"), done.stderr
    assert lines[2].startswith("h3batch submit: the API refused the batch: invalid_batch: 2 of 3 lines refused")
    assert not (out / client_batch.STATE_NAME).exists()
    assert job_count(stack.base, KEY_B) == jobs_before and len(batch_ids(stack.base, KEY_B)) == batches_before
    shutil.rmtree(out, ignore_errors=True)
