"""WSGI entry for gunicorn: `gunicorn h3batch.api.wsgi:app` (configuration from H3BATCH_* env vars)."""
from __future__ import annotations

import logging

from h3batch.api import create_app
from h3batch.logs import configure_logging
from h3batch.settings import Settings

configure_logging(Settings.from_env())
logging.getLogger("h3batch.api").info("api starting")
app = create_app()
