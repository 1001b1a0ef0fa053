"""`h3batch api [--host H] [--port P] [--dev]`: check the configuration, then serve the API.

Default: exec gunicorn (gthread workers, H3BATCH_API_THREADS threads each, gunicorn's own errors in the JSON
envelope: api/gunicorn_worker.py; real 413s and keep-alive, as in the containers). `--dev` runs Flask's
threaded development server in this process instead. A misconfiguration (bad env value, Redis unreachable,
unwritable artifacts dir) prints one line and exits 2.
"""
from __future__ import annotations

import argparse
import os
import sys

from h3batch.cli_args import OneLineArgumentParser
from h3batch.core.exceptions import ConfigError
from h3batch.core.startup_checks import check_startup
from h3batch.logs import configure_logging
from h3batch.settings import Settings


def _parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(prog="h3batch api", description="Run the h3batch job API.")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1; 0.0.0.0 in containers)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    parser.add_argument("--workers", type=int, default=1, help="gunicorn worker processes (default 1)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads per gunicorn worker (default H3BATCH_API_THREADS, 64)")
    parser.add_argument("--dev", action="store_true", help="Flask development server instead of gunicorn")
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = Settings.from_env()
        check_startup(settings)
    except ConfigError as exc:
        print(f"h3batch api: {exc}", file=sys.stderr)
        return 2
    if not 0 < args.port < 65536:
        print(f"h3batch api: --port: expected 1..65535, found {args.port}", file=sys.stderr)
        return 2
    threads = args.threads if args.threads is not None else settings.api_threads
    if threads < 1:
        print(f"h3batch api: --threads: expected a positive integer, found {threads}", file=sys.stderr)
        return 2
    # The app sizes its wait and stream slots from the thread count (api/slots.py), so it must see the real one.
    os.environ["H3BATCH_API_THREADS"] = str(threads)
    if args.dev:
        configure_logging(settings)
        from h3batch.api import create_app  # noqa: PLC0415

        create_app().run(host=args.host, port=args.port, threaded=True, use_reloader=False)
        return 0
    gunicorn = [sys.executable, "-P", "-m", "h3batch.api.gunicorn_app", "--bind", f"{args.host}:{args.port}",
                "--worker-class", "h3batch.api.gunicorn_worker.JsonErrorThreadWorker", "--workers", str(args.workers),
                "--threads", str(threads),
                # Long-poll waits (?wait=N, at most 60 s) must not trip the worker timeout.
                "--timeout", "90", "--graceful-timeout", "10", "--keep-alive", "5",
                # gunicorn's largest request line (default 4094): longer URLs get the app's JSON errors up to 8 KiB.
                "--limit-request-line", "8190",
                "--log-level", "warning", "h3batch.api.wsgi:app"]
    os.execv(sys.executable, gunicorn)
    return 0  # not reached
