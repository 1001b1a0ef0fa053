"""`h3batch beat`: the single Celery beat for scheduled sweeps, guarded by a Redis lock.

Exactly one beat may run (two would fire every sweep twice). Start-up takes `h3batch:beat:lock` with SET NX and an
expiry (H3BATCH_BEAT_LOCK_TTL_S); a thread renews it every third of the expiry only while this process's token is
still there. A second `h3batch beat` finds the lock held and exits 1 with one line. If the holder dies, the lock
expires and the next beat can start. On exit the lock is released only if it is still ours.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import uuid

import redis

from h3batch.loadrunner.sweep_settings import SweepConfigError, SweepSettings
from h3batch.loadrunner.sweep_spec import parse_sweep_request
from h3batch.loadrunner.sweep_store import BEAT_LOCK_KEY

logger = logging.getLogger("h3batch.loadrunner.beat")

# Compare-and-act scripts: only the holder's token may extend or delete the lock.
_RENEW = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('expire', KEYS[1], ARGV[2]) end return 0"
_RELEASE = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"


class BeatLock:
    """The single-beat lock: `acquire()` once, `renew()` periodically, `release()` at exit."""

    def __init__(self, client: redis.Redis, ttl_s: int, token: str | None = None):
        self.client, self.ttl_s = client, ttl_s
        self.token = token or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"

    def acquire(self) -> bool:
        return bool(self.client.set(BEAT_LOCK_KEY, self.token, nx=True, ex=self.ttl_s))

    def holder(self) -> str | None:
        value = self.client.get(BEAT_LOCK_KEY)
        return value.decode() if isinstance(value, bytes) else value

    def renew(self) -> bool:
        return bool(self.client.eval(_RENEW, 1, BEAT_LOCK_KEY, self.token, self.ttl_s))

    def release(self) -> bool:
        return bool(self.client.eval(_RELEASE, 1, BEAT_LOCK_KEY, self.token))


def _keep_renewing(lock: BeatLock, stop: threading.Event) -> None:
    while not stop.wait(lock.ttl_s / 3):
        try:
            if not lock.renew():
                logger.error("beat lock %s lost to %s; stopping this beat", BEAT_LOCK_KEY, lock.holder())
                os.kill(os.getpid(), signal.SIGTERM)
                return
        except redis.RedisError as exc:
            logger.warning("beat lock renewal failed (%s); retrying", type(exc).__name__)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="h3batch beat", description=__doc__.splitlines()[0])
    parser.add_argument("--loglevel", default="INFO")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=args.loglevel.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        settings = SweepSettings.from_env()
        for entry in settings.schedule:
            parse_sweep_request(entry.sweep)
    except (SweepConfigError, ValueError) as exc:
        print(f"h3batch beat: H3BATCH_SWEEP_SCHEDULE is invalid: {exc}", file=sys.stderr)
        return 2
    client = redis.Redis.from_url(settings.redis_url, socket_connect_timeout=5, decode_responses=True)
    lock = BeatLock(client, settings.beat_lock_ttl_s)
    try:
        acquired = lock.acquire()
    except redis.RedisError as exc:
        print(f"h3batch beat: Redis at H3BATCH_REDIS_URL is unreachable ({type(exc).__name__})", file=sys.stderr)
        return 2
    if not acquired:
        print(f"h3batch beat: another beat instance holds {BEAT_LOCK_KEY} ({lock.holder()}); only one beat may "
              "run, exiting", file=sys.stderr)
        return 1
    stop = threading.Event()
    threading.Thread(target=_keep_renewing, args=(lock, stop), name="beat-lock", daemon=True).start()
    try:
        from h3batch.loadrunner.celery_app import START_SWEEP, app  # noqa: PLC0415

        logger.info("beat lock %s held by %s; %d scheduled sweep(s)", BEAT_LOCK_KEY, lock.token,
                    len(settings.schedule))
        for entry in settings.schedule:
            if entry.run_on_start:
                app.send_task(START_SWEEP, args=[entry.sweep, None, f"schedule:{entry.name}"], queue=settings.queue)
        settings.beat_schedule_file.parent.mkdir(parents=True, exist_ok=True)
        app.Beat(schedule=str(settings.beat_schedule_file), loglevel=args.loglevel.upper(),
                 redirect_stdouts=False).run()
    finally:
        stop.set()
        try:
            lock.release()
        except redis.RedisError:
            logger.warning("could not release %s; it expires in %d s", BEAT_LOCK_KEY, settings.beat_lock_ttl_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
