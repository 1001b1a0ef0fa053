"""Vet a `webhook_url` at the door (POST /jobs and POST /v1/videos), with the same rules the worker applies again at
delivery time (core/webhook_urls.py): refused targets answer 422 `invalid_webhook_url`; a server without
H3BATCH_WEBHOOK_SECRET answers 400 `webhooks_not_configured` (it could not sign the calls)."""
from __future__ import annotations

from flask import current_app

from h3batch.api.errors import ApiError
from h3batch.core.webhook_urls import WebhookRefused, WebhookSettings, check_url

_EXTENSION_KEY = "h3batch.webhook_settings"


def webhook_settings() -> WebhookSettings:
    """The app's webhook settings: `config["WEBHOOKS"]` (from H3BATCH_WEBHOOK_* in create_app, or a test's)."""
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    settings = app.extensions.get(_EXTENSION_KEY)
    if settings is None:
        settings = app.config.get("WEBHOOKS") or WebhookSettings()
        app.extensions[_EXTENSION_KEY] = settings
    return settings


def vet_webhook_url(url: str) -> str:
    """Return `url` if the service may call it; raises ApiError otherwise."""
    settings = webhook_settings()
    if not settings.enabled:
        raise ApiError(400, "webhooks_not_configured", "webhook_url: this server has no H3BATCH_WEBHOOK_SECRET, so "
                                                       "it cannot sign webhook calls; leave webhook_url out")
    try:
        check_url(url, settings)
    except WebhookRefused as exc:
        raise ApiError(422, "invalid_webhook_url", str(exc)) from None
    return url
