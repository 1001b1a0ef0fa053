"""Input pacing on a fixed 80 ms grid without catch-up bursts (spec §8.4).

`PacingGrid` is the pure rule; `pace_frames` drives it with injected clock, sleep and send callables, so tests can
run the rule on a virtual clock (vectors 14.5, 14.6) and the driver on the event loop's monotonic clock.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable

from h3batch.loadrunner.audio import FRAME_PERIOD_S
from h3batch.loadrunner.metrics import Send


class PacingGrid:
    """Planned times stay on `epoch + seq*T`; the wake-up grid restarts one period after a send that overran it."""

    def __init__(self, epoch: float, period: float = FRAME_PERIOD_S):
        self.epoch = epoch
        self.period = period
        self._grid_origin, self._grid_seq = epoch, 0
        self.next_wake = epoch

    def planned(self, seq: int) -> float:
        return self.epoch + seq * self.period

    def sent(self, seq: int, completed: float) -> None:
        """Advance after frame `seq` completed at `completed`."""
        self.next_wake = self._grid_origin + (seq + 1 - self._grid_seq) * self.period
        if completed - self.next_wake > self.period:
            # A stall of more than one period: restart the grid after the stalled send instead of bursting.
            self._grid_origin, self._grid_seq = completed + self.period, seq + 1
            self.next_wake = self._grid_origin


async def pace_frames(count: int, epoch: float, *, clock: Callable[[], float],
                      sleep: Callable[[float], Awaitable[None]], send: Callable[[int], Awaitable[None]],
                      check: Callable[[], None], sends: list[Send]) -> None:
    """Send frames 0..count-1 on the grid, appending one `Send` per completed send to `sends`.

    `check` is the connection check run after each sleep and before each send; it raises to stop the stream.
    """
    grid = PacingGrid(epoch)
    for seq in range(count):
        await sleep(max(0.0, grid.next_wake - clock()))
        check()
        started = clock()
        await send(seq)
        completed = clock()
        sends.append(Send(grid.planned(seq), started, completed))
        grid.sent(seq, completed)
