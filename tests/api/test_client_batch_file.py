"""The batch CLI's own checks, before anything is sent: the JSONL file (the first bad line named, exit 2 with one
line), the resume state and its hash, and the archive unzip guard. No server: these are the parts that decide what
the CLI sends or writes; the live runs are in test_client_batch.py."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import zipfile

import pytest

from h3batch.client import cli_batch as client_batch
from h3batch.client.cli_common import CliError
from tests.service_stack import REPO

CLI = [sys.executable, "-P", "-m", "h3batch.cli", "submit"]


def write(path, *lines: str):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_read_requests_keeps_file_line_numbers_and_fills_defaults(tmp_path):
    """Blank lines are skipped but still counted; flags fill fields a line leaves out, never overwrite them."""
    path = write(tmp_path / "p.jsonl", '{"prompt": "a", "custom_id": "one"}', "", '  ',
                 '{"prompt": "b", "seconds": 5}')
    requests_, numbers = client_batch.read_requests(path, {"seconds": 4.0, "width": 256})
    assert numbers == [1, 4]
    assert requests_ == [{"prompt": "a", "custom_id": "one", "seconds": 4.0, "width": 256},
                         {"prompt": "b", "seconds": 5, "width": 256}]


@pytest.mark.parametrize("lines, needle", [
    (['{"prompt": "ok"}', '{"prompt": "x",}'], "p.jsonl line 2: not a JSON line"),
    (['["prompt"]'], "p.jsonl line 1: expected a JSON object"),
    (['{"prompt": "ok"}', '{"seconds": 4}'], "p.jsonl line 2: prompt: missing"),
    (['{"prompt": "   "}'], "p.jsonl line 1: prompt: expected a non-empty text"),
    (['{"prompt": "a", "custom_id": "x"}', '{"prompt": "b", "custom_id": "x"}'],
     "p.jsonl line 2: custom_id: 'x' is already used on line 1"),
    (['{"prompt": "a", "custom_id": "../etc/passwd"}'], "p.jsonl line 1: custom_id: must be usable as a file name"),
    (['{"prompt": "a", "custom_id": 7}'], "p.jsonl line 1: custom_id: expected a non-empty text"),
    (["", "  "], "holds no job requests"),
])
def test_bad_lines_are_named(tmp_path, lines, needle):
    path = write(tmp_path / "p.jsonl", *lines)
    with pytest.raises(CliError) as caught:
        client_batch.read_requests(path)
    assert needle in str(caught.value)


def test_not_utf8_is_named(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"prompt": "a"}\n{"prompt": "\xff"}\n')
    with pytest.raises(CliError, match="p.jsonl line 2: not UTF-8"):
        client_batch.read_requests(path)


def test_bad_file_exits_2_with_one_line_before_any_request(tmp_path):
    """The API address is unreachable on purpose: the file check must fail first, so the message is the line."""
    path = write(tmp_path / "p.jsonl", '{"prompt": "a"}', '{"prompt": "b"', '{"prompt": "c"}')
    done = subprocess.run(CLI + ["--file", str(path), "--out-dir", str(tmp_path / "out"),
                                 "--api", "http://127.0.0.1:9"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("h3batch submit: p.jsonl line 2: not a JSON line"), done.stderr
    assert not (tmp_path / "out" / client_batch.STATE_NAME).exists()


@pytest.mark.parametrize("args, needle", [
    (["x", "--file", "p.jsonl", "--out-dir", "o"], "either PROMPT or --file"),
    (["--file", "p.jsonl"], "--file needs --out-dir"),
    (["--file", "p.jsonl", "--out-dir", "o", "--out", "x.mp4"], "--out and --wait are for one prompt"),
    (["x", "--out-dir", "o"], "--out-dir needs --file"),
    (["--file", "p.jsonl", "--out-dir", "o", "--metadata", "[1]"], "--metadata: expected a JSON object"),
    (["--file", "p.jsonl", "--out-dir", "o", "--on-invalid", "drop"], "--on-invalid"),
    ([], "give a PROMPT"),
])
def test_argument_mistakes_exit_2_with_one_line(tmp_path, args, needle):
    write(tmp_path / "p.jsonl", '{"prompt": "a"}')
    done = subprocess.run(CLI + args + ["--api", "http://127.0.0.1:9"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and lines[0].startswith("h3batch submit: "), done.stderr


def test_hash_and_idempotency_key_follow_the_body_and_the_out_dir(tmp_path):
    body = client_batch.request_body([{"prompt": "a"}], None, "reject")
    same = client_batch.request_body([{"prompt": "a"}], None, "reject")
    other = client_batch.request_body([{"prompt": "a", "seconds": 5}], None, "reject")
    sha = client_batch.body_sha256(body)
    assert sha == client_batch.body_sha256(same) != client_batch.body_sha256(other)
    key = client_batch.idempotency_key(sha, tmp_path / "a")
    assert key == client_batch.idempotency_key(sha, tmp_path / "a" / ".." / "a")
    assert key != client_batch.idempotency_key(sha, tmp_path / "b")
    assert len(key) <= 255


def test_state_round_trip_and_a_corrupt_state_is_one_line(tmp_path):
    state = {"version": client_batch.STATE_VERSION, "api": "http://127.0.0.1:1", "batch_id": "batch_x",
             "request_sha256": "ab", "idempotency_key": "k", "files": {"a.mp4": 3}}
    client_batch.save_state(tmp_path, state)
    assert client_batch.load_state(tmp_path) == state
    (tmp_path / "a.mp4").write_bytes(b"abc")
    assert client_batch.have_file(tmp_path, state, "a.mp4")
    (tmp_path / "a.mp4").write_bytes(b"ab")  # truncated: fetched again
    assert not client_batch.have_file(tmp_path, state, "a.mp4")
    (tmp_path / client_batch.STATE_NAME).write_text("{half")
    with pytest.raises(CliError, match="not a readable h3batch state file"):
        client_batch.load_state(tmp_path)


def test_extract_skips_present_files_and_refuses_traversal(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("one.mp4", b"1" * 10)
        zf.writestr("two.mp4", b"2" * 20)
        zf.writestr("manifest.jsonl", json.dumps({"index": 0}) + "\n")
    state = {"version": 1, "batch_id": "batch_x", "files": {"one.mp4": 10}}
    (out / "one.mp4").write_bytes(b"X" * 10)  # same size as recorded: left alone
    assert client_batch.extract(archive, out, state) == ["one.mp4", "two.mp4", "manifest.jsonl"]
    assert (out / "one.mp4").read_bytes() == b"X" * 10 and (out / "two.mp4").read_bytes() == b"2" * 20
    assert state["files"]["two.mp4"] == 20

    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil, "w") as zf:
        zf.writestr("../escape.mp4", b"x")
    with pytest.raises(CliError, match="unsafe member name"):
        client_batch.extract(evil, out, state)
    assert not (tmp_path / "escape.mp4").exists()


def test_failure_lines_and_server_line_numbers(tmp_path):
    results = [{"index": 0, "custom_id": "a", "status": "completed"},
               {"index": 1, "custom_id": None, "status": "failed",
                "error": {"code": "render_failed", "message": "boom"}},
               {"index": 2, "custom_id": "c", "status": "cancelled", "error": None}]
    assert client_batch.failure_lines(results) == ["item 1: failed (render_failed: boom)", "item 2 [c]: cancelled"]
    # The server counts the requests it got; the file had a blank line 2.
    assert client_batch._file_line("line 2: seconds: too long", tmp_path / "p.jsonl", [1, 3]) == \
        "p.jsonl line 3: seconds: too long"
    # Named as the server's archive names its members (api/archive_names.py): custom_id first, else the index padded
    # to 4 digits; a name already taken gets `~<index>`.
    assert client_batch.item_names([{"index": 0, "custom_id": "rain"}, {"index": 1, "custom_id": None},
                                    {"index": 2, "custom_id": "0001"}]) == \
        {0: "rain.mp4", 1: "0001~1.mp4", 2: "0001.mp4"}


def test_refused_line_text_names_the_field_once():
    from h3batch.client.cli_common import detail_text

    assert detail_text({"line": 3, "field": "width", "message": "width: expected a multiple of 32"}) == \
        "width: expected a multiple of 32"
    assert detail_text({"line": 3, "field": "seconds", "message": "at most 15"}) == "seconds: at most 15"
    assert detail_text({"line": 3, "field": None, "message": "expected a JSON object"}) == \
        "body: expected a JSON object"


def test_sigterm_escapes_a_librarys_except_exception_as_ctrl_c_does():
    """The CLI's SIGTERM handler raises Interrupted wherever the main thread is. tqdm starts its monitor thread inside
    `except Exception` (its warning, then on as if nothing happened): a SIGTERM landing there must still stop the
    run, as Ctrl-C's KeyboardInterrupt would. A loaded `make test` saw the CLI swallow it and keep following."""
    previous = signal.signal(signal.SIGTERM, client_batch._on_sigterm)
    swallowed = []
    try:
        with pytest.raises(client_batch.Interrupted):
            try:
                signal.raise_signal(signal.SIGTERM)
            except Exception as exc:  # noqa: BLE001  (the library's guard)
                swallowed.append(exc)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert swallowed == []
