"""GET /metrics: the service's Prometheus metrics (text format 0.0.4, written by prometheus_client).

Every figure is read from Redis at scrape time by `ServiceCollector`, so one scrape of any API process shows the
whole service: job counters and stage histograms that workers add in `core/jobs.py::transition` (core/metrics.py),
queue depths from the broker lists, workers from their heartbeats, unfinished batches from core/batches.py's
index (created and finished ones counted in `h3b:metrics:batches`), the load runner's last finished sweep from its
store, and the HTTP counters every API process adds. Those come from
`HttpRecorder`: each gunicorn process counts its own requests in memory and adds them to Redis every
METRICS_FLUSH_S (and before it answers a scrape), so a request never waits on Redis for its metrics and a hung
Redis cannot slow /healthz. prometheus_client's multiprocess mode would aggregate one host's gunicorn processes
only; Redis aggregates every API host, the same way it does the workers.

Access: with H3BATCH_METRICS_TOKEN set, `Authorization: Bearer <token>` (401 otherwise); unset, only loopback
clients (403 otherwise). The API trusts no proxy headers anywhere (rate limits are per key, not per address), so
the client is the TCP peer, and a request carrying Forwarded / X-Forwarded-For / X-Real-IP is not loopback: a proxy
on the same host would otherwise make every outside client look local. API keys do not open /metrics (it is an
open path for api/auth.py), and it spends no rate-limit tokens.
"""
from __future__ import annotations

import atexit
import calendar
import hashlib
import hmac
import ipaddress
import logging
import os
import threading
import time
from collections import Counter
from typing import Any

import redis
from flask import Blueprint, Flask, Response, current_app, g, request
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from h3batch.api.errors import ApiError
from h3batch.api.health import live_workers
from h3batch.api.redis_client import get_redis
from h3batch.core import broker, defaults, keys, metrics
from h3batch.loadrunner import sweep_store
from h3batch.loadrunner.sweep_settings import KEY_PREFIX as SWEEP_KEY_PREFIX

log = logging.getLogger("h3batch.api")

bp = Blueprint("metrics", __name__)

_EXTENSION_KEY = "h3batch.http_metrics"
JOB_STATUSES = ("queued", "in_progress", "completed", "failed", "cancelled", "expired")
WORKER_STATES = ("STARTING", "READY", "BUSY", "STALLED", "DISK_FULL")
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_PROXY_HEADERS = ("Forwarded", "X-Forwarded-For", "X-Real-IP")


# --- HTTP request counts: per process in memory, added to Redis in the background --------------------------------

class HttpRecorder:
    """Request counts and latency buckets of this process since its last flush; `flush` adds them to Redis."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, str, str]] = Counter()
        self._buckets: Counter[tuple[str, str, str]] = Counter()  # (method, route, bound) -> observations
        self._sums: Counter[tuple[str, str]] = Counter()
        self._totals: Counter[tuple[str, str]] = Counter()
        self._client: redis.Redis | None = None
        self._pid: int | None = None
        self._failing = False

    def observe(self, client: redis.Redis, method: str, route: str, status: int, seconds: float) -> None:
        bound = metrics.bucket_for(seconds, defaults.HTTP_BUCKETS_S)
        with self._lock:
            self._counts[(method, route, str(status))] += 1
            self._buckets[(method, route, bound)] += 1
            self._sums[(method, route)] += seconds
            self._totals[(method, route)] += 1
            if self._pid != os.getpid():  # first request of this process (gunicorn forks after import)
                self._pid, self._client = os.getpid(), client
                threading.Thread(target=self._run, name="h3batch-metrics-flush", daemon=True).start()
                atexit.register(self.flush_quietly, logging.DEBUG)  # at exit Redis may be gone first (tests)

    def _take(self):
        with self._lock:
            taken = self._counts, self._buckets, self._sums, self._totals
            self._counts, self._buckets, self._sums, self._totals = Counter(), Counter(), Counter(), Counter()
        return taken

    def _give_back(self, taken) -> None:
        with self._lock:
            for mine, theirs in zip((self._counts, self._buckets, self._sums, self._totals), taken):
                mine.update(theirs)

    def flush(self, client: redis.Redis | None = None) -> None:
        """Add what this process counted to Redis; on a Redis error the counts are kept for the next flush."""
        client = client or self._client
        taken = self._take()
        counts, buckets, sums, totals = taken
        if client is None or not totals:
            self._give_back(taken)
            return
        hist = keys.metrics_histogram(metrics.HTTP_HISTOGRAM)
        try:
            # One MULTI: applied whole or not at all, so a failed flush can be re-added in full. The buffers hold one
            # entry per method, route and status, so a long Redis outage costs no growing memory.
            with client.pipeline(transaction=True) as pipe:
                for (method, route, status), n in counts.items():
                    pipe.hincrby(keys.METRICS_HTTP, metrics.SEP.join((method, route, status)), n)
                for (method, route, bound), n in buckets.items():
                    pipe.hincrby(hist, metrics.SEP.join((method, route, bound)), n)
                for (method, route), seconds in sums.items():
                    pipe.hincrbyfloat(hist, metrics.SEP.join((method, route, "sum")), seconds)
                for (method, route), n in totals.items():
                    pipe.hincrby(hist, metrics.SEP.join((method, route, "count")), n)
                pipe.execute()
        except redis.exceptions.RedisError:
            self._give_back(taken)
            raise

    def flush_quietly(self, level: int = logging.WARNING) -> None:
        """Flush; a Redis outage is logged once when it starts and once when it ends, not every second."""
        try:
            self.flush()
        except redis.exceptions.RedisError as exc:
            if not self._failing:
                log.log(level, "request metrics not flushed (kept for the next try) error=%s", type(exc).__name__)
            self._failing = True
        else:
            if self._failing:
                log.info("request metrics flushed again")
            self._failing = False

    def _run(self) -> None:
        while True:
            time.sleep(defaults.METRICS_FLUSH_S)
            self.flush_quietly()


def _route() -> str:
    """The URL rule, not the path (`/jobs/<job_id>`), so label values stay a small fixed set."""
    rule = request.url_rule
    return rule.rule.replace(metrics.SEP, "_") if rule is not None else "unmatched"


def _observe(response):
    started = g.get("started")
    if started is not None:
        method = request.method if request.method in _METHODS else "other"
        current_app.extensions[_EXTENSION_KEY].observe(get_redis(), method, _route(), response.status_code,
                                                       time.perf_counter() - started)
    return response


def init_metrics(app: Flask) -> None:
    """Count every request (after the app's other after-request steps have set the final status) and serve
    /metrics."""
    app.extensions[_EXTENSION_KEY] = HttpRecorder()
    app.after_request(_observe)
    app.register_blueprint(bp)
    if not app.config.get("METRICS_TOKEN"):
        log.info("H3BATCH_METRICS_TOKEN is unset: GET /metrics answers loopback clients only")


# --- access --------------------------------------------------------------------------------------------------------

def _loopback_client() -> bool:
    if any(name in request.headers for name in _PROXY_HEADERS):
        return False
    try:
        ip = ipaddress.ip_address(request.remote_addr or "")
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def _check_access() -> None:
    token = current_app.config.get("METRICS_TOKEN")
    if token:
        scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
        ok = scheme.lower() == "bearer" and hmac.compare_digest(
            hashlib.sha256(presented.strip().encode()).digest(), hashlib.sha256(token.encode()).digest())
        if not ok:
            raise ApiError(401, "unauthorized", "GET /metrics needs 'Authorization: Bearer <H3BATCH_METRICS_TOKEN>'",
                           False, {"WWW-Authenticate": 'Bearer realm="h3batch-metrics"'})
    elif not _loopback_client():
        raise ApiError(403, "forbidden", "GET /metrics answers only loopback clients while H3BATCH_METRICS_TOKEN is "
                                         "unset; set it to scrape from another host")


@bp.get("/metrics")
def scrape():
    """The Prometheus text exposition of every service metric. Raises 401 unauthorized / 403 forbidden."""
    _check_access()
    r = get_redis()
    current_app.extensions[_EXTENSION_KEY].flush(r)  # this process's own requests are in the answer
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ServiceCollector(r, sweep_queue=current_app.config.get("SWEEP_QUEUE") or "loadrunner"))
    # Text format 0.0.4, which every Prometheus version reads (the names are ASCII, so 1.0.0 would read the same).
    response = Response(generate_latest(registry), content_type=CONTENT_TYPE_PLAIN_0_0_4)
    response.headers["Cache-Control"] = "no-store"
    return response


# --- the collector -------------------------------------------------------------------------------------------------

def _histogram(name: str, doc: str, label_names: list[str], raw: dict[str, str], bounds: tuple[float, ...],
               always: list[tuple[str, ...]] = ()) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=label_names)
    series = metrics.parse_histogram(raw)
    for labels in always:
        series.setdefault(labels, {"buckets": {}, "sum": 0.0, "count": 0})
    for labels, data in sorted(series.items()):
        if len(labels) != len(label_names):
            continue  # a field this version does not write
        buckets = [(floatToGoString(bound), float(n)) for bound, n in metrics.cumulative(data["buckets"], bounds)]
        family.add_metric(list(labels), buckets, sum_value=data["sum"])
    return family


class ServiceCollector:
    """Reads the service's figures from Redis on each scrape and yields them as metric families."""

    def __init__(self, r: redis.Redis, sweep_queue: str = "loadrunner"):
        self.r = r
        self.sweep_queue = sweep_queue

    def collect(self):
        r = self.r
        hashes = (keys.METRICS_JOBS, keys.METRICS_ERRORS, keys.metrics_histogram(metrics.STAGE_HISTOGRAM),
                  keys.metrics_histogram(metrics.QUEUE_WAIT_HISTOGRAM), keys.METRICS_HTTP,
                  keys.metrics_histogram(metrics.HTTP_HISTOGRAM), keys.METRICS_BATCHES)
        with r.pipeline(transaction=False) as pipe:
            for key in hashes:
                pipe.hgetall(key)
            pipe.zcard(keys.BACKLOG)  # every queued job, held batch items included
            pipe.zcard(keys.RUNNING)
            found = pipe.execute()
        jobs, errors, stages, queue_wait, http, http_hist, batches = found[:7]
        queued, running = found[7:]

        family = CounterMetricFamily("h3batch_jobs", "Transitions into each status, not a count of jobs: queued "
                                                     "counts creations and requeues after worker loss, in_progress "
                                                     "every claim (re-claims too); jobs queued or running now are "
                                                     "h3batch_jobs_queued and h3batch_jobs_running",
                                     labels=["status"])
        for status in sorted(set(JOB_STATUSES) | set(jobs)):
            family.add_metric([status], float(jobs.get(status, 0)))
        yield family
        family = CounterMetricFamily("h3batch_job_errors", "Jobs that failed, by error code", labels=["code"])
        for code, n in sorted(errors.items()):
            family.add_metric([code], float(n))
        yield family
        yield _histogram("h3batch_job_stage_duration_seconds", "Seconds each stage of a completed job took",
                         ["stage"], stages, defaults.STAGE_BUCKETS_S, [(s,) for s in metrics.STAGES])
        yield _histogram("h3batch_job_queue_wait_seconds", "Seconds from a job's creation to its first claim by a "
                         "worker", [], queue_wait, defaults.STAGE_BUCKETS_S, [()])
        yield GaugeMetricFamily("h3batch_jobs_queued", "Jobs queued now (waiting for a worker; batch items "
                                "included)", value=queued)
        yield GaugeMetricFamily("h3batch_jobs_running", "Jobs in progress now", value=running)

        family = GaugeMetricFamily("h3batch_queue_depth", "Messages waiting in the broker per Celery queue",
                                   labels=["queue"])
        family.add_metric([defaults.RENDER_QUEUE], broker.render_depth(r))  # every capability queue together
        family.add_metric([self.sweep_queue], broker.ready_depth(r, self.sweep_queue, SWEEP_KEY_PREFIX))
        yield family

        states = Counter(beat.get("state") for beat in live_workers(r, WORKER_STATES))
        family = GaugeMetricFamily("h3batch_workers", "GPU workers with a fresh heartbeat, by state (READY idle, "
                                                      "BUSY rendering, DISK_FULL taking no jobs for want of disk "
                                                      "space)", labels=["state"])
        for state in WORKER_STATES:
            family.add_metric([state], states.get(state, 0))
        yield family

        yield from _batch_families(r, batches)

        family = CounterMetricFamily("h3batch_http_requests", "API requests by method, route and status",
                                     labels=["method", "route", "status"])
        for field, n in sorted(http.items()):
            parts = field.split(metrics.SEP)
            if len(parts) == 3:
                family.add_metric(parts, float(n))
        yield family
        yield _histogram("h3batch_http_request_duration_seconds", "Seconds from a request's arrival to its "
                         "response headers", ["method", "route"], http_hist, defaults.HTTP_BUCKETS_S)
        yield from _sweep_families(sweep_store.last_finished(r))


def open_batches(r: redis.Redis) -> Counter[str]:
    """Unfinished batches (`h3b:batches:open`) by status: `queued` while every item is still held by the feeder
    (none released to the workers, no cancel asked), else `in_progress`; two reads per open batch, not per item."""
    ids = r.zrange(keys.BATCHES_OPEN, 0, -1)
    with r.pipeline(transaction=False) as pipe:
        for batch_id in ids:
            pipe.hmget(keys.batch(batch_id), ["total", "cancel_requested"])
            pipe.zcard(keys.batch_pending(batch_id))
        found = pipe.execute()
    out: Counter[str] = Counter({"queued": 0, "in_progress": 0})
    for (total, cancel_requested), pending in zip(found[::2], found[1::2]):
        if total is None:
            continue  # deleted between the two reads
        held = int(pending) == int(total) and not cancel_requested
        out["queued" if held else "in_progress"] += 1
    return out


def _batch_families(r: redis.Redis, counted: dict[str, str]):
    family = GaugeMetricFamily("h3batch_batches", "Unfinished batches by status (queued: no item released to the "
                               "workers yet)", labels=["status"])
    for status, n in sorted(open_batches(r).items()):
        family.add_metric([status], n)
    yield family
    yield CounterMetricFamily("h3batch_batches_created", "Batches created", value=float(counted.get("created", 0)))
    family = CounterMetricFamily("h3batch_batches_finished", "Batches finished, by final status",
                                 labels=["status"])
    for status in ("completed", "cancelled"):
        family.add_metric([status], float(counted.get(status, 0)))
    yield family


_POINT_GAUGES = (
    ("ok", "h3batch_sweep_last_point_ok", "1 when the point passed every acceptance check", 1.0),
    ("passed_sessions", "h3batch_sweep_last_point_passed_sessions", "Sessions of the point that passed", 1.0),
    ("send_lateness_p99_ms", "h3batch_sweep_last_point_send_lateness_p99_seconds",
     "Worst session p99 of client send lateness", 1e-3),
    ("first_audio_ms", "h3batch_sweep_last_point_first_audio_seconds",
     "Median time to first audio after stream start", 1e-3),
    ("client_stream_rtf", "h3batch_sweep_last_point_client_stream_rtf", "Median client stream real-time factor", 1.0),
    ("server_stream_rtf", "h3batch_sweep_last_point_server_stream_rtf", "Median server stream real-time factor", 1.0),
)
"""Per-point gauges of the last sweep: (summary column, metric, help, scale to base units)."""


def _sweep_families(record: dict[str, Any] | None):
    info = GaugeMetricFamily("h3batch_sweep_last_info", "The load runner's last finished sweep (value 1)",
                             labels=["sweep_id", "status", "origin"])
    finished = GaugeMetricFamily("h3batch_sweep_last_finished_timestamp_seconds",
                                 "When the last finished sweep finished (Unix time)")
    points = GaugeMetricFamily("h3batch_sweep_last_points", "Points of the last finished sweep by status",
                               labels=["status"])
    capacity = GaugeMetricFamily("h3batch_sweep_last_capacity_sessions", "Largest session count whose repetitions "
                                 "all passed in the last sweep, per load-frames setting", labels=["load_frames"])
    per_point = {column: GaugeMetricFamily(name, doc, labels=["point_id", "sessions", "load_frames"])
                 for column, name, doc, _ in _POINT_GAUGES}
    if record is not None:
        info.add_metric([record.get("id") or "", record.get("status") or "", record.get("origin") or ""], 1)
        try:
            finished.add_metric([], calendar.timegm(time.strptime(record.get("finished_at") or "",
                                                                  "%Y-%m-%dT%H:%M:%SZ")))
        except ValueError:
            pass  # never finished cleanly: no timestamp
        summary = record.get("summary") or {}
        rows = summary.get("points") or []
        for status, n in sorted(Counter(row.get("status") or "unknown" for row in rows).items()):
            points.add_metric([status], n)
        for frames, sessions in sorted((summary.get("capacity_sessions") or {}).items()):
            if isinstance(sessions, (int, float)):
                capacity.add_metric([str(frames)], sessions)
        for row in rows:
            labels = [str(row.get("point_id")), str(row.get("sessions")), str(row.get("load_frames"))]
            for column, _, _, scale in _POINT_GAUGES:
                value = row.get(column)
                if isinstance(value, bool):
                    value = float(value)
                if isinstance(value, (int, float)):
                    per_point[column].add_metric(labels, value * scale)
    yield info
    yield finished
    yield points
    yield capacity
    yield from per_point.values()
