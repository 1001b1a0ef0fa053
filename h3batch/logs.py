"""Structured logs for every h3batch process: one line per record, key=value (default) or JSON
(H3BATCH_LOG_FORMAT=json), with fields passed through `extra=` (job_id, worker, ...) as their own keys."""
from __future__ import annotations

import json
import logging
import sys
import time

from h3batch.settings import Settings

_STANDARD_RECORD_FIELDS = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class StructuredFormatter(logging.Formatter):
    """One line per record: `ts=… level=… logger=… msg="…" job_id=…` (kv) or the same fields as JSON."""

    def __init__(self, fmt: str = "kv"):
        super().__init__()
        self.fmt = fmt

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():  # fields passed with extra={...}, e.g. job_id
            if key not in _STANDARD_RECORD_FIELDS and not key.startswith("_"):
                fields[key] = value
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        if self.fmt == "json":
            return json.dumps(fields, default=str)
        return " ".join(f"{k}={_kv_value(v)}" for k, v in fields.items())


def _kv_value(value: object) -> str:
    text = str(value)
    if text and not any(c in text for c in ' "=\n\t'):
        return text
    return json.dumps(text)


def configure_logging(settings: Settings, stream=None) -> None:
    """Route every logger through one structured handler on stderr (idempotent)."""
    root = logging.getLogger()
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(StructuredFormatter(settings.log_format))
    handler.set_name("h3batch")
    root.handlers = [h for h in root.handlers if h.get_name() != "h3batch"] + [handler]
    root.setLevel(settings.log_level)
