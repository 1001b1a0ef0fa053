"""Two rules of what a request body is, against the live stack (gunicorn API, Redis, the real worker):

- one JSONL line rule for the server (a POST /batches upload) and the client (`h3batch submit --file`, the real CLI
  process): lines end at `\\n` (with an optional `\\r`), so a prompt holding U+2028, U+2029 or U+0085 stays one
  line, and both sides count the same lines and name the same line numbers (core/jsonl.py);
- a repeated form part or field (`file`, `on_invalid`, `metadata` on /batches; any field on /v1/videos) is 400
  naming it, and nothing is created.
"""
from __future__ import annotations

import json
import subprocess
import sys

import requests

from h3batch.client import cli_batch as client_batch
from tests.api.conftest import KEY_A, auth, key_id
from tests.service_stack import REPO

CLI = [sys.executable, "-P", "-m", "h3batch.cli", "submit"]
CANVAS = {"width": 128, "height": 32, "seconds": 4}
PROMPTS = ["a bell\u2028then silence", "rain\u0085on a roof", "surf\u2029on a reef"]
"""Prompts holding line breaks other than \\n: valid JSON (raw, unescaped) and accepted by POST /jobs."""


def _file(tmp_path, lines: list[str], name: str = "prompts.jsonl"):
    path = tmp_path / name
    path.write_bytes("".join(lines).encode())
    return path


def _raw_line(prompt: str, **extra) -> str:
    return json.dumps({"prompt": prompt, **CANVAS, **extra}, ensure_ascii=False)


def _upload(base: str, path, **fields) -> requests.Response:
    return requests.post(f"{base}/batches", files={"file": (path.name, path.read_bytes(), "application/jsonl")},
                         data=fields, headers=auth(), timeout=30)


def _cancel(base: str, batch_id: str) -> None:
    requests.post(f"{base}/batches/{batch_id}/cancel", headers=auth(), timeout=10)


def _jobs(base: str) -> set[str]:
    return {j["id"] for j in requests.get(f"{base}/jobs?limit=100", headers=auth(), timeout=10).json()["data"]}


def test_server_and_cli_cut_a_jsonl_file_into_the_same_lines(stack, tmp_path):
    """A 3-request file (CRLF endings, a blank line, prompts with U+2028/U+0085/U+2029) is 3 items with
    their prompts intact on both sides (str.splitlines cut them); with a bad 5th line, both refuse naming line 5."""
    lines = [_raw_line(PROMPTS[0]) + "\r\n", "\r\n", _raw_line(PROMPTS[1]) + "\n", _raw_line(PROMPTS[2]) + "\r\n"]
    good = _file(tmp_path, lines)
    served = _upload(stack.base, good)
    assert served.status_code == 202, served.text
    server_batch = served.json()
    _cancel(stack.base, server_batch["id"])
    assert server_batch["counts"]["total"] == 3
    out = tmp_path / "out"
    cli = subprocess.run(CLI + ["--file", str(good), "--out-dir", str(out), "--api", stack.base, "--api-key", KEY_A,
                                "--timeout", "0.01", "--no-progress"], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert "did not finish within" in cli.stderr, cli.stderr  # created, then left to the server
    cli_batch_id = json.loads((out / client_batch.STATE_NAME).read_text())["batch_id"]
    _cancel(stack.base, cli_batch_id)
    for batch_id in (server_batch["id"], cli_batch_id):
        results = [json.loads(line) for line in requests.get(f"{stack.base}/batches/{batch_id}/results",
                                                             headers=auth(), timeout=10).text.splitlines()]
        prompts = [requests.get(f"{stack.base}/jobs/{r['job_id']}", headers=auth(), timeout=10).json()["prompt"]
                   for r in results]
        assert prompts == PROMPTS, (batch_id, prompts)

    bad = _file(tmp_path, lines + [json.dumps({"seconds": 4}) + "\n"], "bad.jsonl")
    refused = _upload(stack.base, bad)
    assert refused.status_code == 422, refused.text
    assert [(d["line"], d["field"]) for d in refused.json()["error"]["details"]] == [(5, "prompt")]
    cli = subprocess.run(CLI + ["--file", str(bad), "--out-dir", str(tmp_path / "out2"), "--api", stack.base,
                                "--api-key", KEY_A], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert cli.returncode == 2 and cli.stderr.strip() == "h3batch submit: bad.jsonl line 5: prompt: missing", \
        cli.stderr


def test_a_repeated_form_part_is_400_naming_it(stack, rc):
    """`file` twice, `on_invalid` twice, `metadata` twice (and a text part named like the file part) on /batches;
    `prompt`, `seconds` or `metadata` twice on /v1/videos: 400 invalid_request naming the field; nothing queued."""
    line = (_raw_line("a gong") + "\n").encode()
    batches_index = f"h3b:owner:{key_id(KEY_A)}:batches"
    before_jobs, before_batches = _jobs(stack.base), rc.zcard(batches_index)
    batch_cases = [
        ("file", [("file", ("a.jsonl", line, "application/jsonl")), ("file", ("b.jsonl", line, "application/jsonl"))]),
        ("on_invalid", [("file", ("a.jsonl", line, "application/jsonl")), ("on_invalid", (None, "skip")),
                        ("on_invalid", (None, "reject"))]),
        ("metadata", [("file", ("a.jsonl", line, "application/jsonl")), ("metadata", (None, '{"a": "1"}')),
                      ("metadata", (None, '{"b": "2"}'))]),
        ("file", [("file", ("a.jsonl", line, "application/jsonl")), ("file", (None, "text"))]),
    ]
    for name, parts in batch_cases:
        reply = requests.post(f"{stack.base}/batches", files=parts, headers=auth(), timeout=30)
        assert reply.status_code == 400, (name, reply.status_code, reply.text)
        error = reply.json()["error"]
        assert error["code"] == "invalid_request" and error["message"].startswith(f"{name}: "), error
        assert error["retryable"] is False
    video_cases = [
        ("prompt", [("prompt", (None, "a")), ("prompt", (None, "b"))]),
        ("seconds", [("prompt", (None, "a")), ("seconds", (None, "4")), ("seconds", (None, "8"))]),
        ("metadata", [("prompt", (None, "a")), ("metadata", (None, "x")), ("metadata", (None, "y"))]),
    ]
    for name, parts in video_cases:
        reply = requests.post(f"{stack.base}/v1/videos", files=parts, headers=auth(), timeout=30)
        assert reply.status_code == 400, (name, reply.status_code, reply.text)
        assert reply.json()["error"]["message"].startswith(f"{name}: "), reply.text
    urlencoded = requests.post(f"{stack.base}/v1/videos", data=[("prompt", "a"), ("prompt", "b")], headers=auth(),
                               timeout=30)
    assert urlencoded.status_code == 400 and urlencoded.json()["error"]["message"].startswith("prompt: ")
    assert _jobs(stack.base) == before_jobs and rc.zcard(batches_index) == before_batches
