"""Webhooks: a signed POST to a job's `webhook_url` when it reaches `completed`, `failed` or `cancelled`.

Flow: `core/jobs.py::transition` adds `<job id>:<event>` to the zset `h3b:webhooks:due` (score = due time) in the
same MULTI/EXEC that finishes a job with a `webhook_url`, so a delivery is never lost between the state change and
the send; a job whose `webhook_events` leaves that event out gets no entry, so nothing here ever sends it. A
`WebhookDispatcher` thread (started in every GPU worker process) claims due entries with a Lua compare-and-bump (the
score moves forward by a claim lease, so a dispatcher that dies mid-send only delays the delivery), POSTs, then
removes the entry on a 2xx or re-schedules it with exponential backoff. Each attempt is appended to the job record's
`webhook_deliveries` list. This due set is ours rather than a Celery task with retries because the entry must be
written inside the transition's own MULTI/EXEC: a task is sent after the commit, and a process that dies between the
two would lose the delivery.

Signing is Standard Webhooks (what OpenAI's SDK `webhooks.verify_signature` checks), done by its reference package
`standardwebhooks`: headers `webhook-id` (the same on every retry of one event), `webhook-timestamp` (Unix s) and
`webhook-signature: v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>.<body>")>`, where the key is the base64 part of a
`whsec_…` secret (or the secret's UTF-8 bytes without that prefix), from H3BATCH_WEBHOOK_SECRET.

URL rules live in core/webhook_urls.py; the POST connects to the address that check passed (urllib3 pool
pinned to that IP, TLS still verified against the host name) and follows no redirects. This is written by hand with
urllib3 rather than `requests` because requests resolves the name again at connect time and cannot pin the checked
address.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

import redis
from standardwebhooks import Webhook

from h3batch.core import batches, keys
from h3batch.core.jobs import load_job
from h3batch.core.webhook_urls import Target, WebhookRefused, WebhookSettings, check_url

log = logging.getLogger("h3batch.webhooks")

DUE_KEY = keys.WEBHOOKS_DUE

_PUBLIC_FIELDS = ("id", "status", "stage", "progress", "step", "total_steps", "prompt", "seconds", "width", "height",
                  "seed", "release", "release_id", "created_at", "started_at", "finished_at", "expires_at", "frames",
                  "size_bytes", "attempt", "worker", "timings", "cancel_reason", "cancelled_at_stage", "error",
                  "metadata")
"""Record fields a webhook body may carry (never owner, sha256, traceback or the delivery log)."""


# --- signing ---

def signer(secret: str) -> Webhook:
    """The Standard Webhooks signer of a secret: a `whsec_` secret as the package reads it (the base64 key after the
    prefix), any other secret as its UTF-8 bytes (the package would base64-decode it)."""
    return Webhook(secret if secret.startswith("whsec_") else secret.encode())


def sign(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header value: `v1,<base64 HMAC-SHA256 of id.timestamp.body>`."""
    return signer(secret).sign(message_id, datetime.fromtimestamp(timestamp, tz=timezone.utc), body)


def message_id(job_id: str, event: str) -> str:
    """Stable per (job, event): the receiver deduplicates retries on it."""
    return f"msg_{job_id}_{event}"


def event_type(record: Mapping[str, Any], event: str) -> str:
    """`video.completed` / `video.failed` for jobs created through /v1/videos (OpenAI's event names; cancelled
    reads as failed there), `job.<event>` otherwise; a batch's event (`batch.completed`) as it is."""
    if record.get("object") == "batch":
        return event
    if record.get("api") == "openai":
        return "video.completed" if event == "completed" else "video.failed"
    return f"job.{event}"


def payload(record: Mapping[str, Any], event: str, now: float) -> dict[str, Any]:
    fields = batches.WEBHOOK_FIELDS if record.get("object") == "batch" else _PUBLIC_FIELDS
    data = {name: record.get(name) for name in fields if name in record}
    return {"id": message_id(record["id"], event), "type": event_type(record, event), "timestamp": int(now),
            "data": data}


# --- the delivery log ---

# Claim a due member: bump its score by the claim lease only if it is still due, so two dispatchers never both win.
_CLAIM = ("local s = redis.call('zscore', KEYS[1], ARGV[1]) "
          "if s and tonumber(s) <= tonumber(ARGV[2]) then redis.call('zadd', KEYS[1], ARGV[3], ARGV[1]) return 1 end "
          "return 0")


def deliveries(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    raw = record.get("webhook_deliveries")
    if not raw:
        return []
    return json.loads(raw) if isinstance(raw, str) else list(raw)


def _subject(r: redis.Redis, subject_id: str) -> tuple[dict[str, Any] | None, str]:
    """(record, Redis hash) of what a due entry names: a batch (`batch_…`, core/batches.webhook_view) or a job."""
    if subject_id.startswith("batch_"):
        return batches.webhook_view(r, subject_id), keys.batch(subject_id)
    return load_job(r, subject_id), keys.job(subject_id)


def _append_delivery(r: redis.Redis, key: str, entry: dict[str, Any]) -> None:
    with r.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(key)
                if not pipe.exists(key):
                    pipe.unwatch()
                    return
                log_list = deliveries({"webhook_deliveries": pipe.hget(key, "webhook_deliveries")})
                log_list.append(entry)
                pipe.multi()
                pipe.hset(key, "webhook_deliveries", json.dumps(log_list[-50:]))
                pipe.execute()
                return
            except redis.WatchError:
                continue


# --- delivery ---

def _post(target: Target, headers: dict[str, str], body: bytes, timeout_s: float) -> int:
    """POST to the first vetted address; returns the HTTP status. Raises urllib3/OS errors on transport failure."""
    import certifi  # noqa: PLC0415  (delivery runs in workers; the API only vets URLs and needs neither)
    import urllib3  # noqa: PLC0415

    address = target.addresses[0]
    timeout = urllib3.Timeout(connect=min(timeout_s, 5.0), read=timeout_s)
    if target.scheme == "https":
        pool = urllib3.HTTPSConnectionPool(address, target.port, server_hostname=target.host,
                                           assert_hostname=target.host, cert_reqs="CERT_REQUIRED",
                                           ca_certs=certifi.where(), timeout=timeout, retries=False, maxsize=1)
    else:
        pool = urllib3.HTTPConnectionPool(address, target.port, timeout=timeout, retries=False, maxsize=1)
    host_header = target.host if target.port in (80, 443) else f"{target.host}:{target.port}"
    try:
        response = pool.urlopen("POST", target.path, body=body, headers={**headers, "Host": host_header},
                                redirect=False, retries=False, preload_content=True)
        return response.status
    finally:
        pool.close()


def deliver_one(r: redis.Redis, settings: WebhookSettings, job_id: str, event: str,
                now: float | None = None) -> bool | None:
    """Make one attempt for (job, event); returns True delivered, False failed (maybe re-scheduled), None nothing
    to send (job gone, no URL, no secret)."""
    member = f"{job_id}:{event}"
    record, record_key = _subject(r, job_id)
    if record is None or not record.get("webhook_url") or not settings.enabled:
        r.zrem(DUE_KEY, member)
        if record is not None and record.get("webhook_url"):
            log.warning("webhook dropped: H3BATCH_WEBHOOK_SECRET is not set on this worker", extra={"job_id": job_id})
        return None
    attempt = 1 + sum(1 for d in deliveries(record) if d.get("event") == event)
    now = time.time() if now is None else now
    body = json.dumps(payload(record, event, now), separators=(",", ":"), default=str).encode()
    msg_id, stamp = message_id(job_id, event), int(now)
    headers = {"Content-Type": "application/json", "User-Agent": "h3batch-webhooks/1",
               "webhook-id": msg_id, "webhook-timestamp": str(stamp),
               "webhook-signature": sign(settings.secret or "", msg_id, stamp, body)}
    entry: dict[str, Any] = {"event": event, "attempt": attempt, "at": round(now, 3)}
    started = time.perf_counter()
    try:
        target = check_url(record["webhook_url"], settings)  # again, on today's DNS answer
        status = _post(target, headers, body, settings.timeout_s)
        entry["status_code"] = status
        ok = 200 <= status < 300
        if not ok:
            entry["error"] = f"HTTP {status}"
    except WebhookRefused as exc:
        entry["error"], ok = str(exc), False
        attempt = settings.max_attempts  # a refused target will not become acceptable by retrying
    except Exception as exc:  # urllib3 HTTPError, OSError, ssl errors: the receiver or the network failed
        entry["error"], ok = f"{type(exc).__name__}: {str(exc)[:200]}", False
    entry["duration_ms"] = round((time.perf_counter() - started) * 1000, 1)
    if not ok and attempt < settings.max_attempts:
        entry["next_attempt_at"] = round(now + settings.backoff_s(attempt), 3)
    _append_delivery(r, record_key, entry)
    if ok or attempt >= settings.max_attempts:
        r.zrem(DUE_KEY, member)
    else:
        r.zadd(DUE_KEY, {member: entry["next_attempt_at"]})
    log.info("webhook attempt event=%s attempt=%d ok=%s status=%s", event, entry["attempt"], ok,
             entry.get("status_code"), extra={"job_id": job_id})
    return ok


def deliver_due(r: redis.Redis, settings: WebhookSettings, *, now: float | None = None, batch: int = 20) -> int:
    """Attempt every delivery due by `now` that this process can claim; returns how many were attempted."""
    now = time.time() if now is None else now
    claim_until = now + settings.timeout_s + 30  # a dispatcher that dies mid-send frees the entry after this
    attempted = 0
    for member in r.zrangebyscore(DUE_KEY, "-inf", now, start=0, num=batch):
        if not r.eval(_CLAIM, 1, DUE_KEY, member, now, claim_until):
            continue  # another dispatcher took it
        job_id, _, event = member.rpartition(":")
        deliver_one(r, settings, job_id, event)
        attempted += 1
    return attempted


OUTAGE_LOG_EVERY_S = 30.0
"""While Redis stays unreachable the dispatcher logs one line per this many seconds (it polls every 0.5 s)."""


class WebhookDispatcher(threading.Thread):
    """Daemon thread: every `poll_s`, attempt the deliveries that are due."""

    def __init__(self, r: redis.Redis, settings: WebhookSettings, outage_log_every_s: float = OUTAGE_LOG_EVERY_S):
        super().__init__(name="h3batch-webhooks", daemon=True)
        self.r, self.settings = r, settings
        self.outage_log_every_s = outage_log_every_s
        self._stop_event = threading.Event()

    def run(self) -> None:
        outage_since: float | None = None
        failed_polls = 0
        last_logged = float("-inf")
        while not self._stop_event.wait(self.settings.poll_s):
            try:
                deliver_due(self.r, self.settings)
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                # An outage fails every poll the same way: one line now and one per outage_log_every_s, no traceback.
                now = time.monotonic()
                outage_since = now if outage_since is None else outage_since
                failed_polls += 1
                if now - last_logged >= self.outage_log_every_s:
                    log.warning("webhook dispatch paused: redis unavailable error=%s for_s=%.0f failed_polls=%d",
                                type(exc).__name__, now - outage_since, failed_polls)
                    last_logged = now
                continue
            except Exception:  # a bad record must not end deliveries; the next poll retries
                log.exception("webhook dispatch failed")
                continue
            if outage_since is not None:
                log.warning("webhook dispatch resumed: redis back after %.0f s (%d failed polls)",
                            time.monotonic() - outage_since, failed_polls)
                outage_since, failed_polls, last_logged = None, 0, float("-inf")

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=self.settings.timeout_s + 5)


def start_dispatcher(r: redis.Redis, settings: WebhookSettings | None = None) -> WebhookDispatcher:
    dispatcher = WebhookDispatcher(r, settings or WebhookSettings.from_env())
    dispatcher.start()
    return dispatcher
