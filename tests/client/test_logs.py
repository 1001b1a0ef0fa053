"""GET /jobs/{id}/logs: the worker's own lines about one job, through the client, to its owner only, redacted, and
gone with the job."""
from __future__ import annotations

import pytest

from h3batch.client import Client, JobNotFound
from h3batch.core import keys
from h3batch.worker.job_logs import redact
from tests.api.conftest import KEY_A, KEY_B

CANVAS = {"seconds": 4, "width": 256, "height": 128}


def test_a_finished_job_has_its_worker_lines_for_its_owner_only(stack, rc):
    """A completed job's logs hold the worker's start and completion lines (messages, levels, no traceback); another
    key gets 404 for them; deleting the job deletes them."""
    with Client(stack.base, KEY_A) as client:
        job = client.wait(client.create("a log of its own", **CANVAS))
        lines = client.logs(job)
        with Client(stack.base, KEY_B) as other, pytest.raises(JobNotFound):
            other.logs(job)
        messages = [line["message"] for line in lines]
        assert any(m.startswith("render started") for m in messages), messages
        assert any(m.startswith("render completed") for m in messages), messages
        assert {line["level"] for line in lines} <= {"INFO", "WARNING", "ERROR"}
        assert all(line["logger"].startswith("h3batch") and "Traceback" not in line["message"] for line in lines)
        assert lines == sorted(lines, key=lambda line: line["ts"])
        assert rc.exists(keys.logs(job.id)) and 0 < rc.ttl(keys.logs(job.id))  # expires with the record
        client.delete(job)
    assert not rc.exists(keys.logs(job.id))


def test_secrets_in_a_message_are_redacted():
    """Bearer tokens, webhook secrets and URL query strings never reach a job's log lines."""
    text = redact("POST https://hooks.example.com/h?token=abc123 failed; Authorization: Bearer sk-live-1 "
                  "secret whsec_c2VjcmV0 and http://127.0.0.1:9/x stays")
    assert "abc123" not in text and "sk-live-1" not in text and "c2VjcmV0" not in text
    assert "https://hooks.example.com/h?[redacted]" in text and "http://127.0.0.1:9/x stays" in text
