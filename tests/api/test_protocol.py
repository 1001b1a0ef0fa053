"""HTTP protocol details of the content downloads (P5 item 11), on a real rendered MP4 behind gunicorn: RFC 9110's
Range rules (a Range the server will not act on is ignored and the whole file sent with 200; a suffix longer than
the file selects all of it) and If-Match (a failed precondition is a 412 error envelope, never the file); the
conditional-request matrix of RFC 9110 §13 on job content and on the batch archive (tests/api/conditional_matrix.py)."""
from __future__ import annotations

import pytest
import requests

from tests.api.conditional_matrix import check_matrix
from tests.api.conftest import auth, wait_job
from tests.service_stack import wait_batch


@pytest.fixture(scope="module")
def rendered(compat_api, compat_worker):
    """One completed job; (content URL, the MP4's bytes, its ETag)."""
    job = requests.post(f"{compat_api.base}/jobs", json={"prompt": "a bell rings", "width": 256, "height": 128},
                        headers=auth(), timeout=60).json()
    assert wait_job(compat_api.base, job["id"])["status"] == "completed"
    url = f"{compat_api.base}/jobs/{job['id']}/content"
    whole = requests.get(url, headers=auth(), timeout=30)
    assert whole.status_code == 200 and len(whole.content) > 100
    return url, whole.content, whole.headers["ETag"]


@pytest.mark.parametrize("header", ["bytes=0-1,5-6", "items=0-1", "bytes=5-1", "bytes=abc", "bytes=-0"])
def test_a_range_the_server_will_not_act_on_is_ignored(rendered, header):
    """Several ranges (no multipart/byteranges here), another unit, or an unparseable range: 200 with the whole
    file (was 416)."""
    url, content, _ = rendered
    reply = requests.get(url, headers={**auth(), "Range": header}, timeout=30)
    assert reply.status_code == 200 and reply.content == content, (reply.status_code, reply.headers)
    assert "Content-Range" not in reply.headers


def test_an_oversized_suffix_range_serves_the_whole_file(rendered):
    """`bytes=-N` with N past the file's length selects the whole file: 206 with Content-Range 0-(len-1)/len."""
    url, content, _ = rendered
    reply = requests.get(url, headers={**auth(), "Range": f"bytes=-{len(content) * 10}"}, timeout=30)
    assert reply.status_code == 206 and reply.content == content
    assert reply.headers["Content-Range"] == f"bytes 0-{len(content) - 1}/{len(content)}"


def test_satisfiable_and_unsatisfiable_single_ranges_are_unchanged(rendered):
    """A single satisfiable range is still 206 with those bytes; one that starts past the end is still 416."""
    url, content, _ = rendered
    part = requests.get(url, headers={**auth(), "Range": "bytes=2-9"}, timeout=30)
    assert part.status_code == 206 and part.content == content[2:10]
    past = requests.get(url, headers={**auth(), "Range": f"bytes={len(content) + 5}-"}, timeout=30)
    assert past.status_code == 416 and past.json()["error"]["retryable"] is False


def test_failed_if_match_is_412_without_the_body(rendered):
    """If-Match with a tag that is not the file's: 412 error envelope (not the MP4 with a 412 status); the right tag
    gets the file."""
    url, content, etag = rendered
    for path in (url, url.replace("/jobs/", "/v1/videos/")):
        reply = requests.get(path, headers={**auth(), "If-Match": '"not-the-tag"'}, timeout=30)
        assert reply.status_code == 412 and reply.headers["Content-Type"].startswith("application/json")
        error = reply.json()["error"]
        assert error["code"] == "precondition_failed" and error["retryable"] is False
        assert len(reply.content) < 1000
    assert requests.get(url, headers={**auth(), "If-Match": etag}, timeout=30).content == content


@pytest.fixture(scope="module")
def finished_batch(compat_api, compat_worker):
    """A one-item batch that has finished; its archive URL."""
    made = requests.post(f"{compat_api.base}/batches", json={"requests": [{"prompt": "a gong", "custom_id": "gong"}]},
                         headers=auth(), timeout=10)
    assert made.status_code == 202, made.text
    batch = wait_batch(compat_api.base, made.json()["id"], auth())
    assert batch["status"] == "completed", batch
    return f"{compat_api.base}/batches/{batch['id']}/archive"


def test_conditional_requests_on_job_content(rendered):
    """RFC 9110 §13 on both content routes of a file in the local store: If-Match (`*`, strong), If-None-Match
    (`*`, weak, 304), If-Range (strong only: a weak tag sends the whole file), the date conditions against
    Last-Modified, and the §13.2.2 order between them."""
    url, _, _ = rendered
    for path in (url, url.replace("/jobs/", "/v1/videos/")):
        assert check_matrix(path, auth(), expect_last_modified=True) > 25


def test_conditional_requests_on_the_batch_archive(finished_batch):
    """The same matrix on the batch archive, which sends no Last-Modified (so the date conditions are ignored)."""
    assert check_matrix(finished_batch, auth(), expect_last_modified=False) > 20
