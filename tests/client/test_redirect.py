"""Downloads behind a redirect (an API in S3 mode answers GET /jobs/{id}/content with a 307 to a presigned URL).

Two real HTTP servers on 127.0.0.1, on two ports (two origins): `api` redirects the content route to `bucket`, which
serves the bytes and records the headers it was sent. The client must follow, save the bytes, and keep its key to
the API's origin; an answer that is no file (a 204) is an error, never an empty MP4.
"""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from h3batch.client import AsyncClient, Client
from h3batch.client.errors import DownloadError

PAYLOAD = bytes(range(256)) * 300  # 76.8 kB: more than one 64 KiB chunk
KEY = "sk-redirect-test"


class Origin:
    """A tiny HTTP/1.1 server; `answer(handler)` writes each response, `seen` keeps every request's headers."""

    def __init__(self, answer):
        self.seen: list[dict[str, str]] = []
        origin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):  # noqa: N802
                origin.seen.append({k.lower(): v for k, v in self.headers.items()})
                answer(self)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def origins():
    def serve_bytes(h):
        h.send_response(200)
        h.send_header("Content-Type", "video/mp4")
        h.send_header("Content-Length", str(len(PAYLOAD)))
        h.end_headers()
        h.wfile.write(PAYLOAD)

    bucket = Origin(serve_bytes)

    def redirect_or_nothing(h):
        if h.path.startswith("/jobs/job_redirect/"):
            h.send_response(307)
            h.send_header("Location", f"{bucket.base}/jobs/job_redirect/attempt-1.mp4?X-Amz-Signature=abc")
        else:
            h.send_response(204)
        h.send_header("Content-Length", "0")
        h.end_headers()

    api = Origin(redirect_or_nothing)
    yield api, bucket
    api.close()
    bucket.close()


def test_download_follows_the_redirect_and_keeps_the_key_home(origins, tmp_path):
    api, bucket = origins
    out = tmp_path / "clip.mp4"
    with Client(api.base, api_key=KEY) as client:
        size = client.download("job_redirect", out)
    assert size == len(PAYLOAD) and out.read_bytes() == PAYLOAD
    assert api.seen[0]["authorization"] == f"Bearer {KEY}"
    assert bucket.seen and all("authorization" not in headers for headers in bucket.seen)


def test_async_download_follows_the_redirect(origins, tmp_path):
    import asyncio

    api, bucket = origins
    out = tmp_path / "clip.mp4"

    async def go():
        async with AsyncClient(api.base, api_key=KEY) as client:
            return await client.download("job_redirect", out)

    assert asyncio.run(go()) == len(PAYLOAD) and out.read_bytes() == PAYLOAD
    assert all("authorization" not in headers for headers in bucket.seen)


def test_an_answer_that_is_no_file_is_an_error_not_an_empty_clip(origins, tmp_path):
    api, _ = origins
    out = tmp_path / "clip.mp4"
    with Client(api.base, api_key=KEY) as client, pytest.raises(DownloadError, match="204"):
        client.download("job_empty", out)
    assert not out.exists()
