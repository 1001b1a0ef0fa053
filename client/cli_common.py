"""What both `h3batch submit` flows (client/cli.py, one job; client/cli_batch.py, a batch) share on top of
`h3batch.client.Client`: one error shape (`CliError`, one line on stderr, exit 2), the client's exceptions turned
into that line (`refusals`), and the checks that an output file or folder can be written before any work starts.
"""
from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from h3batch.client.errors import (APIError, ConnectionFailed, DownloadError, H3BatchError, InvalidBatch, NotFound,
                                   OriginError)
from h3batch.client.protocol import BatchFileError


class CliError(Exception):
    """One line for stderr; exit code 2."""


class BatchRefused(CliError):
    """422 invalid_batch: one line per bad item (`line N: field: message`)."""

    def __init__(self, message: str, lines: list[str]):
        super().__init__(message)
        self.lines = lines


class Gone(CliError):
    """404 from the API (a batch that was deleted or expired)."""


def detail_text(detail: dict) -> str:
    """`field: message` of one refused line (the server's message often starts with the field already)."""
    field, message = str(detail.get("field") or "body"), str(detail.get("message"))
    return message if message.startswith(field + ":") else f"{field}: {message}"


@contextmanager
def refusals(what: str = "request") -> Iterator[None]:
    """The client's exceptions as one CliError line: `the API refused the <what>: code: message`, a 404 as Gone,
    a refused batch as BatchRefused (one line per bad item), an unreachable API as `cannot reach the API ...`."""
    try:
        yield
    except InvalidBatch as exc:
        lines = [f"line {d.get('line', '?')}: {detail_text(d)}" for d in exc.details if isinstance(d, dict)]
        raise BatchRefused(f"the API refused the batch: {exc.code}: {exc.message}", lines) from None
    except NotFound as exc:
        raise Gone(f"the API refused the {what}: {exc.code}: {exc.message}") from None
    except APIError as exc:
        raise CliError(f"the API refused the {what}: {exc.code}: {exc.message}") from None
    except ConnectionFailed as exc:
        if what == "download":
            cause = type(exc.__cause__).__name__ if exc.__cause__ else "connection lost"
            raise CliError(f"the download broke off ({cause}); re-run to continue") from None
        raise CliError(str(exc)) from None
    except (OriginError, DownloadError, BatchFileError) as exc:
        raise CliError(str(exc)) from None
    except H3BatchError as exc:
        raise CliError(str(exc)) from None


def writable_file(out: Path, flag: str) -> None:
    """CliError naming `flag` unless a file can be written at `out` (its folder made if missing): checked by writing
    and removing a temporary file beside it, so a read-only mount, a missing permission or a path through a file
    is found before any work starts."""
    if out.is_dir():
        raise CliError(f"{flag}: {out} is a folder; name the file to write")
    writable_dir(out.parent, flag)


def writable_dir(folder: Path, flag: str) -> None:
    """CliError naming `flag` unless `folder` exists (or can be made) and a file can be written in it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder, prefix=".h3batch-probe-"):
            pass
    except OSError as exc:
        raise CliError(f"{flag}: cannot write in {folder} ({exc.strerror or type(exc).__name__})") from None
