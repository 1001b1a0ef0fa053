"""What this worker serves, as its heartbeat advertises it: the largest request (`max_rows`) and its capability
(release kind, tasks, precision, canvas: core/routing.Capability, whose queues it consumes).

The unit is a request's DiT sequence rows by the contract's capacity measure (`RequestGeometry.capacity_rows` in
core/geometry.py: video + 2A audio rows + the 1024 text rows of the longest prompt), so the API can compare a request
with it without loading a tokenizer. The API refuses larger requests with 422 `exceeds_worker_capacity`
(core/capacity.py); a job that still reaches this worker over the limit fails with the same code (worker/attempt.py).
"""
from __future__ import annotations

from typing import Any

from h3batch.core import routing
from h3batch.core.geometry import CONTRACT_MAX_ROWS
from h3batch.settings import Settings

RELEASE_TASKS = {"v2": ("t2va",), "native": ("t2va", "fl2va", "ref2va")}
"""The tasks each release kind can serve (core/routing.TASKS); a native release without `transformer_ref/` serves
t2va and fl2va only (its `info.tasks`)."""


def release_kind_and_tasks(pipeline: Any) -> tuple[str, tuple[str, ...]]:
    """The release kind a loaded pipeline serves and the tasks it serves: the one place the heartbeat's
    `release_kind` and `tasks` come from. The kind is the contract check's (`pipeline.info.kind`, or
    `pipeline.release_kind` for a rank group); a release without one is FastH3 V2 (`v2`). The tasks are the
    pipeline's own (`pipeline.tasks`: what the release's layout holds), else the release's (`info.tasks`), else the
    kind's, always within the kind's."""
    info = getattr(pipeline, "info", None)
    kind = getattr(info, "kind", None) or getattr(pipeline, "release_kind", None) or "v2"
    kind = str(getattr(kind, "value", kind))
    if kind not in RELEASE_TASKS:
        raise ValueError(f"release kind {kind!r}: this worker knows the tasks of {', '.join(RELEASE_TASKS)} only")
    served = getattr(pipeline, "tasks", None) or getattr(info, "tasks", None) or RELEASE_TASKS[kind]
    return kind, tuple(t for t in served if t in RELEASE_TASKS[kind])


def capability_of(pipeline: Any, settings: Settings, max_rows: int) -> routing.Capability:
    """This worker's capability: the release's kind and tasks, its precision, canvas and `max_rows`.

    Raises ValueError naming the variable when the worker could serve nothing: H3BATCH_PRECISION asks for a
    precision the loaded pipeline does not render in (`pipeline.precision`, bf16 when the pipeline says nothing),
    or `max_rows` is below the smallest request (core/routing.ROWS_STEPS)."""
    rendered = getattr(pipeline, "precision", None) or routing.DEFAULT_PRECISION
    if settings.precision != rendered:
        raise ValueError(f"H3BATCH_PRECISION={settings.precision}: the loaded pipeline renders in {rendered} only")
    if not routing.steps_served(max_rows):
        raise ValueError(f"H3BATCH_MAX_ROWS / memory plan: this worker serves {max_rows} rows, less than the smallest "
                         f"request ({routing.ROWS_STEPS[0]} rows)")
    kind, tasks = release_kind_and_tasks(pipeline)
    canvas = getattr(pipeline, "canvas", None)
    canvas_json = canvas.as_json() if hasattr(canvas, "as_json") else dict(canvas or {})
    return routing.Capability(max_rows=max_rows, precision=rendered, release_kind=kind, tasks=tasks,
                              canvas=canvas_json)


def advertised_max_rows(override: int | None = None, plan_max_rows: int | None = None) -> int:
    """The `max_rows` this worker advertises, in order of precedence:

    1. `override`: H3BATCH_MAX_ROWS, when the operator set it (a node with less memory than the plan assumes, a
       shared GPU, a test);
    2. `plan_max_rows`: the largest row count the per-rank memory plan (worker/h3/memory_plan.py) fits for this
       configuration (ranks, device memory, where the text encoder lives); pass None when there is no plan;
    3. otherwise `CONTRACT_MAX_ROWS`, the rows of the largest request the contract allows (15 s at the 1344x768
       area cap, longest prompt): no limit beyond the contract's own. This is what a CPU worker and the tiny
       release advertise; a CUDA worker without a plan advertises it too and relies on out-of-memory handling
       (worker/oom.py) for what does not fit.

    Every figure is a positive integer; a plan figure that is not one raises ValueError (a bug in the plan, found at
    start).
    """
    if override is not None:
        return int(override)
    if plan_max_rows is not None:
        if isinstance(plan_max_rows, bool) or not isinstance(plan_max_rows, int) or plan_max_rows < 1:
            raise ValueError(f"memory plan: max_rows must be a positive integer, got {plan_max_rows!r}")
        return min(plan_max_rows, CONTRACT_MAX_ROWS)  # past the contract's largest request, the contract binds
    return CONTRACT_MAX_ROWS


def plan_max_rows_of(pipeline: Any) -> int | None:
    """The memory plan's `max_rows` for a loaded pipeline, None when it has none: the hook the plan plugs into.

    Reads `pipeline.memory_plan.max_rows` (Pipeline.load attaches the plan; a rank group carries rank 0's). On a GPU
    the plan is made with the activation costs measured on the H200; on the CPU with those measured on the CPU
    (worker/h3/memory_plan.py `CPU_CALIBRATION`) against the host's RAM, so a CPU worker advertises what its RAM
    holds, not the contract's maximum.
    """
    plan = getattr(pipeline, "memory_plan", None)
    if plan is None:
        return None
    return getattr(plan, "max_rows", None)


def capacity_source(override: int | None, plan_max_rows: int | None) -> str:
    """Which rule of `advertised_max_rows` gave the figure, for the start-up log line."""
    if override is not None:
        return "H3BATCH_MAX_ROWS"
    return "memory plan" if plan_max_rows is not None else "contract maximum"
