"""Routing by worker capability: which Celery queue a job's render message goes to, which queues a worker consumes.

Failure handled: a job sent to a worker that cannot serve it. With one `render` queue every worker took every job,
so a job the fleet could serve still landed on a worker too small for it (failed `exceeds_worker_capacity`), and a
job asking for another precision or task would land on a worker that renders something else. Now a job's message
goes to the queue of what it needs, and only workers that serve that consume the queue:

    render.<task>.<precision>.<rows step>        e.g. render.t2va.bf16.2436

- `task` and `precision` are the job's (record fields `task`, `precision`; a worker serves its release's tasks in
  its one `H3BATCH_PRECISION`).
- The size: a fixed ladder of row counts `ROWS_STEPS` (each step 2^(1/4), about 19 %, above the one below, the top
  one the contract's largest request). A job goes to the smallest step at or above its rows
  (`RequestGeometry.capacity_rows`); a worker advertising `max_rows` consumes every step at or below it. So every
  consumer of a job's queue serves at least its rows, and a worker serves up to its figure rounded down to a step
  (at most 16 % below it). A ladder rather than one queue per worker size: a large worker must also take small jobs
  (it consumes the small steps too), and the queues a worker consumes are fixed at its start, whatever joins later.

Every sender (the API, the worker's re-send, the reaper, the batch feeder) names the queue by `queue_of(record)`,
so a job re-sent after a lost worker or a lost message goes back to the same capability queue.

A worker's capability (`Capability`: release kind, tasks, precision, canvas, max_rows) is written by its heartbeat
into `h3b:capacity` (core/capacity.py); the API refuses at submission a request no live worker serves
(`Need.refusal`), naming what is missing and what the fleet serves.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from h3batch.core import defaults
from h3batch.core.geometry import CONTRACT_MAX_ROWS, RequestGeometry

PRECISIONS = ("bf16", "fp8")
"""Values of a job's `precision` and of H3BATCH_PRECISION. bf16 renders the release's semantics; fp8 is opt-in."""
DEFAULT_PRECISION = "bf16"
TASKS = ("t2va", "fl2va", "ref2va")
"""Task names a job may carry; which of them the fleet serves is what its heartbeats advertise."""
DEFAULT_TASK = "t2va"
RELEASE_KINDS = ("v2", "native")
"""`v2`: FastH3 8-Step V2 (served today); `native`: the MiniMax-H3 release layout."""
NATIVE_MIN_SECONDS = 5.0
"""Shortest clip of the native release (diffusers' `MiniMaxH3ModularPipeline.min_duration`); V2 renders from 4 s."""

ROWS_STEP_RATIO = 2 ** 0.25
MIN_REQUEST_ROWS = RequestGeometry(32, 32, 4.0).capacity_rows
"""Rows of the smallest request the contract allows (32x32 at 4 s): below it no step is needed."""


def _ladder() -> tuple[int, ...]:
    steps = [CONTRACT_MAX_ROWS]
    while math.ceil(steps[-1] / ROWS_STEP_RATIO) >= MIN_REQUEST_ROWS:
        steps.append(math.ceil(steps[-1] / ROWS_STEP_RATIO))
    return tuple(sorted(steps))


ROWS_STEPS: tuple[int, ...] = _ladder()
"""Ascending: 1,449 ... 110,086 (the contract's largest request), 26 steps; the smallest request (32x32 at 4 s)
has 1,412 rows."""


def rows_step(rows: int) -> int:
    """The smallest step at or above `rows` (ValueError past the contract's largest request)."""
    for step in ROWS_STEPS:
        if step >= rows:
            return step
    raise ValueError(f"{rows} rows is more than the contract's largest request ({CONTRACT_MAX_ROWS})")


def steps_served(max_rows: int) -> tuple[int, ...]:
    """The steps a worker of `max_rows` consumes: every one at or below it."""
    return tuple(step for step in ROWS_STEPS if step <= max_rows)


def served_rows(max_rows: int) -> int:
    """What a worker of `max_rows` serves through the ladder: its largest step (0 when below the smallest)."""
    served = steps_served(max_rows)
    return served[-1] if served else 0


def queue_name(task: str, precision: str, step: int) -> str:
    return f"{defaults.RENDER_QUEUE}.{task}.{precision}.{step}"


def all_queues() -> list[str]:
    """Every render queue a job can be sent to (the API's metrics sum their depths)."""
    return [queue_name(t, p, s) for t in TASKS for p in PRECISIONS for s in ROWS_STEPS]


@dataclass(frozen=True)
class Need:
    """What a job needs from a worker: its task, its precision, its rows and its duration (the native release
    renders no clip under `NATIVE_MIN_SECONDS`)."""

    task: str
    precision: str
    rows: int
    seconds: float = 0.0

    @classmethod
    def of(cls, width: int, height: int, seconds: float, *, task: str | None = None,
           precision: str | None = None) -> "Need":
        return cls(task or DEFAULT_TASK, precision or DEFAULT_PRECISION,
                   RequestGeometry(width, height, float(seconds)).capacity_rows, float(seconds))

    @property
    def queue(self) -> str:
        return queue_name(self.task, self.precision, rows_step(min(self.rows, CONTRACT_MAX_ROWS)))

    def served_by(self, cap: "Capability") -> bool:
        return (self.task in cap.tasks and self.precision == cap.precision
                and self.rows <= served_rows(cap.max_rows) and self.long_enough_for(cap))

    def long_enough_for(self, cap: "Capability") -> bool:
        """A native release renders 5-15 s (diffusers' `MiniMaxH3ModularPipeline.min_duration`); V2 from 4 s."""
        return cap.release_kind != "native" or self.seconds == 0.0 or self.seconds >= NATIVE_MIN_SECONDS


def shortest_served(task: str, caps: Sequence["Capability"], precision: str | None = None) -> float:
    """The shortest clip every worker of `caps` serving `task` (in `precision`, when given) renders:
    `NATIVE_MIN_SECONDS` when they all run the native release, else 0 (no floor beyond the request contract's 4 s).
    A job that names no `seconds` gets at least this, so a plain request to a native fleet renders instead of being
    refused."""
    kinds = {c.release_kind for c in caps if task in c.tasks and precision in (None, c.precision)}
    return NATIVE_MIN_SECONDS if kinds == {"native"} else 0.0


def queue_of(record: Mapping[str, Any]) -> str:
    """The render queue of a job record (what every sender names). Records written before routing (no `task`,
    no `precision`) need t2va in bf16, the only thing that was served then."""
    return Need.of(int(record["width"]), int(record["height"]), float(record["seconds"]),
                   task=record.get("task"), precision=record.get("precision")).queue


@dataclass(frozen=True)
class Capability:
    """What one worker serves, as its heartbeat advertises it (and `h3b:capacity` keeps it)."""

    max_rows: int
    precision: str = DEFAULT_PRECISION
    release_kind: str = "v2"
    tasks: tuple[str, ...] = (DEFAULT_TASK,)
    canvas: dict[str, Any] = field(default_factory=dict)
    """The release's canvas (default size and bucket budget, geometry.CanvasProfile.as_json); sizes the contract
    allows are served up to `max_rows`."""

    def queues(self) -> list[str]:
        """The queues this worker consumes, largest step first."""
        return [queue_name(t, self.precision, s) for t in self.tasks for s in reversed(steps_served(self.max_rows))]

    def as_json(self) -> dict[str, Any]:
        return {"max_rows": self.max_rows, "precision": self.precision, "release_kind": self.release_kind,
                "tasks": list(self.tasks), "canvas": dict(self.canvas)}

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> "Capability":
        """From a heartbeat or `h3b:capacity` entry; the fields a worker from before routing did not write are
        what it served (v2, t2va, bf16). ValueError/TypeError/KeyError on a malformed entry."""
        tasks = entry.get("tasks") or [DEFAULT_TASK]
        if isinstance(tasks, str) or not all(isinstance(t, str) for t in tasks):
            raise ValueError(f"tasks: expected a list of names, found {tasks!r}")
        return cls(max_rows=int(entry["max_rows"]), precision=str(entry.get("precision") or DEFAULT_PRECISION),
                   release_kind=str(entry.get("release_kind") or "v2"), tasks=tuple(tasks),
                   canvas=dict(entry.get("canvas") or {}))

    def describe(self) -> str:
        """How an error message lists it: `t2va bf16 up to 2,436 rows (v2)`."""
        return f"{'/'.join(self.tasks)} {self.precision} up to {served_rows(self.max_rows)} rows ({self.release_kind})"


def fleet_text(caps: Sequence[Capability]) -> str:
    """What a fleet serves, each distinct capability once, largest first."""
    seen = sorted({c.describe(): c for c in caps}.values(), key=lambda c: (-served_rows(c.max_rows), c.describe()))
    return "; ".join(c.describe() for c in seen) if seen else "nothing"


class Refusal(NamedTuple):
    """Why no worker serves a request: the error code, its message, and the request field it names (`body` when
    the request as a whole is too large)."""

    code: str
    message: str
    field: str


def refusal(need: Need, caps: Sequence[Capability], *, live: bool, age_s: float = 0.0) -> Refusal | None:
    """Why no worker of `caps` serves `need`, None when one does.

    `exceeds_worker_capacity` when workers serve the task in that precision but none is large enough (the code
    this check always answered); `no_capable_worker` when none serves the task, or none in that precision.
    """
    if any(need.served_by(c) for c in caps):
        return None
    who = "a live worker" if live else f"a worker seen {age_s:.0f} s ago (none is live now)"
    fleet = f"the fleet serves: {fleet_text(caps)}" if live else (
        f"no worker is live; the workers seen within the last {defaults.CAPACITY_MEMORY_S} s served: "
        f"{fleet_text(caps)}")
    same = [c for c in caps if need.task in c.tasks and c.precision == need.precision]
    if same and not any(need.long_enough_for(c) for c in same):
        return Refusal("no_capable_worker", (
            f"seconds: {need.seconds:g} s is shorter than the native MiniMax-H3 release renders "
            f"({NATIVE_MIN_SECONDS:g} to 15 s), and every worker that serves {need.task} in {need.precision} runs it; ask for "
            f"{NATIVE_MIN_SECONDS:g} s or more ({fleet})"), "seconds")
    same = [c for c in same if need.long_enough_for(c)]
    if same:
        largest = max(served_rows(c.max_rows) for c in same)
        return Refusal("exceeds_worker_capacity", (
            f"this request needs {need.rows} rows ({need.task}, {need.precision}; video and audio rows plus the "
            f"text rows) and the largest request {who} serves in {need.task} {need.precision} is {largest} rows; "
            f"ask for a smaller canvas or a shorter clip ({fleet})"), "body")
    if not any(need.task in c.tasks for c in caps):
        return Refusal("no_capable_worker", f"task {need.task!r}: no worker serves it ({fleet})", "task")
    return Refusal("no_capable_worker", f"precision {need.precision!r} for task {need.task!r}: no worker renders it "
                                        f"({fleet})", "precision")
