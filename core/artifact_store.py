"""Where finished MP4s (and their thumbnail/audio variants) live: the local artifacts directory or an S3 bucket.

Both the API (serves, deletes, expires) and the worker (publishes, collects garbage) stand on one small interface,
chosen by H3BATCH_ARTIFACT_STORE (`open_store(settings)`):

- `LocalStore`: `<H3BATCH_ARTIFACTS_DIR>/<job id>/video.mp4`, as before (the API and workers share one volume).
- `S3Store`: `s3://BUCKET/PREFIX<job id>/attempt-<n>/video.mp4` through boto3, path-style addressing when
  H3BATCH_S3_ENDPOINT_URL names a non-AWS endpoint; credentials and region come from the standard AWS variables,
  which boto3 reads itself (they never pass through h3batch's settings, messages or logs).

Keys: a *key* here is relative to the store (`<job id>/...`); the job record's `artifact` field holds the key of
its MP4. In S3 the key names the attempt that uploaded it, so exactly-once completion needs no copy: the attempt
uploads with a multipart upload (S3 makes the object visible only when CompleteMultipartUpload succeeds, so a
half-uploaded object is never readable), confirms it with HEAD (size and SHA-256 metadata), and only then does the
`completed` compare-and-set on (in_progress, attempt) name that key. A losing or crashed attempt's key is referenced
by no record; `clean_up`, the next attempt's claim and the reaper's garbage pass delete it.

Reads are kept plain for every consumer (content downloads, variants, archives): `head(key)` for size/ETag,
`reader(key)` for a seekable, lazily opened byte stream, `iter_bytes(key, start, end)` for a range in chunks.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from h3batch.core import defaults
from h3batch.settings import ConfigError, Settings

log = logging.getLogger("h3batch.store")

VIDEO_NAME = "video.mp4"


class StoreUnavailable(RuntimeError):
    """The object store refused or did not answer (network, throttling, permissions). Retryable: the job is
    re-rendered (worker) or the request answered 503 (API). The message never carries credentials."""


class UploadNotConfirmed(StoreUnavailable):
    """The uploaded object's HEAD did not show what was sent (size): it is deleted and never referenced."""


@dataclass(frozen=True)
class StoredObject:
    """One stored file: its key (relative to the store), size, the backend's ETag and last change (Unix time)."""

    key: str
    size: int
    etag: str
    modified: float
    sha256: str | None = None
    """The content's SHA-256 where the store keeps it (S3 objects h3batch uploaded: `x-amz-meta-sha256`)."""


@dataclass
class JobObjects:
    """Everything the store holds for one job id (for garbage collection)."""

    keys: list[str] = field(default_factory=list)
    newest: float = 0.0


class ArtifactStore(Protocol):
    kind: str

    def check(self) -> None: ...
    def publish(self, job_id: str, attempt: int, rendered: Path, sha256: str | None = None) -> StoredObject: ...
    def put_file(self, local: Path, key: str, media_type: str, sha256: str | None = None) -> StoredObject: ...
    def head(self, key: str) -> StoredObject | None: ...
    def reader(self, key: str, size: int) -> BinaryIO: ...
    def iter_bytes(self, key: str, start: int = 0, end: int | None = None) -> Iterator[bytes]: ...
    def download(self, key: str, target: Path) -> Path: ...
    def local_path(self, key: str) -> Path | None: ...
    def presigned_url(self, key: str, *, filename: str, media_type: str,
                      expires_s: int = defaults.PRESIGNED_URL_TTL_S) -> str | None: ...
    def delete_job(self, job_id: str) -> int: ...
    def delete_attempt(self, job_id: str, attempt: int) -> int: ...
    def remove_stale_attempts(self, job_id: str, attempt: int) -> list[str]: ...


INPUTS_DIR = "inputs"
"""A job's input images (fl2va keyframes, ref2va references) live under `<job id>/inputs/` in both stores, beside
its video; they go with the job (delete_job) and outlive any one attempt."""


def input_key(job_id: str, name: str) -> str:
    return f"{job_id}/{INPUTS_DIR}/{name}"


def is_input_key(key: str) -> bool:
    parts = key.split("/")
    return len(parts) == 3 and parts[1] == INPUTS_DIR


def sibling(key: str, name: str) -> str:
    """The key of `name` beside `key` (a variant next to its MP4, in the same attempt's folder)."""
    head, _, _ = key.rpartition("/")
    return f"{head}/{name}" if head else name


def attempt_key(job_id: str, attempt: int, name: str = VIDEO_NAME) -> str:
    """Key an S3 attempt uploads its MP4 to: `<job id>/attempt-<n>/video.mp4`."""
    return f"{job_id}/attempt-{attempt}/{name}"


def attempt_of(key: str) -> int | None:
    """The attempt number in a key `<job>/attempt-<n>/...`, None for any other key."""
    parts = key.split("/")
    if len(parts) >= 3 and parts[1].startswith("attempt-") and parts[1][len("attempt-"):].isdigit():
        return int(parts[1][len("attempt-"):])
    return None


# --- local directory ---------------------------------------------------------------------------------------------

class LocalStore:
    """The artifacts directory: `<root>/<job id>/video.mp4` (+ variants beside it). Publishing is `os.replace` of
    the attempt's file (core/lease.py checks the lease first); reads are plain files (the API uses `send_file`)."""

    kind = "local"

    def __init__(self, root: Path):
        self.root = Path(root)

    def check(self) -> None:
        """Create the directory if needed and prove it is writable; ConfigError otherwise."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f".write-probe-{os.getpid()}"
            probe.write_bytes(b"ok")
            probe.unlink()
        except OSError as exc:
            raise ConfigError(f"H3BATCH_ARTIFACTS_DIR: expected a writable directory, found {str(self.root)!r} "
                              f"({exc.strerror or exc})") from None

    def publish(self, job_id: str, attempt: int, rendered: Path, sha256: str | None = None) -> StoredObject:
        final = self.root / job_id / VIDEO_NAME
        os.replace(rendered, final)
        _fsync_dir(final.parent)  # a crash right after `completed` must not lose the directory entry
        return self._stat(f"{job_id}/{VIDEO_NAME}", final)

    def put_file(self, local: Path, key: str, media_type: str, sha256: str | None = None) -> StoredObject:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        if Path(local) != target:
            os.replace(local, target)
        return self._stat(key, target)

    def head(self, key: str) -> StoredObject | None:
        path = self.local_path(key)
        return self._stat(key, path) if path is not None and path.is_file() else None

    def reader(self, key: str, size: int) -> BinaryIO:
        return self._path(key).open("rb")

    def iter_bytes(self, key: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        with self._path(key).open("rb") as f:
            f.seek(start)
            left = None if end is None else end - start
            while left is None or left > 0:
                chunk = f.read(defaults.STORE_CHUNK_BYTES if left is None else min(left, defaults.STORE_CHUNK_BYTES))
                if not chunk:
                    return
                if left is not None:
                    left -= len(chunk)
                yield chunk

    def download(self, key: str, target: Path) -> Path:
        shutil.copyfile(self._path(key), target)
        return target

    def local_path(self, key: str) -> Path | None:
        """The file of `key`, None when the key would leave the root (`..`, absolute)."""
        root = self.root.resolve()
        path = (root / key).resolve()
        return path if root in path.parents else None

    def presigned_url(self, key: str, *, filename: str, media_type: str,
                      expires_s: int = defaults.PRESIGNED_URL_TTL_S) -> str | None:
        return None  # files are only reachable through the API

    def delete_job(self, job_id: str) -> int:
        shutil.rmtree(self.root / job_id, ignore_errors=True)
        return 1

    def delete_attempt(self, job_id: str, attempt: int) -> int:
        (self.root / job_id / f".attempt-{attempt}.mp4").unlink(missing_ok=True)
        return 1

    def remove_stale_attempts(self, job_id: str, attempt: int) -> list[str]:
        return []  # core/lease.remove_stale_attempts handles the directory (it is also every worker's scratch)

    def _path(self, key: str) -> Path:
        path = self.local_path(key)
        if path is None:
            raise FileNotFoundError(key)
        return path

    @staticmethod
    def _stat(key: str, path: Path) -> StoredObject:
        st = path.stat()
        return StoredObject(key=key, size=st.st_size, etag=f"{st.st_mtime_ns:x}-{st.st_size:x}",
                            modified=st.st_mtime)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# --- S3-compatible object storage --------------------------------------------------------------------------------

class S3Store:
    """Objects under `s3://bucket/prefix`. Every boto3 error leaves as StoreUnavailable (retryable) or, for a
    missing key, as None / FileNotFoundError; `check()` turns the start-up failures into one-line ConfigErrors."""

    kind = "s3"

    def __init__(self, url: str, endpoint_url: str | None = None, *, client: Any = None):
        self.url = url
        self.bucket, _, self.prefix = url[len("s3://"):].partition("/")
        self.endpoint_url = endpoint_url
        self._client = client
        self._lock = threading.Lock()

    @property
    def client(self):
        """The boto3 S3 client, made on first use (thread-safe once made; boto3 reads AWS_* itself)."""
        if self._client is None:
            with self._lock:
                if self._client is None:
                    import boto3  # noqa: PLC0415  (only with an s3:// store)
                    from botocore.config import Config  # noqa: PLC0415

                    config = Config(signature_version="s3v4", connect_timeout=5, read_timeout=60,
                                    retries={"max_attempts": 4, "mode": "standard"},
                                    s3={"addressing_style": "path" if self.endpoint_url else "auto"})
                    self._client = boto3.session.Session().client("s3", endpoint_url=self.endpoint_url,
                                                                  config=config)
        return self._client

    def _key(self, key: str) -> str:
        return self.prefix + key

    def _where(self) -> str:
        return f"s3://{self.bucket}" + (f" at {self.endpoint_url}" if self.endpoint_url else "")

    def _unavailable(self, what: str, exc: Exception) -> StoreUnavailable:
        return StoreUnavailable(f"object store {self._where()}: {what} failed ({_error_text(exc)})")

    # start-up ---------------------------------------------------------------------------------------------------

    def check(self) -> None:
        """HEAD the bucket; ConfigError (one line, naming the variable, never a secret) when it is missing, the
        credentials are refused or absent, or the endpoint does not answer."""
        from botocore import exceptions as bex  # noqa: PLC0415

        var = "H3BATCH_ARTIFACT_STORE"
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except bex.NoCredentialsError:
            raise ConfigError(f"{var}: no credentials for {self._where()}: set AWS_ACCESS_KEY_ID and "
                              f"AWS_SECRET_ACCESS_KEY") from None
        except bex.ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("404", "NoSuchBucket") or status == 404:
                raise ConfigError(f"{var}: bucket {self.bucket!r} does not exist at "
                                  f"{self.endpoint_url or 'AWS S3'} (create it first)") from None
            if code in ("403", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied") or status == 403:
                raise ConfigError(f"{var}: the credentials in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY were "
                                  f"refused by {self._where()} (HTTP {status} {code})") from None
            raise ConfigError(f"{var}: {self._where()} answered HEAD bucket with HTTP {status} {code}") from None
        except (bex.EndpointConnectionError, bex.ConnectTimeoutError, bex.ReadTimeoutError) as exc:
            raise ConfigError(f"H3BATCH_S3_ENDPOINT_URL: {self.endpoint_url or 'AWS S3'} is not reachable "
                              f"({type(exc).__name__})") from None
        except (bex.BotoCoreError, ValueError) as exc:
            raise ConfigError(f"{var}: {self._where()} cannot be used ({_error_text(exc)})") from None

    # writes -----------------------------------------------------------------------------------------------------

    def publish(self, job_id: str, attempt: int, rendered: Path, sha256: str | None = None) -> StoredObject:
        """Upload the attempt's MP4 to its own key with a multipart upload, confirm it by HEAD, remove the local
        file. Raises StoreUnavailable / UploadNotConfirmed (nothing is then referenced)."""
        stored = self.put_file(rendered, attempt_key(job_id, attempt), "video/mp4", sha256)
        rendered.unlink(missing_ok=True)
        try:
            rendered.parent.rmdir()  # the worker's scratch folder of the job, when nothing else is in it
        except OSError:
            pass
        return stored

    def put_file(self, local: Path, key: str, media_type: str, sha256: str | None = None) -> StoredObject:
        """Multipart upload of `local` to `key` (parts of STORE_PART_BYTES, each checksummed by botocore; aborted on
        any error, so no parts linger), then HEAD: the object must show the size sent and the SHA-256 it carries as
        metadata (`x-amz-meta-sha256`), or it is deleted and UploadNotConfirmed raised. `sha256`: the file's digest
        when the caller has it already (the worker does), so the file is not read twice."""
        size = Path(local).stat().st_size
        digest = sha256 or sha256_file(Path(local))
        full = self._key(key)
        c = self.client
        try:
            upload = c.create_multipart_upload(Bucket=self.bucket, Key=full, ContentType=media_type,
                                               Metadata={"sha256": digest})
        except Exception as exc:  # noqa: BLE001  (botocore's errors, network)
            raise self._unavailable(f"starting the upload of {key}", exc) from None
        upload_id = upload["UploadId"]
        try:
            parts = []
            with Path(local).open("rb") as f:
                number = 1
                while True:
                    chunk = f.read(defaults.STORE_PART_BYTES)
                    if not chunk and parts:
                        break
                    part = c.upload_part(Bucket=self.bucket, Key=full, UploadId=upload_id, PartNumber=number,
                                         Body=chunk)
                    parts.append({"PartNumber": number, "ETag": part["ETag"]})
                    number += 1
                    if len(chunk) < defaults.STORE_PART_BYTES:
                        break
            c.complete_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload_id,
                                        MultipartUpload={"Parts": parts})
        except Exception as exc:  # noqa: BLE001
            try:
                c.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload_id)
            except Exception:  # noqa: BLE001  (the garbage pass aborts what is left)
                pass
            raise self._unavailable(f"uploading {key}", exc) from None
        stored = self.head(key)
        if stored is None or stored.size != size or stored.sha256 not in (digest, None):
            self._delete([full])
            shown = "nothing" if stored is None else f"{stored.size} bytes, sha256 {stored.sha256}"
            raise UploadNotConfirmed(f"object store {self._where()}: {key} shows {shown} after uploading {size} "
                                     f"bytes, sha256 {digest}")
        log.debug("uploaded key=%s bytes=%d parts=%d", key, size, len(parts))
        return stored

    # reads ------------------------------------------------------------------------------------------------------

    def head(self, key: str) -> StoredObject | None:
        from botocore import exceptions as bex  # noqa: PLC0415

        try:
            meta = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except bex.ClientError as exc:
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                return None
            raise self._unavailable(f"HEAD {key}", exc) from None
        except bex.BotoCoreError as exc:
            raise self._unavailable(f"HEAD {key}", exc) from None
        return StoredObject(key=key, size=int(meta["ContentLength"]), etag=str(meta.get("ETag", "")).strip('"'),
                            modified=meta["LastModified"].timestamp(),
                            sha256=(meta.get("Metadata") or {}).get("sha256"))

    def reader(self, key: str, size: int) -> BinaryIO:
        return _S3Reader(self, key, size)

    def _get(self, key: str, start: int, end: int | None):
        """The streaming body of bytes start..end-1 (end None: to the end)."""
        from botocore import exceptions as bex  # noqa: PLC0415

        rng = f"bytes={start}-" if end is None else f"bytes={start}-{end - 1}"
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key), Range=rng)["Body"]
        except bex.ClientError as exc:
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                raise FileNotFoundError(key) from None
            raise self._unavailable(f"GET {key}", exc) from None
        except bex.BotoCoreError as exc:
            raise self._unavailable(f"GET {key}", exc) from None

    def iter_bytes(self, key: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        if end is not None and end <= start:
            return
        body = self._get(key, start, end)
        try:
            yield from body.iter_chunks(defaults.STORE_CHUNK_BYTES)
        finally:
            body.close()

    def download(self, key: str, target: Path) -> Path:
        with Path(target).open("wb") as f:
            for chunk in self.iter_bytes(key):
                f.write(chunk)
        return target

    def local_path(self, key: str) -> Path | None:
        return None

    def presigned_url(self, key: str, *, filename: str, media_type: str,
                      expires_s: int = defaults.PRESIGNED_URL_TTL_S) -> str | None:
        """A GET URL for `key` valid `expires_s` seconds, on the configured endpoint (the client must reach it),
        answering with the download name and media type the API would send."""
        try:
            return self.client.generate_presigned_url(
                "get_object", ExpiresIn=expires_s,
                Params={"Bucket": self.bucket, "Key": self._key(key), "ResponseContentType": media_type,
                        "ResponseContentDisposition": f'attachment; filename="{filename}"'})
        except Exception as exc:  # noqa: BLE001
            raise self._unavailable(f"presigning {key}", exc) from None

    # deletes and listing ----------------------------------------------------------------------------------------

    def list_keys(self, under: str = "") -> Iterator[tuple[str, float]]:
        """(key, last modified) of every object under `under` (relative), page by page."""
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket,
                                                                          Prefix=self._key(under))
            for page in pages:
                for obj in page.get("Contents", []):
                    yield obj["Key"][len(self.prefix):], obj["LastModified"].timestamp()
        except Exception as exc:  # noqa: BLE001
            raise self._unavailable(f"listing {under or '/'}", exc) from None

    def list_jobs(self) -> dict[str, JobObjects]:
        """Every job id with objects in the store, with its keys and newest change (the garbage pass's view)."""
        found: dict[str, JobObjects] = {}
        for key, modified in self.list_keys():
            job_id = key.split("/", 1)[0]
            entry = found.setdefault(job_id, JobObjects())
            entry.keys.append(key)
            entry.newest = max(entry.newest, modified)
        return found

    def _delete(self, full_keys: list[str]) -> int:
        for i in range(0, len(full_keys), 1000):  # DeleteObjects takes at most 1000 keys
            batch = full_keys[i:i + 1000]
            try:
                self.client.delete_objects(Bucket=self.bucket,
                                           Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True})
            except Exception as exc:  # noqa: BLE001
                raise self._unavailable("deleting objects", exc) from None
        return len(full_keys)

    def delete_keys(self, keys: list[str]) -> int:
        return self._delete([self._key(k) for k in keys])

    def delete_job(self, job_id: str) -> int:
        """Remove every object of the job (all attempts, variants); returns how many."""
        return self.delete_keys([k for k, _ in self.list_keys(f"{job_id}/")])

    def delete_attempt(self, job_id: str, attempt: int) -> int:
        return self.delete_keys([k for k, _ in self.list_keys(f"{job_id}/attempt-{attempt}/")])

    def remove_stale_attempts(self, job_id: str, attempt: int) -> list[str]:
        """Objects earlier attempts of this job uploaded but never completed with (a worker killed between upload
        and `completed`): no record names them."""
        stale = [k for k, _ in self.list_keys(f"{job_id}/") if (attempt_of(k) or attempt) < attempt]
        self.delete_keys(stale)
        return stale

    def incomplete_uploads(self) -> list[tuple[str, str]]:
        """(key, upload id) of every multipart upload under the prefix that was neither completed nor aborted (a
        worker killed mid-upload leaves its parts). Their `Initiated` times are not returned on purpose: the store's
        clock is not this service's (moto's server reports one fixed date for every upload), so the garbage pass
        ages uploads by when it first saw them (worker/reaper.py)."""
        found: list[tuple[str, str]] = []
        try:
            pages = self.client.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket,
                                                                                 Prefix=self.prefix)
            for page in pages:
                found.extend((up["Key"][len(self.prefix):], up["UploadId"]) for up in page.get("Uploads", []))
        except Exception as exc:  # noqa: BLE001
            raise self._unavailable("listing unfinished uploads", exc) from None
        return found

    def abort_upload(self, key: str, upload_id: str) -> bool:
        """Abort one multipart upload (its parts go); False when it had already ended (completed or aborted)."""
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=self._key(key), UploadId=upload_id)
        except Exception as exc:  # noqa: BLE001
            if _error_code(exc) == "NoSuchUpload":
                return False
            raise self._unavailable(f"aborting the upload of {key}", exc) from None
        return True


class _S3Reader:
    """A read-only, seekable file over one object: each seek-then-read opens one ranged GET from there to the
    end, read lazily (so HEAD, 304 and 416 answers never fetch the object)."""

    def __init__(self, store: S3Store, key: str, size: int):
        self.store, self.key, self.size = store, key, size
        self.pos = 0
        self._body = None

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        target = {0: offset, 1: self.pos + offset, 2: self.size + offset}[whence]
        if target != self.pos:
            self._close_body()
        self.pos = max(0, target)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        if self.pos >= self.size:
            return b""
        if self._body is None:
            self._body = self.store._get(self.key, self.pos, None)
        data = self._body.read() if n is None or n < 0 else self._body.read(n)
        self.pos += len(data)
        return data

    def _close_body(self) -> None:
        if self._body is not None:
            self._body.close()
            self._body = None

    def close(self) -> None:
        self._close_body()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _error_text(exc: Exception) -> str:
    """What went wrong, without anything secret: botocore's error code and HTTP status, or the exception type."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        err = response.get("Error", {})
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return f"HTTP {status} {err.get('Code', '')}".strip()
    return type(exc).__name__



def _error_code(exc: Exception) -> str | None:
    """botocore's error code (`NoSuchUpload`, `NoSuchKey`, ...), None for any other exception."""
    response = getattr(exc, "response", None)
    return response.get("Error", {}).get("Code") if isinstance(response, dict) else None

# --- selection -----------------------------------------------------------------------------------------------------

_OPEN: dict[tuple[str, str, str | None], ArtifactStore] = {}
_OPEN_LOCK = threading.Lock()


def open_store(settings: Settings) -> ArtifactStore:
    """The store H3BATCH_ARTIFACT_STORE selects (one per process and configuration: boto3 clients are reused)."""
    return store_for(settings.artifact_store, settings.s3_endpoint_url, settings.artifacts_dir)


def store_for(url: str, endpoint_url: str | None, artifacts_dir: Path | str) -> ArtifactStore:
    """`S3Store(url)` for an `s3://` URL, else `LocalStore(artifacts_dir)`; one object per configuration."""
    ident = (url or "", str(artifacts_dir), endpoint_url)
    with _OPEN_LOCK:
        store = _OPEN.get(ident)
        if store is None:
            store = S3Store(url, endpoint_url) if url else LocalStore(Path(artifacts_dir))
            _OPEN[ident] = store
        return store
