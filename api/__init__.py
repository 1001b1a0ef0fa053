"""h3batch job API: Flask app factory (flaskr shape). Never imports torch; nothing touches Redis at import time."""
from __future__ import annotations

import logging
import re
import secrets
import time
from typing import Any

from flask import Flask, g, request

from h3batch.settings import Settings

log = logging.getLogger("h3batch.api")

_REQUEST_ID_OK = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")

_FROM_SETTINGS = ("redis_url", "max_queued", "max_active_per_key", "max_prompt_chars", "max_run_s", "result_ttl_s", "api_threads",
                  "wait_max", "wait_max_per_key", "sse_max_streams", "sse_max_streams_per_key", "sse_max_s",
                  "sse_keepalive_s", "openai_model", "canvas", "sweep_queue", "sweep_allow_loopback",
                  "sweep_allow_private", "max_batch", "metrics_token", "default_precision", "max_job_timeout_s")
"""Settings fields the API reads as they are, under their names in capitals (`CANVAS`: a name of
core.geometry.CANVAS_PROFILES); the rest are converted below."""


def create_app(config: dict[str, Any] | None = None) -> Flask:
    """Build the API: defaults from the one Settings (H3BATCH_* env vars, read here once), overlaid by `config`
    (tests), then the blueprints. Every module reads its knobs from `app.config`, never from the environment."""
    from h3batch.api.ratelimit import RateLimits  # noqa: PLC0415
    from h3batch.core import defaults, loras  # noqa: PLC0415
    from h3batch.core.webhook_urls import WebhookSettings  # noqa: PLC0415

    app = Flask(__name__)
    settings = Settings.from_env()
    app.config.from_mapping({name.upper(): getattr(settings, name) for name in _FROM_SETTINGS})
    app.config.from_mapping(
        ARTIFACTS_DIR=str(settings.artifacts_dir),
        ARTIFACT_STORE=settings.artifact_store,
        S3_ENDPOINT_URL=settings.s3_endpoint_url,
        ARTIFACT_REDIRECT=settings.artifact_redirect,
        API_KEYS=list(settings.api_keys),
        SWEEP_RESULTS_DIR=str(settings.sweep_results_dir),
        RATE_LIMITS=RateLimits(settings.rate_creates_per_min, settings.rate_reads_per_min),
        WEBHOOKS=WebhookSettings.from_settings(settings),
        LORA_POLICY=loras.policy_of(settings.lora_allow, settings.max_loras),
    )

    app.config["MAX_CONTENT_LENGTH"] = defaults.MAX_BODY_BYTES
    if config:
        app.config.update(config)
    app.json.sort_keys = False  # type: ignore[attr-defined]  # keep fields in model order

    from h3batch.api import (  # noqa: PLC0415
        auth,
        batches,
        errors,
        health,
        jobs,
        metrics,
        openai_videos,
        openapi,
        ratelimit,
        request_guard,
        slots,
        stream_slots,
        sweeps,
        usage,
        web,
    )

    app.before_request(_start_request)
    metrics.init_metrics(app)  # first after_request registered, so it runs last and counts the final status
    errors.register_error_handlers(app)
    auth.init_auth(app)
    ratelimit.init_rate_limit(app)  # after auth: limits are per API key
    batches.init_batches(app)  # before the request guard: POST /batches has its own body limit
    request_guard.init_request_guard(app)
    budget = slots.init_slots(app)
    log.debug("slots threads=%d waits=%d/%d per key streams=%d/%d per key", budget.threads, budget.waits,
              budget.waits_per_key, budget.streams, budget.streams_per_key)
    stream_slots.init_stream_slots(app)  # after auth: only an authenticated event stream takes a stream slot
    app.after_request(_finish_request)
    app.register_blueprint(health.bp)
    app.register_blueprint(jobs.bp)
    app.register_blueprint(batches.bp)
    app.register_blueprint(openapi.bp)
    app.register_blueprint(sweeps.bp)
    app.register_blueprint(usage.bp)
    app.register_blueprint(openai_videos.bp)
    app.register_blueprint(web.bp)
    return app


def _start_request() -> None:
    g.started = time.perf_counter()
    incoming = request.headers.get("X-Request-ID", "")
    g.request_id = incoming if _REQUEST_ID_OK.match(incoming) else "req_" + secrets.token_hex(8)


def _finish_request(response):
    response.headers["X-Request-ID"] = g.get("request_id", "")
    elapsed_ms = (time.perf_counter() - g.get("started", time.perf_counter())) * 1000
    level = logging.DEBUG if request.method in ("GET", "HEAD") and response.status_code < 400 else logging.INFO
    log.log(level, "request method=%s path=%s status=%d ms=%.1f", request.method, request.path,
            response.status_code, elapsed_ms,
            extra={"request_id": g.get("request_id"), "job_id": g.get("job_id"), "owner": g.get("owner")})
    return response
