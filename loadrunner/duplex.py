"""`h3batch duplex` / `python -m h3batch.loadrunner.duplex`: the full-duplex driver entry point (spec §12).

Exit status: 0 lifecycle success or load ok; 1 load not ok (report printed first) or any failure; 2 bad arguments.
"""
from __future__ import annotations

import asyncio
import json
import logging
import sys

from h3batch.loadrunner.config import parse_config

logger = logging.getLogger("h3batch.loadrunner.duplex")


def main(argv: list[str] | None = None) -> int:
    config = parse_config(list(sys.argv[1:] if argv is None else argv))  # exits 2 on bad arguments
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    try:
        import websockets  # noqa: F401  (a clear line instead of an ImportError traceback)
    except ImportError:
        print("Install websockets first: pip install websockets", file=sys.stderr)
        return 1
    from h3batch.loadrunner.lifecycle import run_lifecycle
    from h3batch.loadrunner.load import run_load

    try:
        if config.sessions is None:
            result = asyncio.run(run_lifecycle(config))
        else:
            result = asyncio.run(run_load(config))
    except KeyboardInterrupt:
        print("interrupted; no load report written", file=sys.stderr)
        return 130
    except Exception as exc:  # one line, never a traceback (load-mode session errors are rows, not exceptions)
        print(f"h3batch duplex: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2, ensure_ascii=False, allow_nan=False))
    if config.sessions is not None and result.get("ok") is not True:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
