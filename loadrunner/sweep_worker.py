"""`h3batch sweep-worker`: a concurrency-1 Celery worker consuming only the sweep queue (points run serially)."""
from __future__ import annotations

import socket
import sys

import redis

from h3batch.loadrunner.sweep_settings import SweepConfigError, SweepSettings


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        settings = SweepSettings.from_env()
        redis.Redis.from_url(settings.redis_url, socket_connect_timeout=5).ping()
    except SweepConfigError as exc:
        print(f"h3batch sweep-worker: {exc}", file=sys.stderr)
        return 2
    except redis.RedisError as exc:
        print(f"h3batch sweep-worker: Redis at H3BATCH_REDIS_URL is unreachable ({type(exc).__name__})",
              file=sys.stderr)
        return 2
    from h3batch.loadrunner.celery_app import app  # noqa: PLC0415

    app.worker_main(["worker", "--queues", settings.queue, "--concurrency", "1", "--pool", "solo",
                     "--loglevel", "INFO", "--hostname", f"loadrunner@{socket.gethostname()}", *argv])
    return 0


if __name__ == "__main__":
    sys.exit(main())
