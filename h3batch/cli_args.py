"""The one argparse parser every h3batch command uses: a bad argument prints one line and exits 2.

argparse's own `error` prints the whole usage block before the message; the CLI contract is a single line on stderr
(`h3batch render: --seconds: expected ...`) and exit status 2, so scripts can show the line as it is.
"""
from __future__ import annotations

import argparse
import sys


class OneLineArgumentParser(argparse.ArgumentParser):
    """ArgumentParser whose errors are `PROG: MESSAGE` on stderr and exit status 2."""

    def error(self, message: str):  # type: ignore[override]
        print(f"{self.prog}: {message}", file=sys.stderr)
        raise SystemExit(2)


def fail(prog: str, message: str) -> "NoReturn":  # noqa: F821  (typing only)
    """Exit 2 with one line, for checks made after parsing (a missing file, an unreachable Redis)."""
    print(f"{prog}: {message}", file=sys.stderr)
    raise SystemExit(2)
