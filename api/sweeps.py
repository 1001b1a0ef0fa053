"""/sweeps: start load-runner sweeps, read their status and per-point results, serve their plots and JSON.

Imports only Flask, redis, Celery and the stdlib parts of `loadrunner` (never numpy, websockets or torch); the
sweep itself runs in `h3batch sweep-worker` on the `loadrunner` queue.
"""
from __future__ import annotations

import re
from pathlib import Path

from flask import Blueprint, current_app, g, jsonify, request, send_from_directory, url_for

from h3batch.api.errors import ApiError
from h3batch.api.redis_client import get_redis
from h3batch.core.webhook_urls import WebhookRefused, WebhookSettings, check_url
from h3batch.loadrunner import sweep_store
from h3batch.loadrunner.sweep_settings import DEFAULT_QUEUE, DEFAULT_RESULTS_DIR, SweepSettings
from h3batch.loadrunner.sweep_spec import new_sweep_id, parse_sweep_request, points

bp = Blueprint("sweeps", __name__, url_prefix="/sweeps")

_SWEEP_ID = re.compile(r"^sw_[0-9a-f]{16}$")
_FILE = re.compile(r"^(?:[A-Za-z0-9_.-]+/)?[A-Za-z0-9_.-]+\.(?:png|json|csv)$")
_CELERY_KEY = "h3batch.sweep_celery"


def _results_dir() -> Path:
    return Path(current_app.config.get("SWEEP_RESULTS_DIR") or DEFAULT_RESULTS_DIR)


def _queue() -> str:
    return current_app.config.get("SWEEP_QUEUE") or DEFAULT_QUEUE


def _celery():
    """A client-only sweep Celery app on the API's Redis URL, made on first use and kept on the app."""
    client = current_app.extensions.get(_CELERY_KEY)
    if client is None:
        from h3batch.loadrunner.celery_app import make_app  # noqa: PLC0415

        client = make_app(SweepSettings(redis_url=current_app.config["REDIS_URL"], queue=_queue()))
        current_app.extensions[_CELERY_KEY] = client
    return client


def _links(record: dict) -> dict:
    sweep_id = record["id"]
    links = {"self": url_for("sweeps.get_sweep", sweep_id=sweep_id)}
    summary = record.get("summary")
    if summary:
        files = summary["files"]
        links["summary_json"] = url_for("sweeps.get_file", sweep_id=sweep_id, name=files["summary_json"])
        links["summary_csv"] = url_for("sweeps.get_file", sweep_id=sweep_id, name=files["summary_csv"])
        links["plots"] = {name.rsplit(".", 1)[0]: url_for("sweeps.get_file", sweep_id=sweep_id, name=name)
                          for name in files["plots"]}
        links["reports"] = {pid: url_for("sweeps.get_file", sweep_id=sweep_id, name=path)
                            for pid, path in files["reports"].items()}
    return links


def _checked_id(sweep_id: str) -> str:
    if not _SWEEP_ID.match(sweep_id):
        raise ApiError(404, "sweep_not_found", f"no sweep {sweep_id!r} (ids look like sw_<16 hex>)")
    return sweep_id


def _owned(sweep_id: str) -> dict:
    """The caller's sweep (or a scheduled one) with its points. Raises 404 sweep_not_found, also for another key's."""
    record = sweep_store.get_sweep(get_redis(), _checked_id(sweep_id))
    if record is None or not sweep_store.visible_to(record, g.owner):
        raise ApiError(404, "sweep_not_found", f"no sweep {sweep_id!r}")
    return record


def _vet_target(url: str) -> None:
    """The target URL passes the webhook rules (core/webhook_urls.py: no link-local, metadata or reserved
    addresses; loopback and private ranges only when H3BATCH_SWEEP_ALLOW_LOOPBACK / _PRIVATE say so), checked here
    at submission so a refused URL is never contacted. Raises 400 invalid_sweep."""
    rules = WebhookSettings(allow_loopback=current_app.config.get("SWEEP_ALLOW_LOOPBACK", False),
                            allow_private=current_app.config.get("SWEEP_ALLOW_PRIVATE", False))
    try:
        check_url("http" + url[2:], rules)  # ws:// -> http://, wss:// -> https://: same host and port rules
    except WebhookRefused as exc:
        message = str(exc).replace("webhook_url", "url", 1).replace("H3BATCH_WEBHOOK_", "H3BATCH_SWEEP_")
        raise ApiError(400, "invalid_sweep", message) from None


@bp.post("")
def create_sweep():
    """Validate a grid and vet its target, record the sweep as the caller's, queue it; 202 with its id. Raises 400
    invalid_sweep."""
    body = request.get_json(silent=True)
    if body is None:
        raise ApiError(400, "invalid_sweep", "expected a JSON object body (Content-Type: application/json)")
    try:
        parsed = parse_sweep_request(body)
    except ValueError as exc:
        raise ApiError(400, "invalid_sweep", str(exc)) from None
    _vet_target(parsed.url)
    sweep_id = new_sweep_id()
    record = sweep_store.create_sweep(get_redis(), sweep_id, parsed.to_dict(), [p.id for p in points(parsed)],
                                      "api", owner=g.owner)
    _celery().send_task("loadrunner.start_sweep", args=[parsed.to_dict(), sweep_id, "api"], queue=_queue())
    response = jsonify({**record, "links": _links(record)})
    response.status_code = 202
    response.headers["Location"] = url_for("sweeps.get_sweep", sweep_id=sweep_id)
    return response


@bp.get("")
def list_sweeps():
    """Newest sweeps first (without points); `?limit=` 1-200. Raises 400 invalid_limit."""
    raw = request.args.get("limit", "50")
    # isdigit() alone admits "²" and "٣", which int() then refuses or reads: plain ASCII digits, at most 3 of them.
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 3) or not 1 <= int(raw) <= 200:
        raise ApiError(400, "invalid_limit", f"limit must be an integer in [1,200], got {raw[:40]!r}")
    records = sweep_store.list_sweeps(get_redis(), int(raw), owner=g.owner)
    return jsonify({"sweeps": [{**rec, "links": _links(rec)} for rec in records]})


@bp.get("/<sweep_id>")
def get_sweep(sweep_id: str):
    """Status, per-point results and links to plots and JSON. Raises 404 sweep_not_found (also another key's)."""
    record = _owned(sweep_id)
    return jsonify({**record, "links": _links(record)})


@bp.get("/<sweep_id>/files/<path:name>")
def get_file(sweep_id: str, name: str):
    """A sweep's PNG plot, summary JSON/CSV or a point's load-result.json. Raises 404 file_not_found."""
    _owned(sweep_id)
    if not _FILE.match(name):
        raise ApiError(404, "file_not_found", f"no file {name!r} in sweep {sweep_id}")
    directory = _results_dir().resolve() / sweep_id
    if not (directory / name).is_file():
        raise ApiError(404, "file_not_found", f"no file {name!r} in sweep {sweep_id}")
    return send_from_directory(directory, name, max_age=0)
