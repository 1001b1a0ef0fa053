"""The `h3batch` command: one subcommand per job, each importing its room lazily so `h3batch api` never loads torch."""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from worker.cli import main as _main  # noqa: PLC0415  (lazy: keeps `h3batch --help` fast)

    return _main(argv)


if __name__ == "__main__":
    sys.exit(main())
