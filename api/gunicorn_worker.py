"""The gunicorn worker class `h3batch api` runs: gthread, with gunicorn's own error answers in the API's JSON error
envelope.

gunicorn answers some requests before Flask sees them (a request line over `--limit-request-line` → 414, too many or
too large headers → 431, a malformed request line, header or chunk → 400, an unknown transfer coding → 501) with a
small HTML page. Here the same statuses carry `{"error": {"code", "message", "retryable": false, "request_id"}}`,
so a client parses one shape for every non-2xx answer.
"""
from __future__ import annotations

import json
import re
import secrets

from gunicorn.http import errors as http_errors
from gunicorn.util import write_nonblock
from gunicorn.workers.gthread import ThreadWorker

_STATUS = (
    (http_errors.LimitRequestLine, 414, "URI Too Long"),
    (http_errors.LimitRequestHeaders, 431, "Request Header Fields Too Large"),
    (http_errors.UnsupportedTransferCoding, 501, "Not Implemented"),
    (http_errors.ExpectationFailed, 417, "Expectation Failed"),
    (http_errors.ForbiddenProxyRequest, 403, "Forbidden"),
)
"""gunicorn's parse errors whose status is not 400, as gunicorn.workers.base.Worker.handle_error answers them."""
_NOT_THE_CLIENTS = (http_errors.InvalidResponseHeader, http_errors.InvalidResponseHeaderName,
                    http_errors.ConfigurationProblem)
_MAX_MESSAGE_CHARS = 200


def error_bytes(status: int, reason: str, message: str) -> bytes:
    """A whole HTTP/1.1 response (Connection: close) with the JSON error envelope."""
    code = re.sub(r"[^a-z0-9]+", "_", reason.lower()).strip("_")
    request_id = "req_" + secrets.token_hex(8)
    body = json.dumps({"error": {"code": code, "message": message[:_MAX_MESSAGE_CHARS], "retryable": False,
                                 "request_id": request_id}}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
            f"X-Request-ID: {request_id}\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode("latin-1") + body


class JsonErrorThreadWorker(ThreadWorker):
    """gunicorn's gthread worker; request-parsing errors answer with the JSON envelope instead of HTML."""

    def handle_error(self, req, client, addr, exc):
        if not isinstance(exc, http_errors.ParseException) or isinstance(exc, _NOT_THE_CLIENTS):
            # A failure on the server's side (Flask answers its own errors; this is what escapes it): gunicorn's
            # handling, which logs the traceback and answers 500.
            return super().handle_error(req, client, addr, exc)
        status, reason = 400, "Bad Request"
        for kind, kind_status, kind_reason in _STATUS:
            if isinstance(exc, kind):
                status, reason = kind_status, kind_reason
                break
        self.log.warning("Invalid request from ip=%s: %s", (addr or ("",))[0], exc)
        try:
            write_nonblock(client, error_bytes(status, reason, f"{reason.lower()}: {exc}"))
        except Exception:  # noqa: BLE001  # the client may already be gone; nothing more to tell it
            self.log.debug("Failed to send error message.")
