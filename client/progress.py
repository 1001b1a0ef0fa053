"""The one progress bar of a job, for `h3batch submit` and `h3batch demo` alike: tqdm, 0..100 %, labelled with the
job id and its stage (`queued #2`, `denoise 3/8`, `decode`). tqdm draws it (and prints plain lines where the output
is no terminal); this class only maps a job's fields onto it.
"""
from __future__ import annotations

import sys
from typing import IO

from h3batch.client.models import JobEvent


class JobBar:
    """A tqdm bar for one job (nothing at all when `enabled` is false, e.g. --no-progress)."""

    def __init__(self, enabled: bool, job_id: str, file: IO[str] | None = None):
        self.bar = None
        if enabled:
            from tqdm import tqdm  # noqa: PLC0415

            self.bar = tqdm(total=100, desc=job_id[:16], unit="%", bar_format="{desc} {bar} {n:.0f}% {postfix}",
                            file=file or sys.stderr)

    def show(self, progress: float | None, stage: str | None, step: int | None = None, *,
             queue_position: int | None = None) -> None:
        """Progress 0..1, the stage (with the denoise step) or the queue position while queued."""
        if self.bar is None:
            return
        if progress is not None:
            self.bar.n = round(progress * 100, 1)
        if queue_position:
            self.bar.set_postfix_str(f"queued #{queue_position}", refresh=False)
        elif stage:
            self.bar.set_postfix_str(stage + (f" {step}/8" if stage == "denoise" and step else ""), refresh=False)
        self.bar.refresh()

    def show_event(self, event: JobEvent) -> None:
        """One event of the job's stream (or a long poll's look)."""
        data = event.data
        self.show(data.get("progress"), data.get("stage"), data.get("step"))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
