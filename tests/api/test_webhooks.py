"""Webhooks against a real receiver on 127.0.0.1: Standard Webhooks signatures (checked with the openai SDK's
verifier and with the `standardwebhooks` reference package), retry after a 500, delivery log on the job, and the SSRF
refusals at submit and at delivery time."""
from __future__ import annotations

import json
import re
import threading
import time

import pytest
import requests
import standardwebhooks
from openai import OpenAI
from werkzeug.serving import make_server

from h3batch.core import webhook_urls
from h3batch.core.jobs import JobSpec, JobStatus, create_job, load_job, transition
from h3batch.worker import webhook_delivery as webhooks
from tests.api.conftest import KEY_A, RETRY_BASE_S, WEBHOOK_SECRET, auth, key_id, wait_job
from tests.service_stack import REPO


def verify(call: dict) -> dict:
    """Check the signature with openai's Standard Webhooks verifier; return the parsed body."""
    OpenAI(api_key="unused").webhooks.verify_signature(call["body"], call["headers"], secret=WEBHOOK_SECRET)
    return json.loads(call["body"])


def test_webhook_signed_retried_after_500_then_delivered(stack, receiver):
    """A 500 from the receiver is retried with backoff; both attempts carry one webhook-id and valid signatures,
    and the job's delivery log records 500 then 200."""
    receiver.statuses = [500]
    reply = requests.post(f"{stack.base}/jobs", json={"prompt": "a bell", "webhook_url": receiver.url + "/hook?x=1"},
                          headers=auth(), timeout=60)
    assert reply.status_code == 202, reply.text
    job_id = reply.json()["id"]
    wait_job(stack.base, job_id)
    first, second = receiver.wait_calls(2)
    assert (first["answered"], second["answered"]) == (500, 200)
    assert first["path"] == "/hook?x=1"
    assert first["headers"]["webhook-id"] == second["headers"]["webhook-id"] == f"msg_{job_id}_completed"
    assert second["at"] - first["at"] >= RETRY_BASE_S * 0.9
    body = verify(second)
    verify(first)
    assert body["type"] == "job.completed" and body["data"]["id"] == job_id
    assert body["data"]["status"] == "completed" and "owner" not in body["data"]

    deadline = time.monotonic() + 10
    while True:
        log = requests.get(f"{stack.base}/jobs/{job_id}", headers=auth(), timeout=60).json()["webhook_deliveries"]
        if log and len(log) == 2:
            break
        assert time.monotonic() < deadline, log
        time.sleep(0.1)
    assert [d["status_code"] for d in log] == [500, 200] and [d["attempt"] for d in log] == [1, 2]
    assert "next_attempt_at" in log[0] and "next_attempt_at" not in log[1]
    time.sleep(RETRY_BASE_S * 5)
    assert len(receiver.calls) == 2  # delivered: no further attempts


def test_tampered_body_fails_verification(stack, receiver):
    """The signature covers the body: a changed byte no longer verifies (so receivers can trust it)."""
    reply = requests.post(f"{stack.base}/v1/videos", json={"prompt": "rain", "size": "256x128",
                                                           "webhook_url": receiver.url}, headers=auth(), timeout=60)
    assert reply.status_code == 202, reply.text
    call = receiver.wait_calls(1, timeout_s=60)[0]
    body = verify(call)
    assert body["type"] == "video.completed"  # OpenAI's event name for /v1-created jobs
    tampered = dict(call, body=call["body"].replace(b'"completed"', b'"failed"', 1))
    with pytest.raises(Exception, match="signature"):
        verify(tampered)


@pytest.mark.parametrize("secret, key", [(WEBHOOK_SECRET, WEBHOOK_SECRET),
                                         ("a plain-text secret", b"a plain-text secret")])
def test_delivery_verifies_with_the_standardwebhooks_reference(rc, receiver, secret, key):
    """The request a real receiver on 127.0.0.1 gets verifies with `standardwebhooks.Webhook(key).verify`: a
    `whsec_` secret as the receiver is given it, a plain-text one as its UTF-8 bytes; a changed body does not."""
    job = create_job(rc, JobSpec(prompt="x", seconds=4.0, width=256, height=128, seed=1, owner=key_id(KEY_A),
                                 webhook_url=receiver.url + "/hook"))
    # Due an hour ahead, so the session worker's dispatcher leaves it to this test's deliver_one.
    transition(rc, job["id"], JobStatus.CANCELLED, expect={JobStatus.QUEUED}, fields={"cancel_reason": "user"},
               now=time.time() + 3600)
    settings = webhook_urls.WebhookSettings(secret=secret, allow_loopback=True)
    assert webhooks.deliver_one(rc, settings, job["id"], "cancelled") is True
    (call,) = receiver.wait_calls(1, timeout_s=60)
    assert call["headers"]["webhook-id"] == f"msg_{job['id']}_cancelled"
    body = standardwebhooks.Webhook(key).verify(call["body"], call["headers"])
    assert body["type"] == "job.cancelled" and body["data"]["id"] == job["id"]
    assert body["timestamp"] == int(call["headers"]["webhook-timestamp"])
    tampered = call["body"].replace(b'"cancelled"', b'"completed"', 1)
    with pytest.raises(standardwebhooks.WebhookVerificationError, match="signature"):
        standardwebhooks.Webhook(key).verify(tampered, call["headers"])
    assert rc.zscore(webhooks.DUE_KEY, f"{job['id']}:cancelled") is None


def test_docs_receiver_example_verifies_a_delivery(rc, monkeypatch, capsys):
    """docs/api.md's Flask receiver, served on 127.0.0.1, accepts a real delivery (204, the event printed) and
    answers 400 to the same request with a changed body."""
    page = (REPO / "docs" / "api.md").read_text()
    code = re.search(r"```python\n(.*?)```", page[page.index("## Webhooks"):], re.DOTALL).group(1)
    monkeypatch.setenv("H3BATCH_WEBHOOK_SECRET", WEBHOOK_SECRET)
    namespace: dict = {"__name__": "docs_receiver"}
    exec(compile(code, "docs/api.md webhook receiver", "exec"), namespace)  # noqa: S102
    server = make_server("127.0.0.1", 0, namespace["app"], threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/hook"
        job = create_job(rc, JobSpec(prompt="x", seconds=4.0, width=256, height=128, seed=1, owner=key_id(KEY_A),
                                     webhook_url=url))
        transition(rc, job["id"], JobStatus.CANCELLED, expect={JobStatus.QUEUED}, fields={"cancel_reason": "user"},
                   now=time.time() + 3600)
        settings = webhook_urls.WebhookSettings(secret=WEBHOOK_SECRET, allow_loopback=True)
        assert webhooks.deliver_one(rc, settings, job["id"], "cancelled") is True
        (entry,) = load_job(rc, job["id"])["webhook_deliveries"]
        assert entry["status_code"] == 204
        assert capsys.readouterr().out.splitlines() == [f"job.cancelled {job['id']}"]

        body = json.dumps(webhooks.payload(load_job(rc, job["id"]), "cancelled", time.time())).encode()
        stamp = int(time.time())
        headers = {"webhook-id": "msg_x", "webhook-timestamp": str(stamp),
                   "webhook-signature": webhooks.sign(WEBHOOK_SECRET, "msg_x", stamp, body)}
        assert requests.post(url, data=body, headers=headers, timeout=30).status_code == 204
        forged = body.replace(b'"cancelled"', b'"completed"', 1)
        assert requests.post(url, data=forged, headers=headers, timeout=30).status_code == 400
    finally:
        server.shutdown()
        thread.join(timeout=30)


@pytest.mark.parametrize("url", [
    "http://169.254.169.254/latest/meta-data/", "http://metadata.google.internal/computeMetadata/v1/",
    "http://[fe80::1]/hook", "http://10.1.2.3/hook", "http://192.168.0.10/hook", "ftp://example.com/hook",
    "http://user:pw@127.0.0.1/hook", "not a url", "http://0.0.0.0/hook",
])
def test_submit_refuses_unsafe_webhook_urls(compat_api, url):
    """Link-local, metadata, private, unspecified, credentialed and non-http(s) targets → 422 on both create routes."""
    for path, body in (("/jobs", {"prompt": "x", "webhook_url": url}),
                       ("/v1/videos", {"prompt": "x", "size": "256x128", "webhook_url": url})):
        reply = requests.post(compat_api.base + path, json=body, headers=auth(), timeout=60)
        assert reply.status_code == 422, (path, reply.text)
        assert reply.json()["error"]["code"] == "invalid_webhook_url"


EMBEDDED_UNSAFE = [
    "http://[2002:7f00:1::1]/",  # 6to4 of 127.0.0.1
    "http://[2002:a9fe:a9fe::1]/",  # 6to4 of 169.254.169.254 (instance metadata)
    "http://[2002:c0a8:1::1]/hook",  # 6to4 of 192.168.0.1
    "http://[2001:0:4136:e378:8000:63bf:80ff:fffe]/",  # Teredo, client 127.0.0.1 (obfuscated)
    "http://[2001:0:a9fe:a9fe::1]/",  # Teredo, server 169.254.169.254
    "http://[64:ff9b::a9fe:a9fe]/",  # NAT64 of 169.254.169.254
]


@pytest.mark.parametrize("url", EMBEDDED_UNSAFE)
def test_submit_refuses_ipv4_embedded_in_6to4_teredo_nat64(compat_api, rc, url):
    """IPv6 addresses embedding loopback, link-local or private IPv4 (6to4 2002::/16, Teredo 2001::/32, NAT64) are
    422 at submission on both routes even with H3BATCH_WEBHOOK_ALLOW_LOOPBACK=1 (this API's setting), and no job is
    made. This API has no dispatcher running beside it in this test, and none of these URLs is ever contacted."""
    before = rc.zcard("h3b:jobs")
    for path, body in (("/jobs", {"prompt": "x", "webhook_url": url}),
                       ("/v1/videos", {"prompt": "x", "size": "256x128", "webhook_url": url})):
        reply = requests.post(compat_api.base + path, json=body, headers=auth(), timeout=60)
        assert reply.status_code == 422, (path, reply.text)
        error = reply.json()["error"]
        assert error["code"] == "invalid_webhook_url" and "embedding non-public" in error["message"], error
    assert rc.zcard("h3b:jobs") == before


def test_embedded_public_ipv4_is_still_judged_by_the_usual_rules():
    """The unwrapping refuses by what is embedded, not by the prefix: 6to4 of a public address passes the check
    (no connection is made: check_url only parses and resolves a literal)."""
    permissive = webhook_urls.WebhookSettings(secret=WEBHOOK_SECRET, allow_loopback=True, allow_private=True)
    assert webhook_urls.check_url("http://[2002:808:808::1]/hook", permissive).addresses == ("2002:808:808::1",)
    for url in EMBEDDED_UNSAFE:
        with pytest.raises(webhook_urls.WebhookRefused, match="embedding non-public"):
            webhook_urls.check_url(url, permissive)


def test_loopback_only_with_the_flag_and_delivery_time_recheck(rc):
    """Loopback passes only with allow_loopback; at delivery time the URL is re-resolved and a now-unsafe target is
    refused, logged, and not retried."""
    strict = webhook_urls.WebhookSettings(secret=WEBHOOK_SECRET)
    with pytest.raises(webhook_urls.WebhookRefused, match="loopback"):
        webhook_urls.check_url("http://localhost:9/hook", strict)
    assert webhook_urls.check_url("http://127.0.0.1:9/hook", webhook_urls.WebhookSettings(
        secret=WEBHOOK_SECRET, allow_loopback=True)).addresses == ("127.0.0.1",)
    # IPv6 loopback follows the same flag (::1 lies inside the reserved ::/8, which stays refused otherwise).
    with pytest.raises(webhook_urls.WebhookRefused, match="loopback"):
        webhook_urls.check_url("http://[::1]:9/hook", strict)
    assert webhook_urls.check_url("http://[::1]:9/hook", webhook_urls.WebhookSettings(
        secret=WEBHOOK_SECRET, allow_loopback=True)).addresses == ("::1",)
    with pytest.raises(webhook_urls.WebhookRefused, match="reserved"):
        webhook_urls.check_url("http://[::2]:9/hook", webhook_urls.WebhookSettings(secret=WEBHOOK_SECRET,
                                                                                   allow_loopback=True))

    # A record whose URL passed at submit under a looser policy is refused by the stricter dispatcher.
    job = create_job(rc, JobSpec(prompt="x", seconds=4.0, width=256, height=128, seed=1, owner=key_id(KEY_A),
                                 webhook_url="http://127.0.0.1:9/hook"))
    # `now` an hour ahead makes the delivery due then, so the session worker's dispatcher leaves it to this test.
    later = time.time() + 3600
    transition(rc, job["id"], JobStatus.CANCELLED, expect={JobStatus.QUEUED}, fields={"cancel_reason": "user"},
               now=later)
    member = f"{job['id']}:cancelled"
    assert rc.zscore(webhooks.DUE_KEY, member) == pytest.approx(later)  # queued in the transition's transaction
    assert webhooks.deliver_one(rc, strict, job["id"], "cancelled") is False
    log = load_job(rc, job["id"])["webhook_deliveries"]
    assert len(log) == 1 and "loopback" in log[0]["error"] and "next_attempt_at" not in log[0]
    assert rc.zscore(webhooks.DUE_KEY, member) is None


def test_server_without_secret_refuses_webhook_url(compat_redis_url, compat_artifacts):
    """With no H3BATCH_WEBHOOK_SECRET the API cannot sign, so a webhook_url is a 400 webhooks_not_configured."""
    from h3batch.api import create_app

    app = create_app({"REDIS_URL": compat_redis_url, "ARTIFACTS_DIR": str(compat_artifacts), "API_KEYS": [],
                      "WEBHOOKS": webhook_urls.WebhookSettings(secret=None)})
    reply = app.test_client().post("/jobs", json={"prompt": "x", "webhook_url": "https://example.com/h"})
    assert reply.status_code == 400 and reply.json["error"]["code"] == "webhooks_not_configured"


def test_webhook_events_filter_sends_only_the_chosen_events_and_the_default_sends_all(stack, receiver, rc):
    """Three jobs to one receiver: one asks for failed/cancelled and fails (release_mismatch), one asks for failed
    only and completes, one asks for nothing and completes. The receiver gets job.failed then job.completed, in
    order, and nothing for the second job: its completion queued no delivery and its record has no delivery log."""
    def create(path: str, **fields) -> str:
        reply = requests.post(f"{stack.base}/jobs", json={"prompt": "a gong", "webhook_url": receiver.url + path,
                                                          **fields}, headers=auth(), timeout=60)
        assert reply.status_code == 202, reply.text
        assert reply.json()["webhook_events"] == fields.get("webhook_events")
        return reply.json()["id"]

    failing = create("/failing", webhook_events=["failed", "cancelled"], release="no-such-release")
    assert wait_job(stack.base, failing)["status"] == "failed"
    unchosen = create("/unchosen", webhook_events=["failed"])
    assert wait_job(stack.base, unchosen)["status"] == "completed"
    assert rc.zscore(webhooks.DUE_KEY, f"{unchosen}:completed") is None  # written (or not) with the completion
    default = create("/default")
    assert wait_job(stack.base, default)["status"] == "completed"
    calls = receiver.wait_calls(2)
    assert [(c["path"], verify(c)["type"], verify(c)["data"]["id"]) for c in calls] == [
        ("/failing", "job.failed", failing), ("/default", "job.completed", default)]
    assert len(receiver.calls) == 2
    record = requests.get(f"{stack.base}/jobs/{unchosen}", headers=auth(), timeout=60).json()
    assert record["webhook_deliveries"] is None


@pytest.mark.parametrize("fields, message", [
    ({"webhook_url": "http://127.0.0.1:9/h", "webhook_events": ["started"]}, "found 'started'"),
    ({"webhook_url": "http://127.0.0.1:9/h", "webhook_events": ["completed", "progress"]}, "found 'progress'"),
    ({"webhook_url": "http://127.0.0.1:9/h", "webhook_events": []}, "found an empty list"),
    ({"webhook_events": ["completed"]}, "give a webhook_url too"),
])
def test_bad_webhook_events_are_422_naming_the_field_and_make_no_job(compat_api, rc, fields, message):
    """An event the service does not send, an empty list, or the filter without a webhook_url: 422
    invalid_webhook_events whose message names `webhook_events`; in a batch, the line is refused by that field."""
    before = rc.zcard("h3b:jobs")
    reply = requests.post(f"{compat_api.base}/jobs", json={"prompt": "x", **fields}, headers=auth(), timeout=60)
    assert reply.status_code == 422, reply.text
    error = reply.json()["error"]
    assert error["code"] == "invalid_webhook_events" and error["message"].startswith("webhook_events: ")
    assert message in error["message"] and error["retryable"] is False
    batch = requests.post(f"{compat_api.base}/batches", json={"requests": [{"prompt": "x", **fields}]},
                          headers=auth(), timeout=60)
    assert batch.status_code == 422, batch.text
    assert [(d["line"], d["field"]) for d in batch.json()["error"]["details"]] == [(1, "webhook_events")]
    assert rc.zcard("h3b:jobs") == before
