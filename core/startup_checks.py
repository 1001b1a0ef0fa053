"""Start-up checks shared by `h3batch api`, `h3batch worker` and `h3batch serve`: Redis reachable, artifacts dir
writable, the object store's bucket there and the credentials accepted (H3BATCH_ARTIFACT_STORE=s3://...), release
present. Each raises ConfigError with one line naming what was expected and what was found; the
commands print it and exit 2 before serving anything.
"""
from __future__ import annotations

from pathlib import Path

from h3batch.core.artifact_store import LocalStore, open_store
from h3batch.settings import ConfigError, Settings, is_hub_release


def redacted_url(url: str) -> str:
    """The Redis URL without its password, for messages and logs."""
    from urllib.parse import urlsplit, urlunsplit  # noqa: PLC0415

    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def check_redis(url: str, timeout_s: float = 3.0) -> None:
    """Raise ConfigError unless a Redis answers PING at `url`."""
    import redis  # noqa: PLC0415

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
    except ValueError as exc:
        raise ConfigError(f"H3BATCH_REDIS_URL: expected redis://host:port/db, found {redacted_url(url)!r} ({exc})")
    try:
        client.ping()
    except redis.exceptions.RedisError as exc:
        raise ConfigError(f"H3BATCH_REDIS_URL: Redis at {redacted_url(url)} is not reachable "
                          f"({type(exc).__name__}: {exc})") from None
    finally:
        client.close()


def check_artifacts_dir(path: Path) -> None:
    """Create the artifacts dir if needed and prove it is writable; ConfigError otherwise."""
    LocalStore(path).check()


def check_release_dir(release: str | Path) -> None:
    """Cheap presence check before the pipeline's own contract check (which names the failing field). A Hub
    reference passes: the worker fetches it (or names repo and revision when it cannot)."""
    if is_hub_release(str(release)):
        return
    path = Path(release)
    if not path.is_dir():
        raise ConfigError(f"H3BATCH_RELEASE: expected a release directory, found {str(path)!r} (no such directory; "
                          f"build the tiny one with `h3batch build-tiny --out {path}`)")


def check_startup(settings: Settings, *, release: bool = False) -> None:
    """Every check a serving process makes before it starts: Redis, the artifact store (the artifacts dir, or the
    bucket plus, for workers, the artifacts dir as render scratch space), and (workers) the release."""
    check_redis(settings.redis_url)
    if not settings.artifact_store or release:
        check_artifacts_dir(settings.artifacts_dir)
    if settings.artifact_store:
        open_store(settings).check()
    if release:
        check_release_dir(settings.release_dir)
