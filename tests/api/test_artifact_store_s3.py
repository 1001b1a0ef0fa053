"""The S3 artifact store against a real S3-compatible server process (moto's standalone server on loopback): the
worker's confirmed multipart upload, downloads streamed with Range/ETag/HEAD, the presigned 307 followed by the
openai SDK and `h3batch submit`, variants stored beside the MP4, delete, lazy expiry and the garbage pass, start-up
refusals (missing bucket, refused credentials), and no credential in any log.

One module stack: a private redis-server, one moto server, one worker, two APIs on the same Redis and bucket (one
streaming, one redirecting). About 2.5 min on the shared 2-core machine: four 128x64 renders plus one re-render
(the upload-failure test), and the worker's model load; every test shares them.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import time
import zipfile

import av
import pytest
import redis
import requests
from openai import OpenAI

from h3batch.core.artifact_store import S3Store, StoreUnavailable, attempt_key
from h3batch.worker import reaper
from tests.api.conditional_matrix import check_matrix
from tests.conftest import start_redis
from tests.object_store import MotoServer, object_store  # noqa: F401  (fixture)
from tests.service_stack import H3BATCH, REPO, ApiProcess, service_env, start_worker, tiny_release  # noqa: F401

KEY = "s3-store-key-1"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
AUTH = {"Authorization": f"Bearer {KEY}"}
SMALL = {"width": 128, "height": 64}
"""The smallest clips the contract takes at 4 s: renders on a shared CPU stay short."""
pytestmark = pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")


class S3Stack:
    def __init__(self, redis_url, moto, stream_api, redirect_api, worker, artifacts):
        self.redis_url, self.moto, self.worker, self.artifacts = redis_url, moto, worker, artifacts
        self.stream, self.redirect = stream_api, redirect_api
        self.r = redis.Redis.from_url(redis_url, decode_responses=True)

    def store(self) -> S3Store:
        return S3Store(f"s3://{self.moto.bucket}/jobs/", self.moto.endpoint, client=self.moto.client())

    def render(self, base: str | None = None, **body) -> dict:
        base = base or self.stream.base
        reply = requests.post(f"{base}/jobs", json={"prompt": "rain on a tin roof", "seconds": 4, **SMALL, **body},
                              headers=AUTH, timeout=60)
        assert reply.status_code in (200, 201, 202), reply.text
        job_id = reply.json()["id"]
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            job = requests.get(f"{base}/jobs/{job_id}", headers=AUTH, timeout=60).json()
            if job["status"] in ("completed", "failed", "cancelled"):
                assert job["status"] == "completed", job
                return job
            time.sleep(0.1)
        raise AssertionError(f"job {job_id} did not finish")

    def logs(self) -> str:
        return "".join(p.read_text(errors="replace") for p in (self.stream.log_path, self.redirect.log_path,
                                                                self.worker.log_path))


@pytest.fixture(scope="module")
def s3(object_store, tiny_release, tmp_path_factory):  # noqa: F811
    root = tmp_path_factory.mktemp("s3-stack")
    proc, url = start_redis(root / "redis")
    store_env = object_store.env(H3BATCH_API_KEYS=KEY, H3BATCH_RATE_READS_PER_MIN="100000",
                                 H3BATCH_RATE_CREATES_PER_MIN="1000")
    # The API and the worker share nothing but Redis and the bucket: each its own artifacts dir.
    stream_api = ApiProcess(service_env(url, root / "api-artifacts", **store_env), root / "api-stream.log")
    redirect_api = ApiProcess(service_env(url, root / "api-artifacts", H3BATCH_ARTIFACT_REDIRECT="1", **store_env),
                              root / "api-redirect.log")
    worker = None
    try:
        stream_api.start()
        redirect_api.start()
        worker = start_worker(url, root / "worker-artifacts", tiny_release, f"s3-worker-{os.getpid()}",
                              root / "worker.log", **store_env)
        yield S3Stack(url, object_store, stream_api, redirect_api, worker, root / "worker-artifacts")
    finally:
        if worker is not None:
            worker.stop()
        stream_api.stop()
        redirect_api.stop()
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def done_job(s3) -> dict:
    return s3.render()


@pytest.fixture(scope="module")
def submitted(s3, tmp_path_factory) -> tuple[str, bytes]:
    """`h3batch submit --out` through the redirecting API: (job id, the bytes it saved)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("H3BATCH_", "AWS_"))}
    out = tmp_path_factory.mktemp("submit") / "cli.mp4"
    done = subprocess.run(H3BATCH + ["submit", "an owl hoots at dusk", "--seconds", "4", "--width", "128",
                                     "--height", "64", "--out", str(out), "--api", s3.redirect.base,
                                     "--api-key", KEY, "--no-progress"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    job_id = next(j.split(":")[-1] for j in s3.r.scan_iter("h3b:job:job_*")
                  if s3.r.hget(j, "prompt") == "an owl hoots at dusk")
    return job_id, out.read_bytes()


def _decode_frames(data: bytes) -> int:
    with av.open(io.BytesIO(data)) as container:
        return sum(1 for _ in container.decode(video=0))


def test_worker_uploads_a_confirmed_multipart_object_named_by_the_record(s3, done_job):
    job_id = done_job["id"]
    record = s3.r.hgetall(f"h3b:job:{job_id}")
    assert record["artifact"] == attempt_key(job_id, int(record["attempt"]))  # the attempt's own key
    keys = s3.moto.keys(f"jobs/{job_id}/")
    assert keys == [f"jobs/{record['artifact']}"]
    head = s3.moto.client().head_object(Bucket=s3.moto.bucket, Key=keys[0])
    assert head["ContentLength"] == int(record["size_bytes"]) > 0
    assert head["ETag"].strip('"').endswith("-1")  # a multipart upload's ETag (one part for a tiny clip)
    assert head["ContentType"] == "video/mp4" and head["Metadata"]["sha256"] == record["sha256"]
    body = s3.moto.client().get_object(Bucket=s3.moto.bucket, Key=keys[0])["Body"].read()
    assert hashlib.sha256(body).hexdigest() == record["sha256"]
    assert not list(s3.artifacts.glob(f"{job_id}/*"))  # nothing left in the worker's scratch dir


def test_stream_download_with_range_etag_and_head(s3, done_job):
    job_id = done_job["id"]
    url = f"{s3.stream.base}/jobs/{job_id}/content"
    full = requests.get(url, headers=AUTH, timeout=30)
    assert full.status_code == 200, full.text
    sha = hashlib.sha256(full.content).hexdigest()
    assert sha == s3.r.hget(f"h3b:job:{job_id}", "sha256")
    assert full.headers["ETag"] == f'"{sha}"' and full.headers["Accept-Ranges"] == "bytes"
    assert full.headers["Content-Type"] == "video/mp4" and int(full.headers["Content-Length"]) == len(full.content)
    assert _decode_frames(full.content) > 0

    part = requests.get(url, headers={**AUTH, "Range": "bytes=100-1099"}, timeout=30)
    assert part.status_code == 206 and part.content == full.content[100:1100]
    assert part.headers["Content-Range"] == f"bytes 100-1099/{len(full.content)}"
    tail = requests.get(url, headers={**AUTH, "Range": "bytes=-500"}, timeout=30)
    assert tail.status_code == 206 and tail.content == full.content[-500:]
    past = requests.get(url, headers={**AUTH, "Range": f"bytes={len(full.content) + 10}-"}, timeout=30)
    assert past.status_code == 416
    several = requests.get(url, headers={**AUTH, "Range": "bytes=0-1,5-6"}, timeout=30)
    assert several.status_code == 200 and several.content == full.content  # no multipart/byteranges

    assert requests.get(url, headers={**AUTH, "If-None-Match": f'"{sha}"'}, timeout=30).status_code == 304
    refused = requests.get(url, headers={**AUTH, "If-Match": '"not-it"'}, timeout=30)
    assert refused.status_code == 412 and refused.json()["error"]["code"] == "precondition_failed"
    head = requests.head(url, headers=AUTH, timeout=30)
    assert head.status_code == 200 and head.content == b""
    assert int(head.headers["Content-Length"]) == len(full.content)

    openai_url = f"{s3.stream.base}/v1/videos/{job_id}/content"
    assert requests.get(openai_url, headers=AUTH, timeout=30).content == full.content


@pytest.fixture(scope="module")
def finished_batch(s3) -> str:
    """A two-item batch rendered into the bucket and finished; its id."""
    lines = [{"prompt": "a kettle whistles", "seconds": 4, "custom_id": "kettle", **SMALL},
             {"prompt": "a bell rings twice", "seconds": 4, "custom_id": "bell", **SMALL}]
    made = requests.post(f"{s3.stream.base}/batches", json={"requests": lines}, headers=AUTH, timeout=30)
    assert made.status_code == 202, made.text
    batch_id = made.json()["id"]
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        batch = requests.get(f"{s3.stream.base}/batches/{batch_id}", headers=AUTH, timeout=60).json()
        if batch["finished_at"]:
            break
        time.sleep(0.2)
    assert batch["status"] == "completed" and batch["counts"]["completed"] == 2, batch
    return batch_id


def test_batch_archive_reads_the_mp4s_from_the_bucket(s3, finished_batch):
    """A batch's zip is assembled from the objects (ranged GETs), not from a local directory: the API's own artifacts
    directory stays empty, every member equals the item's /content bytes, and a Range of the zip is its slice."""
    batch_id = finished_batch
    archive = requests.get(f"{s3.stream.base}/batches/{batch_id}/archive", headers=AUTH, timeout=60)
    assert archive.status_code == 200, archive.text
    results = [json.loads(line) for line in
               requests.get(f"{s3.stream.base}/batches/{batch_id}/results", headers=AUTH, timeout=60).text.splitlines()]
    with zipfile.ZipFile(io.BytesIO(archive.content)) as zf:
        for item in results:
            member = zf.read(f"{item['custom_id']}.mp4")
            direct = requests.get(f"{s3.stream.base}/jobs/{item['job_id']}/content", headers=AUTH, timeout=30)
            assert member == direct.content and _decode_frames(member) > 0
    part = requests.get(f"{s3.stream.base}/batches/{batch_id}/archive", headers={**AUTH, "Range": "bytes=100-4099"},
                        timeout=60)
    assert part.status_code == 206 and part.content == archive.content[100:4100]
    api_dir = s3.artifacts.parent / "api-artifacts"
    assert not any(api_dir.rglob("*.mp4")) if api_dir.exists() else True


def test_conditional_requests_on_content_and_archive_from_the_bucket(s3, done_job, finished_batch):
    """RFC 9110 §13 (tests/api/conditional_matrix.py) on job content streamed from the bucket, on both content
    routes, and on the archive of a batch whose members come from the bucket. The redirecting API answers a
    conditional GET itself (the presigned URL would carry the store's own ETag)."""
    job_id = done_job["id"]
    for path in (f"/jobs/{job_id}/content", f"/v1/videos/{job_id}/content"):
        assert check_matrix(s3.stream.base + path, AUTH, expect_last_modified=True) > 25
    assert check_matrix(f"{s3.stream.base}/batches/{finished_batch}/archive", AUTH, expect_last_modified=False) > 20
    etag = requests.head(f"{s3.stream.base}/jobs/{job_id}/content", headers=AUTH, timeout=30).headers["ETag"]
    for headers, status in (({"If-None-Match": "*"}, 304), ({"If-Match": f"W/{etag}"}, 412)):
        reply = requests.get(f"{s3.redirect.base}/jobs/{job_id}/content", headers={**AUTH, **headers},
                             allow_redirects=False, timeout=30)
        assert reply.status_code == status and "Location" not in reply.headers, (headers, reply.status_code)


@pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None,
                    reason="needs Chromium: apt-get install -y chromium chromium-driver")
def test_web_page_plays_clips_through_the_presigned_redirect(s3, done_job):
    """(Runs before the tests that expire, delete or fail jobs: the gallery then holds only servable clips.)
    The web page on the redirecting API: its gallery fetches each clip with the key, follows the 307 to the
    presigned URL on the object store (another origin: the store answers CORS) and the <video> plays it."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait

    options = Options()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.set_page_load_timeout(30)
        driver.get(s3.redirect.base + "/")
        driver.execute_script("localStorage.setItem('h3batch.apiKey', arguments[0])", KEY)
        driver.get(s3.redirect.base + "/")
        clips = "return [...document.querySelectorAll('#gallery video')].map(v => [v.readyState, v.duration]);"
        # the gallery shows thumbnails and fetches a clip only when it is played (issue 30): play each one
        WebDriverWait(driver, 60, poll_frequency=0.1).until(
            lambda d: d.execute_script("return document.querySelectorAll('#gallery button.play').length"))
        driver.execute_script("document.querySelectorAll('#gallery button.play').forEach(b => b.click())")
        WebDriverWait(driver, 60, poll_frequency=0.1).until(
            lambda d: d.execute_script(clips) and all(state >= 1 for state, _ in d.execute_script(clips)))
        assert all(duration > 3.9 for _, duration in driver.execute_script(clips))
    finally:
        driver.quit()
    redirected = requests.get(f"{s3.redirect.base}/jobs/{done_job['id']}/content", headers=AUTH, timeout=30,
                              allow_redirects=False)
    assert redirected.status_code == 307  # the page's bytes came from the store, not through the API


def test_variants_are_derived_once_and_stored_beside_the_mp4(s3, done_job):
    job_id = done_job["id"]
    artifact = s3.r.hget(f"h3b:job:{job_id}", "artifact")
    folder = artifact.rsplit("/", 1)[0]
    thumb = requests.get(f"{s3.stream.base}/v1/videos/{job_id}/content?variant=thumbnail", headers=AUTH, timeout=60)
    assert thumb.status_code == 200 and thumb.content.startswith(b"\x89PNG")
    audio = requests.get(f"{s3.stream.base}/v1/videos/{job_id}/content?variant=audio", headers=AUTH, timeout=60)
    assert audio.status_code == 200 and audio.headers["Content-Type"] == "audio/mp4"
    with av.open(io.BytesIO(audio.content)) as container:
        assert container.streams.audio[0].codec_context.name == "aac" and not container.streams.video
    assert set(s3.moto.keys(f"jobs/{job_id}/")) == {f"jobs/{folder}/{n}"
                                                   for n in ("video.mp4", "thumbnail.png", "audio.m4a")}
    # The other API replica finds the stored variant (it has no local copy): redirected straight to it.
    moved = requests.get(f"{s3.redirect.base}/v1/videos/{job_id}/content?variant=thumbnail", headers=AUTH,
                         timeout=30, allow_redirects=False)
    assert moved.status_code == 307 and f"/jobs/{folder}/thumbnail.png" in moved.headers["Location"]
    assert requests.get(moved.headers["Location"], timeout=30).content == thumb.content


def test_redirect_to_presigned_url_followed_by_openai_sdk(s3, done_job, tmp_path):
    job_id = done_job["id"]
    expected = requests.get(f"{s3.stream.base}/jobs/{job_id}/content", headers=AUTH, timeout=30).content
    moved = requests.get(f"{s3.redirect.base}/jobs/{job_id}/content", headers=AUTH, timeout=30,
                         allow_redirects=False)
    assert moved.status_code == 307 and moved.headers["Cache-Control"] == "no-store"
    location = moved.headers["Location"]
    assert location.startswith(f"{s3.moto.endpoint}/{s3.moto.bucket}/jobs/{job_id}/attempt-")  # path-style
    assert "X-Amz-Signature=" in location and "X-Amz-Expires=300" in location
    assert s3.moto.secret_key not in location
    direct = requests.get(location, timeout=30)
    assert direct.content == expected and f'filename="{job_id}.mp4"' in direct.headers["Content-Disposition"]
    ranged = requests.get(f"{s3.redirect.base}/jobs/{job_id}/content", headers={**AUTH, "Range": "bytes=0-99"},
                          timeout=30)  # requests follows the 307, keeps Range, drops Authorization (other port)
    assert ranged.status_code == 206 and ranged.content == expected[:100]
    # HEAD and conditional requests are answered by the API itself (a presigned GET URL is not valid for HEAD).
    head = requests.head(f"{s3.redirect.base}/jobs/{job_id}/content", headers=AUTH, timeout=30)
    assert head.status_code == 200 and int(head.headers["Content-Length"]) == len(expected)
    sha = hashlib.sha256(expected).hexdigest()
    assert requests.get(f"{s3.redirect.base}/jobs/{job_id}/content", headers={**AUTH, "If-None-Match": f'"{sha}"'},
                        timeout=30, allow_redirects=False).status_code == 304

    sdk = OpenAI(base_url=f"{s3.redirect.base}/v1", api_key=KEY, max_retries=0, timeout=30)
    out = tmp_path / "sdk.mp4"
    sdk.videos.download_content(job_id).write_to_file(out)  # httpx in the SDK follows redirects
    assert out.read_bytes() == expected



def test_submit_downloads_through_the_redirect(s3, submitted):
    job_id, data = submitted
    assert _decode_frames(data) > 0
    assert hashlib.sha256(data).hexdigest() == s3.r.hget(f"h3b:job:{job_id}", "sha256")


def test_expiry_lazy_and_by_the_garbage_pass(s3, done_job, submitted):
    """Runs after every test that downloads `done_job` (it expires it) and before the delete test (which removes
    the `submitted` job, here a live one)."""
    lazy, live = done_job, {"id": submitted[0]}
    s3.r.hset(f"h3b:job:{lazy['id']}", "expires_at", str(time.time() - 5))
    reply = requests.get(f"{s3.stream.base}/jobs/{lazy['id']}/content", headers=AUTH, timeout=30)
    assert reply.status_code == 410 and reply.json()["error"]["code"] == "artifact_expired"
    assert s3.moto.keys(f"jobs/{lazy['id']}/") == []

    # The garbage pass, as a worker's heartbeat runs it: expires a completed job past expires_at, removes an
    # orphan (no record), prunes a superseded attempt's object of a live job, aborts an abandoned upload. (The
    # worker's own heartbeat may run a pass meanwhile, so the bucket's state is what is checked.)
    store, client, bucket = s3.store(), s3.moto.client(), s3.moto.bucket
    swept = s3.render()
    s3.r.hset(f"h3b:job:{swept['id']}", "expires_at", str(time.time() - 5))
    orphan = "job_" + "0" * 24
    client.put_object(Bucket=bucket, Key=f"jobs/{orphan}/attempt-1/video.mp4", Body=b"x" * 10)
    client.put_object(Bucket=bucket, Key=f"jobs/{live['id']}/attempt-9/video.mp4", Body=b"stale")
    half_key = f"jobs/{live['id']}/attempt-8/video.mp4"
    half = client.create_multipart_upload(Bucket=bucket, Key=half_key)
    client.upload_part(Bucket=bucket, Key=half_key, UploadId=half["UploadId"], PartNumber=1, Body=b"half")
    assert store.head(f"{live['id']}/attempt-8/video.mp4") is None  # an unfinished upload is never readable
    report = reaper.collect_garbage(s3.r, s3.artifacts, orphan_age_s=0, store=store, upload_age_s=0)
    assert orphan in report.removed_objects and report.aborted_uploads >= 1
    assert s3.moto.keys(f"jobs/{swept['id']}/") == [] and s3.moto.keys(f"jobs/{orphan}/") == []
    live_artifact = s3.r.hget(f"h3b:job:{live['id']}", "artifact")
    assert s3.moto.keys(f"jobs/{live['id']}/") == [f"jobs/{live_artifact}"]
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    assert requests.get(f"{s3.stream.base}/jobs/{swept['id']}", headers=AUTH, timeout=60).json()["status"] == "expired"
    assert requests.get(f"{s3.stream.base}/jobs/{live['id']}/content", headers=AUTH, timeout=30).status_code == 200



def test_the_garbage_pass_ages_uploads_by_its_own_clock_and_spares_a_live_attempt(s3):
    """Two unfinished uploads the store says began in 2010 (moto reports one fixed `Initiated` date for every
    upload): the one of an attempt holding its job's lease survives every pass, even at upload age 0; a stranger's
    survives while this service has seen it unfinished for less than the age, and is aborted once it has. (Before,
    the store's date decided: every pass aborted whatever was mid-upload, and the job was rendered twice.)"""
    store, client, bucket = s3.store(), s3.moto.client(), s3.moto.bucket
    live_id, stray_id = "job_" + "1" * 24, "job_" + "2" * 24
    s3.r.hset(f"h3b:job:{live_id}", mapping={"status": "in_progress", "attempt": "3"})
    s3.r.set(f"h3b:lease:{live_id}", "another-worker:3", px=300_000)
    made = {}
    try:
        for job_id, attempt in ((live_id, 3), (stray_id, 1)):
            key = f"jobs/{job_id}/attempt-{attempt}/video.mp4"
            made[job_id] = (key, client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"])
            client.upload_part(Bucket=bucket, Key=key, UploadId=made[job_id][1], PartNumber=1, Body=b"part")

        def unfinished() -> set[str]:
            return {up["UploadId"] for up in client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])}

        ours = {upload_id for _, upload_id in made.values()}
        assert {up["Initiated"].year for up in client.list_multipart_uploads(Bucket=bucket)["Uploads"]
                if up["UploadId"] in ours} == {2010}
        now = time.time()
        reaper.collect_garbage(s3.r, s3.artifacts, orphan_age_s=10**9, store=store, upload_age_s=60, now=now)
        assert ours <= unfinished()  # first seen now: neither is 60 s old by this service's clock
        assert set(s3.r.hkeys("h3b:uploads:seen")) >= ours
        report = reaper.collect_garbage(s3.r, s3.artifacts, orphan_age_s=10**9, store=store, upload_age_s=60,
                                        now=now + 61)
        assert report.aborted_uploads >= 1
        assert made[live_id][1] in unfinished() and made[stray_id][1] not in unfinished()
        reaper.collect_garbage(s3.r, s3.artifacts, orphan_age_s=10**9, store=store, upload_age_s=0, now=now + 62)
        assert made[live_id][1] in unfinished()  # the lease holder's upload, however old
        s3.r.delete(f"h3b:lease:{live_id}")  # its attempt lost the lease: the upload is abandoned
        reaper.collect_garbage(s3.r, s3.artifacts, orphan_age_s=10**9, store=store, upload_age_s=0, now=now + 63)
        assert made[live_id][1] not in unfinished()
    finally:
        for key, upload_id in made.values():
            try:
                client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
            except client.exceptions.NoSuchUpload:
                pass
        s3.r.delete(f"h3b:job:{live_id}", f"h3b:lease:{live_id}")

def test_delete_removes_every_object_of_the_job(s3, submitted):
    job_id, _ = submitted
    requests.get(f"{s3.stream.base}/v1/videos/{job_id}/content?variant=thumbnail", headers=AUTH, timeout=60)
    assert len(s3.moto.keys(f"jobs/{job_id}/")) == 2
    gone = requests.delete(f"{s3.stream.base}/v1/videos/{job_id}", headers=AUTH, timeout=30)
    assert gone.status_code == 200 and gone.json()["deleted"] is True
    assert s3.moto.keys(f"jobs/{job_id}/") == []
    assert requests.get(f"{s3.stream.base}/jobs/{job_id}/content", headers=AUTH, timeout=30).status_code == 404


def test_upload_to_a_refusing_store_leaves_nothing(s3, tmp_path):
    """A failed upload raises StoreUnavailable (the worker then leaves the job to be rendered again) and no object
    or unfinished upload stays behind."""
    local = tmp_path / "clip.mp4"
    local.write_bytes(os.urandom(4096))
    missing = S3Store("s3://no-such-bucket/jobs/", s3.moto.endpoint, client=s3.moto.client())
    with pytest.raises(StoreUnavailable) as caught:
        missing.publish("job_x", 1, local)
    assert "no-such-bucket" in str(caught.value) and s3.moto.secret_key not in str(caught.value)
    assert local.exists()  # kept for the attempt's own clean-up


def _run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(H3BATCH + cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


def test_start_refused_for_a_missing_bucket_or_refused_credentials(s3, tiny_release, tmp_path):  # noqa: F811
    env = service_env(s3.redis_url, tmp_path / "a", **s3.moto.env())
    env["H3BATCH_ARTIFACT_STORE"] = "s3://no-such-bucket/jobs"
    for cmd in (["api", "--port", "1"], ["worker"]):
        done = _run(cmd, {**env, "H3BATCH_RELEASE": str(tiny_release)})
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "H3BATCH_ARTIFACT_STORE" in lines[0] and "no-such-bucket" in lines[0], lines
        assert "does not exist" in lines[0]

    bad = _run(["api"], {**env, "H3BATCH_ARTIFACT_STORE": "s3://Bad_Bucket"})
    assert bad.returncode == 2 and "H3BATCH_ARTIFACT_STORE" in bad.stderr

    checked = MotoServer.start(tmp_path / "moto-auth.log", auth=True)  # moto with IAM checks: keys must be real
    try:
        good_env = service_env(s3.redis_url, tmp_path / "b", **checked.env())
        wrong = "wrong-secret-" + "9" * 20
        for cmd in (["api"], ["worker"]):
            done = _run(cmd, {**good_env, "AWS_SECRET_ACCESS_KEY": wrong, "H3BATCH_RELEASE": str(tiny_release)})
            assert done.returncode == 2, done.stderr
            line = done.stderr.strip()
            assert "\n" not in line and "credentials" in line and "refused" in line, line
            assert wrong not in line and checked.secret_key not in line
        nokeys = {k: v for k, v in good_env.items() if not k.startswith("AWS_")}
        nokeys["AWS_SHARED_CREDENTIALS_FILE"] = nokeys["AWS_CONFIG_FILE"] = str(tmp_path / "none")
        done = _run(["api"], nokeys)
        assert done.returncode == 2 and "no credentials" in done.stderr, done.stderr
        # The real key works against the checking server.
        S3Store(f"s3://{checked.bucket}/", checked.endpoint, client=checked.client()).check()
    finally:
        checked.stop()


def test_upload_failure_mid_job_renders_again_and_completes_once(s3):
    """The store vanishes while a job renders: the upload fails, the job is left to the reaper (not failed), and
    once the store is back the next attempt renders and uploads it; the record names that attempt's object only."""
    reply = requests.post(f"{s3.stream.base}/jobs", json={"prompt": "a kettle whistles", "seconds": 4, **SMALL},
                          headers=AUTH, timeout=60)
    job_id = reply.json()["id"]
    deadline = time.monotonic() + 300
    while s3.r.hget(f"h3b:job:{job_id}", "stage") not in ("denoise", "decode", "mux"):
        assert time.monotonic() < deadline, s3.r.hgetall(f"h3b:job:{job_id}")
        time.sleep(0.05)
    s3.moto.kill()
    try:
        while "upload failed" not in s3.worker.log_text():
            assert time.monotonic() < deadline, s3.r.hgetall(f"h3b:job:{job_id}")
            time.sleep(0.1)
        assert s3.r.hget(f"h3b:job:{job_id}", "status") in ("in_progress", "queued")
    finally:
        s3.moto.restart()
    while s3.r.hget(f"h3b:job:{job_id}", "status") != "completed":
        assert time.monotonic() < deadline, s3.r.hgetall(f"h3b:job:{job_id}")
        assert s3.r.hget(f"h3b:job:{job_id}", "status") in ("in_progress", "queued")
        time.sleep(0.2)
    record = s3.r.hgetall(f"h3b:job:{job_id}")
    assert int(record["attempt"]) >= 2 and record["artifact"] == attempt_key(job_id, int(record["attempt"]))
    assert s3.moto.keys(f"jobs/{job_id}/") == [f"jobs/{record['artifact']}"]
    runs = s3.r.hgetall(f"h3b:runs:{job_id}")
    assert int(runs["rendered"]) == int(record["attempt"]) and int(runs["requeues"]) >= 1
    data = requests.get(f"{s3.stream.base}/jobs/{job_id}/content", headers=AUTH, timeout=30).content
    assert hashlib.sha256(data).hexdigest() == record["sha256"]
    assert "Traceback" not in s3.worker.log_text()


def test_credentials_never_logged(s3, done_job):
    text = s3.logs()
    assert "render completed" in text
    assert s3.moto.secret_key not in text
    assert s3.moto.access_key not in text

