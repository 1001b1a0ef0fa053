"""`h3batch beat`: the single Celery beat for scheduled sweeps, guarded by a Redis lock.

Exactly one beat may run (two would fire every sweep twice). Start-up takes `h3batch:beat:lock`, a redis-py `Lock`
with an expiry (H3BATCH_BEAT_LOCK_TTL_S) whose token names the holder (host:pid:random); a thread resets the expiry
every third of it while the token is still ours (`Lock.reacquire`). A second `h3batch beat` finds the lock held and
exits 1 with one line naming the holder. If the holder dies, the lock expires and the next beat can start. On exit
the lock is released only if it is still ours.
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
from redis.exceptions import LockNotOwnedError
from redis.lock import Lock

from h3batch.loadrunner.sweep_settings import SweepConfigError, SweepSettings
from h3batch.loadrunner.sweep_spec import parse_sweep_request
from h3batch.loadrunner.sweep_store import BEAT_LOCK_KEY

logger = logging.getLogger("h3batch.loadrunner.beat")


def beat_lock(client: redis.Redis, ttl_s: int) -> Lock:
    """The single-beat lock; not thread-local, so the renewing thread sees the token the main thread took it with."""
    return Lock(client, BEAT_LOCK_KEY, timeout=ttl_s, blocking=False, thread_local=False)


def _keep_renewing(lock: Lock, stop: threading.Event) -> None:
    while not stop.wait(lock.timeout / 3):
        try:
            lock.reacquire()
        except LockNotOwnedError:
            logger.error("beat lock %s lost to %s; stopping this beat", BEAT_LOCK_KEY, lock.redis.get(BEAT_LOCK_KEY))
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
    lock = beat_lock(client, settings.beat_lock_ttl_s)
    token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    try:
        acquired = lock.acquire(token=token)
    except redis.RedisError as exc:
        print(f"h3batch beat: Redis at H3BATCH_REDIS_URL is unreachable ({type(exc).__name__})", file=sys.stderr)
        return 2
    if not acquired:
        print(f"h3batch beat: another beat instance holds {BEAT_LOCK_KEY} ({client.get(BEAT_LOCK_KEY)}); only one "
              "beat may run, exiting", file=sys.stderr)
        return 1
    stop = threading.Event()
    threading.Thread(target=_keep_renewing, args=(lock, stop), name="beat-lock", daemon=True).start()
    try:
        from h3batch.loadrunner.celery_app import START_SWEEP, app  # noqa: PLC0415

        logger.info("beat lock %s held by %s; %d scheduled sweep(s)", BEAT_LOCK_KEY, token,
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
        except LockNotOwnedError:
            logger.warning("beat lock %s was no longer ours at exit; left as it is", BEAT_LOCK_KEY)
        except redis.RedisError:
            logger.warning("could not release %s; it expires in %d s", BEAT_LOCK_KEY, settings.beat_lock_ttl_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
