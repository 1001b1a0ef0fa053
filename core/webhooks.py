"""Webhooks: a signed POST to a job's `webhook_url` when it reaches `completed`, `failed` or `cancelled`.

Flow: `core/jobs.py::transition` adds `<job id>:<event>` to the zset `h3b:webhooks:due` (score = due time) in the
same MULTI/EXEC that finishes a job with a `webhook_url`, so a delivery is never lost between the state change and
the send. A `WebhookDispatcher` thread (started in every GPU worker process) claims due entries with a Lua
compare-and-bump (the score moves forward by a claim lease, so a dispatcher that dies mid-send only delays the
delivery), POSTs, then removes the entry on a 2xx or re-schedules it with exponential backoff. Each attempt is
appended to the job record's `webhook_deliveries` list.

Signing follows Standard Webhooks (what OpenAI's SDK `webhooks.verify_signature` checks): headers `webhook-id`
(the same on every retry of one event), `webhook-timestamp` (Unix s) and `webhook-signature: v1,<base64
HMAC-SHA256(key, "<id>.<timestamp>.<body>")>`, where the key is the base64 part of a `whsec_…` secret (or the
secret's UTF-8 bytes without that prefix), from H3BATCH_WEBHOOK_SECRET.

SSRF guard: only http(s) URLs without credentials; metadata host names, link-local (169.254.0.0/16, fe80::/10),
unspecified, multicast and reserved addresses are always refused; loopback and private ranges only when
H3BATCH_WEBHOOK_ALLOW_LOOPBACK / H3BATCH_WEBHOOK_ALLOW_PRIVATE say so. The check runs at submit time and again at
each delivery on the freshly resolved addresses, and the POST connects to the vetted IP itself (urllib3 pool pinned
to that address, TLS still verified against the host name), so a DNS answer that changes between the check and the
connect (rebinding) cannot redirect the request. Redirects are not followed. This is written by hand with urllib3
rather than `requests` because requests resolves the name again at connect time and cannot pin the checked address.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import redis

from h3batch.core import keys

log = logging.getLogger("h3batch.webhooks")

DUE_KEY = f"{keys.PREFIX}:webhooks:due"
"""zset of pending deliveries: member `<job id>:<event>`, score = Unix time the next attempt is due."""

EVENTS = ("completed", "failed", "cancelled")
"""Job events that trigger a delivery."""

METADATA_HOSTS = frozenset({
    "metadata", "metadata.google.internal", "metadata.goog", "instance-data", "instance-data.ec2.internal",
    "metadata.azure.com", "metadata.platformequinix.com", "metadata.tencentyun.com", "100.100.100.200",
})
"""Cloud instance-metadata host names, refused whatever they resolve to."""

MAX_URL_CHARS = 2048
_PUBLIC_FIELDS = ("id", "status", "stage", "progress", "step", "total_steps", "prompt", "seconds", "width", "height",
                  "seed", "release", "release_id", "created_at", "started_at", "finished_at", "expires_at", "frames",
                  "size_bytes", "attempt", "worker", "timings", "cancel_reason", "cancelled_at_stage", "error",
                  "metadata")
"""Record fields a webhook body may carry (never owner, sha256, traceback or the delivery log)."""


def _flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class WebhookSettings:
    """Webhook configuration from H3BATCH_WEBHOOK_* env vars (read by the API and by every worker)."""

    secret: str | None = None
    allow_loopback: bool = False
    allow_private: bool = False
    max_attempts: int = 9
    retry_base_s: float = 5.0
    retry_cap_s: float = 36_000.0
    timeout_s: float = 10.0
    poll_s: float = 0.5

    @property
    def enabled(self) -> bool:
        return bool(self.secret)

    def backoff_s(self, attempt: int) -> float:
        """Delay before attempt `attempt + 1`: base × 4^(attempt-1), capped. Defaults give 5 s, 20 s, 80 s, …, 10 h;
        9 attempts span about 27 h, like the Standard Webhooks schedule."""
        return min(self.retry_cap_s, self.retry_base_s * 4 ** (attempt - 1))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "WebhookSettings":
        env = os.environ if env is None else env

        def number(name: str, default: float, kind=float):
            raw = env.get(name, "").strip()
            if not raw:
                return default
            try:
                value = kind(raw)
            except ValueError:
                raise ValueError(f"{name}: expected a positive number, found {raw!r}") from None
            if value <= 0:
                raise ValueError(f"{name}: expected a positive number, found {raw!r}")
            return value

        return cls(secret=env.get("H3BATCH_WEBHOOK_SECRET", "").strip() or None,
                   allow_loopback=_flag(env, "H3BATCH_WEBHOOK_ALLOW_LOOPBACK"),
                   allow_private=_flag(env, "H3BATCH_WEBHOOK_ALLOW_PRIVATE"),
                   max_attempts=number("H3BATCH_WEBHOOK_MAX_ATTEMPTS", cls.max_attempts, int),
                   retry_base_s=number("H3BATCH_WEBHOOK_RETRY_BASE_S", cls.retry_base_s),
                   timeout_s=number("H3BATCH_WEBHOOK_TIMEOUT_S", cls.timeout_s))


class WebhookRefused(ValueError):
    """A webhook URL the service will not call; the message says what was expected and what arrived."""


# --- URL and address checks ---

def _check_address(address: str, host: str, settings: WebhookSettings) -> None:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_link_local or ip.is_unspecified or ip.is_multicast or ip.is_reserved:
        raise WebhookRefused(f"webhook_url: {host!r} resolves to {ip}, a link-local/unspecified/multicast/reserved "
                             f"address; expected a public http(s) endpoint")
    if ip.is_loopback:
        if not settings.allow_loopback:
            raise WebhookRefused(f"webhook_url: {host!r} resolves to loopback {ip}; loopback targets are refused "
                                 f"unless H3BATCH_WEBHOOK_ALLOW_LOOPBACK=1")
        return
    if not ip.is_global and not settings.allow_private:  # RFC 1918, CGNAT 100.64/10, ULA fc00::/7, ...
        raise WebhookRefused(f"webhook_url: {host!r} resolves to non-public address {ip}; private targets are "
                             f"refused unless H3BATCH_WEBHOOK_ALLOW_PRIVATE=1")


@dataclass(frozen=True)
class Target:
    """A vetted webhook URL: where to connect (a checked IP) and what to ask for."""

    scheme: str
    host: str
    port: int
    path: str
    addresses: tuple[str, ...]


def check_url(url: Any, settings: WebhookSettings) -> Target:
    """Parse, resolve and vet `url`; raises WebhookRefused naming the problem. Resolves DNS (both at submit and at
    delivery time)."""
    if not isinstance(url, str) or not url:
        raise WebhookRefused(f"webhook_url: expected an http(s) URL string, found {url!r}")
    if len(url) > MAX_URL_CHARS:
        raise WebhookRefused(f"webhook_url: expected at most {MAX_URL_CHARS} characters, found {len(url)}")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise WebhookRefused(f"webhook_url: not a valid URL ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise WebhookRefused(f"webhook_url: expected an http:// or https:// URL, found scheme {parts.scheme!r}")
    host = (parts.hostname or "").rstrip(".").lower()
    if not host:
        raise WebhookRefused("webhook_url: expected a host name, found none")
    if parts.username is not None or parts.password is not None:
        raise WebhookRefused("webhook_url: credentials in the URL are not accepted; authenticate with the signature")
    if host in METADATA_HOSTS:
        raise WebhookRefused(f"webhook_url: {host!r} is a cloud metadata host; refused")
    port = port or (443 if scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise WebhookRefused(f"webhook_url: host {host!r} does not resolve ({exc})") from None
    addresses = tuple(dict.fromkeys(info[4][0] for info in infos))
    for address in addresses:  # every answer must pass: a mixed answer is how rebinding attacks start
        _check_address(address, host, settings)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return Target(scheme, host, port, path, addresses)


# --- signing ---

def secret_key(secret: str) -> bytes:
    """HMAC key of a secret: base64-decoded after a `whsec_` prefix, else the secret's UTF-8 bytes."""
    if secret.startswith("whsec_"):
        return base64.b64decode(secret[len("whsec_"):])
    return secret.encode()


def sign(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header value: `v1,<base64 HMAC-SHA256 of id.timestamp.body>`."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(secret_key(secret), signed, hashlib.sha256).digest()).decode()


def message_id(job_id: str, event: str) -> str:
    """Stable per (job, event): the receiver deduplicates retries on it."""
    return f"msg_{job_id}_{event}"


def event_type(record: Mapping[str, Any], event: str) -> str:
    """`video.completed` / `video.failed` for jobs created through /v1/videos (OpenAI's event names; cancelled
    reads as failed there), `job.<event>` otherwise."""
    if record.get("api") == "openai":
        return "video.completed" if event == "completed" else "video.failed"
    return f"job.{event}"


def payload(record: Mapping[str, Any], event: str, now: float) -> dict[str, Any]:
    data = {name: record.get(name) for name in _PUBLIC_FIELDS if name in record}
    return {"id": message_id(record["id"], event), "type": event_type(record, event), "timestamp": int(now),
            "data": data}


# --- scheduling (called inside transition's MULTI) and the delivery log ---

def schedule(pipe: redis.client.Pipeline, job_id: str, event: str, due: float) -> None:
    """Queue the first delivery of `event` for `job_id` on `pipe` (inside the caller's transaction)."""
    pipe.zadd(DUE_KEY, {f"{job_id}:{event}": due})


# Claim a due member: bump its score by the claim lease only if it is still due, so two dispatchers never both win.
_CLAIM = ("local s = redis.call('zscore', KEYS[1], ARGV[1]) "
          "if s and tonumber(s) <= tonumber(ARGV[2]) then redis.call('zadd', KEYS[1], ARGV[3], ARGV[1]) return 1 end "
          "return 0")


def deliveries(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    raw = record.get("webhook_deliveries")
    if not raw:
        return []
    return json.loads(raw) if isinstance(raw, str) else list(raw)


def _append_delivery(r: redis.Redis, job_id: str, entry: dict[str, Any]) -> None:
    key = keys.job(job_id)
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
    from h3batch.core.jobs import load_job  # noqa: PLC0415  (jobs imports this module)

    member = f"{job_id}:{event}"
    record = load_job(r, job_id)
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
    _append_delivery(r, job_id, entry)
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


class WebhookDispatcher(threading.Thread):
    """Daemon thread: every `poll_s`, attempt the deliveries that are due."""

    def __init__(self, r: redis.Redis, settings: WebhookSettings):
        super().__init__(name="h3batch-webhooks", daemon=True)
        self.r, self.settings = r, settings
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.settings.poll_s):
            try:
                deliver_due(self.r, self.settings)
            except Exception:  # a Redis blip or a bad record must not end deliveries; the next poll retries
                log.exception("webhook dispatch failed")

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=self.settings.timeout_s + 5)


def start_dispatcher(r: redis.Redis, settings: WebhookSettings | None = None) -> WebhookDispatcher:
    dispatcher = WebhookDispatcher(r, settings or WebhookSettings.from_env())
    dispatcher.start()
    return dispatcher
