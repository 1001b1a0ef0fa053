"""`h3batch worker [--queues Q,...] [--name NAME]`: check config, load the model once, consume the render queues of
what this worker serves (core/routing.py: its tasks and precision, every size step up to its `max_rows`).

The model is loaded in this process before Celery starts, and Celery runs the `solo` pool, so jobs run in the very
process that holds the weights: no fork after CUDA init, no reload per job (spec §3 pitfalls 4 and 5). Bad
configuration or a release that fails its contract check prints one line and exits 2.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from h3batch.cli_args import OneLineArgumentParser
from h3batch.core import defaults
from h3batch.core.exceptions import ConfigError
from h3batch.core.startup_checks import check_startup
from h3batch.logs import configure_logging
from h3batch.settings import Settings
from h3batch.worker import watchdog
from h3batch.worker.watchdog import WatchdogConfig

log = logging.getLogger("h3batch.worker")


def _parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(prog="h3batch worker", description="Run a GPU render worker (Celery, solo pool).")
    parser.add_argument("--queues", default=None,
                        help="comma-separated queues (default: this worker's capability queues, "
                             "render.<task>.<precision>.<rows step>; naming others overrides routing)")
    parser.add_argument("--name", default=None, help="worker name (default: H3BATCH_WORKER_NAME or hostname-pid)")
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = Settings.from_env()
        if args.name:
            os.environ["H3BATCH_WORKER_NAME"] = args.name  # so a lazily built Settings agrees
            settings = Settings.from_env()
        stall_watch = WatchdogConfig.from_env()
        check_startup(settings, release=True)
    except ConfigError as exc:
        print(f"h3batch worker: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings)
    # Progress bars of model downloads/loads are noise between structured log lines.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")
    from h3batch.worker.resident import load_resident, mark_ready, shutdown_resident  # noqa: PLC0415  (torch on load)

    # Until Celery installs its own handlers, SIGTERM/SIGINT must still run the cleanup below (heartbeat key).
    signal.signal(signal.SIGTERM, _exit_on_signal)
    try:
        try:
            load_resident(settings, ready=False)
        except ValueError as exc:  # the contract check, or a capability it cannot serve: one line naming the field
            where = "" if str(exc).startswith("H3BATCH_") else f"H3BATCH_RELEASE {str(settings.release_dir)!r}: "
            print(f"h3batch worker: {where}{exc}", file=sys.stderr)
            return 2
        except OSError as exc:
            print(f"h3batch worker: could not load the release {str(settings.release_dir)!r}: {exc}",
                  file=sys.stderr)
            return 2

        from celery.signals import worker_ready  # noqa: PLC0415

        from h3batch.core.celery_app import make_celery  # noqa: PLC0415

        # READY in the heartbeat (what /readyz counts) only once the consumer is actually taking messages.
        worker_ready.connect(lambda **_: mark_ready(), weak=False)
        celery = make_celery(settings.redis_url, max_run_s=settings.max_run_s, include_tasks=True)
        resident = load_resident(settings)  # already loaded above: the same object
        from h3batch.worker import job_logs  # noqa: PLC0415

        job_logs.install(resident.r, settings.result_ttl_s + defaults.RECORD_GRACE_S)  # GET /jobs/{id}/logs
        named = resident.capability.queues() if args.queues is None else args.queues.split(",")
        queues = ",".join(q.strip() for q in named if q.strip())
        watchdog.start(resident.r, settings.worker_name, queues.split(","), lambda: resident.heartbeat.state,
                       stall_watch)
        log.info("worker starting consumer queues=%s name=%s", queues, settings.worker_name,
                 extra={"capability": resident.capability.as_json()})
        # Celery's event heartbeat stays on so Flower lists the worker; under the solo pool it pauses while a job
        # renders (Flower shows the node offline then). Liveness is h3batch's own heartbeat key, never this one.
        celery.worker_main(["--quiet", "worker", "--pool", "solo", "--concurrency", "1", "--queues", queues,
                            "--hostname", f"{settings.worker_name}@h3batch", "--loglevel", settings.log_level,
                            "--without-gossip", "--without-mingle"])
    except SystemExit as exc:
        return int(exc.code or 0)
    except KeyboardInterrupt:
        return 130
    finally:
        shutdown_resident()
        log.info("worker stopped", extra={"worker": settings.worker_name})
    return 0


def _exit_on_signal(signum, _frame) -> None:
    raise SystemExit(128 + signum)
