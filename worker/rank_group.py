"""A resident group of N rank processes that render each request together with the sequence-parallel DiT.

One worker process (the driver) owns one group, started once and kept for the worker's life:

    driver (Celery task process) ── commands, one queue per rank ──▶ rank 0 … rank N−1 (spawned, one device each)
                                 ◀── events, one shared queue ─────  progress from rank 0, one outcome per rank
                                 ── cancel (multiprocessing.Event) ▶ read by rank 0 at step boundaries

Every rank runs `Pipeline.denoise` SPMD on the same request (same seed, same noise, same VSA plan), the DiT being
`apply_sequence_parallel`-ed over the group. Rank 0 alone holds the text encoder and the VAEs: it encodes the prompt
and broadcasts the features, and after the last step it decodes and muxes (`Pipeline.write`) while the others wait
for the next command. DiT weights are replicated on every rank (SP shards activations, not weights).

Cancellation keeps the single-process semantics: the driver polls `should_cancel` and sets the event; at each of the 9
denoise step boundaries rank 0 reads it and broadcasts its decision, so every rank raises `RenderCancelled` at the same
boundary and the collectives stay matched; decode and mux check the event directly (rank 0 only). The driver raises
`RenderCancelled` once every rank has reported.

Processes are started with the spawn context (no CUDA state is inherited, whatever the driver did before) and torch
.distributed is initialised once per rank over a loopback TCP rendezvous: NCCL on GPUs, gloo on CPU (tests). Written
here rather than with torchrun/elastic: the group must live inside a Celery worker process and take requests through
queues for hours, not run one script to completion.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import queue
import socket
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch

from h3batch.worker.pipeline import (
    NATIVE_RANKS_REFUSAL, Pipeline, ProgressFn, RenderCancelled, RenderRequest, RenderResult, validate_request,
)

log = logging.getLogger("h3batch.rank_group")

RANKS_ENV = "H3BATCH_RANKS"
"""Ranks per worker: an integer ≥ 1, or `auto` = every visible GPU (CUDA_VISIBLE_DEVICES); unset = 1."""

POLL_S = 0.05
"""How often the driver checks the ranks' liveness while a render runs."""

CANCEL_POLL_S = 0.25
"""How often the driver calls `should_cancel` between progress events (a Redis read in the worker); at real size one
denoise step takes ~1 s on 4 GPUs, so the next step boundary still sees the flag."""

FAILURE_GRACE_S = 10.0
"""After one rank fails, how long the driver waits for the others to report before it stops the group."""

COLLECTIVE_TIMEOUT_S = 600.0
"""torch.distributed timeout: a rank stuck this long in a collective (a peer died) fails instead of hanging."""


class RankGroupError(RuntimeError):
    """A rank failed or died; the group is stopped and this object refuses further renders (restart the worker)."""


def ranks_from_env(environ: dict[str, str] | None = None) -> int:
    """The rank count a worker should run, from H3BATCH_RANKS (ValueError naming the variable on bad values)."""
    value = (environ if environ is not None else os.environ).get(RANKS_ENV, "1").strip()
    if value == "auto":
        return max(1, torch.cuda.device_count())
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{RANKS_ENV}: expected a positive integer or 'auto', got {value!r}")
    return int(value)


def load_pipeline(release_dir: str | Path, *, ranks: int = 1, device: str | torch.device | None = None,
                  hf_cache: str | Path | None = None, require_pinned_base: bool = False,
                  text_placement: str = "auto", precision: str = "bf16",
                  adapter: str | None = None, lora_cache_mb: int = 2048) -> Pipeline | RankGroupPipeline:
    """A resident pipeline: the plain in-process `Pipeline` for ranks = 1, a `RankGroupPipeline` for more.

    Both offer release_id, contract_hash, memory_plan, validate(req), render(req, out_path, on_progress=,
    should_cancel=), close(). `text_placement` is H3BATCH_TEXT_ENCODER_PLACEMENT (worker/h3/memory_plan.py),
    `precision` H3BATCH_PRECISION (worker/h3/precision.py), the same on every rank; `adapter` H3BATCH_ADAPTER
    (worker/h3/legacy_adapter.py; one rank only for now).
    Raises ValueError for a bad rank count or release (the contract and loader errors name the field).
    """
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"ranks: expected a positive integer, got {ranks!r}")
    if adapter and ranks > 1:
        raise ValueError("H3BATCH_ADAPTER: the legacy FastH3 adapter is fused on one rank only (H3BATCH_RANKS=1)")
    if ranks == 1:
        return Pipeline.load(release_dir, device=device, hf_cache=hf_cache, require_pinned_base=require_pinned_base,
                             text_placement=text_placement, precision=precision, adapter=adapter,
                             lora_cache_mb=lora_cache_mb)
    return RankGroupPipeline.start(release_dir, ranks=ranks, device=device, hf_cache=hf_cache,
                                   require_pinned_base=require_pinned_base, text_placement=text_placement,
                                   precision=precision)


@dataclass(frozen=True)
class RankSpec:
    """What every rank process needs to start (picklable; sent once at spawn)."""

    release_dir: str
    hf_cache: str | None
    world: int
    device_type: str  # "cuda" (rank r on cuda:r) or "cpu"
    port: int  # loopback rendezvous
    threads: int | None  # CPU threads per rank; None = torch's default (e.g. OMP_NUM_THREADS)
    log_level: int  # the driver's root logging level, so ranks log like the process that started them
    require_pinned_base: bool = False  # H3BATCH_REQUIRE_PINNED_BASE
    text_placement: str = "auto"  # H3BATCH_TEXT_ENCODER_PLACEMENT (rank 0's encoder)
    precision: str = "bf16"  # H3BATCH_PRECISION (every rank's DiT)


class RankGroupPipeline:
    """Drop-in for `Pipeline` that renders on N resident rank processes (see the module docstring)."""

    def __init__(self, spec: RankSpec, processes, commands, events, cancel, ready: dict):
        self.spec = spec
        self.ranks = spec.world
        self.device = f"{spec.device_type}×{spec.world}"
        self.release_id = ready["release_id"]
        self.contract_hash = ready["contract_hash"]
        self.provenance = ready.get("provenance", {})
        self.canvas = ready.get("canvas")
        self.memory_plan = ready.get("memory_plan")  # rank 0's plan for the whole group (worker/h3/memory_plan.py)
        self.precision = spec.precision  # H3BATCH_PRECISION, applied by every rank at load
        self._processes = processes
        self._commands = commands
        self._events = events
        self._cancel = cancel
        self._request_seq = 0
        self._down: str | None = None  # why the group stopped

    @classmethod
    def start(cls, release_dir: str | Path, *, ranks: int, device: str | torch.device | None = None,
              hf_cache: str | Path | None = None, start_timeout_s: float | None = None,
              require_pinned_base: bool = False, text_placement: str = "auto",
              precision: str = "bf16") -> RankGroupPipeline:
        """Spawn `ranks` processes, load the release on each and wait until all are ready.

        device: "cuda" (rank r on cuda:r; needs ranks ≤ visible GPUs), "cpu" (gloo), None = cuda when available.
        Raises ValueError for a bad device or rank count and for the release errors rank 0 reports (contract,
        provenance, loader), RankGroupError when a rank dies or fails otherwise while loading.
        """
        import torch.multiprocessing as mp

        device_type = torch.device(device).type if device is not None else (
            "cuda" if torch.cuda.is_available() else "cpu")
        if device_type not in ("cuda", "cpu"):
            raise ValueError(f"device: expected cuda or cpu for a rank group, got {device!r}")
        if device_type == "cuda" and ranks > torch.cuda.device_count():
            raise ValueError(f"ranks: expected at most the {torch.cuda.device_count()} visible GPUs, got {ranks}")
        threads = None
        if device_type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
            threads = max(1, (os.cpu_count() or 1) // ranks)
        spec = RankSpec(str(release_dir), None if hf_cache is None else str(hf_cache), ranks, device_type,
                        _free_port(), threads, logging.getLogger().getEffectiveLevel(), require_pinned_base,
                        text_placement, precision)

        ctx = mp.get_context("spawn")
        commands = [ctx.Queue() for _ in range(ranks)]
        events = ctx.Queue()
        cancel = ctx.Event()
        processes = []
        for rank in range(ranks):
            proc = ctx.Process(target=_rank_main, args=(rank, spec, commands[rank], events, cancel),
                               name=f"h3batch-rank{rank}", daemon=True)
            proc.start()
            processes.append(proc)
        try:
            ready = _wait_ready(processes, events, ranks, start_timeout_s)
        except BaseException:
            _stop_processes(processes, commands)
            raise
        group = cls(spec, processes, commands, events, cancel, ready)
        log.info("rank group ready: %d ranks on %s, release %s, pids %s", ranks, device_type, group.release_id,
                 group.pids)
        return group

    @property
    def pids(self) -> list[int]:
        """Process ids of the ranks, in rank order (they stay the same while the group lives)."""
        return [p.pid for p in self._processes]

    def validate(self, req: RenderRequest) -> None:
        """Refuse a request no release can render (ValueError naming the field), before any rank sees it."""
        validate_request(req)

    def render(self, req: RenderRequest, out_path: str | Path, *, on_progress: ProgressFn | None = None,
               should_cancel: Callable[[], bool] | None = None) -> RenderResult:
        """Render `req` to `out_path` on the group; same contract as `Pipeline.render` (RenderCancelled, ValueError).

        Raises RankGroupError when a rank fails or dies (the group is then stopped).
        """
        if self._down is not None:
            raise RankGroupError(f"rank group is down: {self._down}")
        self.validate(req)
        self._request_seq += 1
        seq = self._request_seq
        self._cancel.clear()
        for commands in self._commands:
            commands.put(("render", seq, req, str(out_path)))
        try:
            outcomes = self._collect(seq, on_progress, should_cancel)
        except BaseException:
            if self._down is None:
                # The driver gave up (an on_progress error, KeyboardInterrupt): stop the ranks at the next boundary
                # and wait for them, so the next request starts on an idle group.
                self._cancel.set()
                self._collect(seq, None, None, quiet=True)
            raise
        return _outcome(outcomes)

    def close(self) -> None:
        """Stop every rank (idempotent); the group refuses renders afterwards."""
        _stop_processes(self._processes, self._commands)
        self._down = self._down or "closed"

    def __enter__(self) -> RankGroupPipeline:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # Internals ---------------------------------------------------------------------------------------------------

    def _collect(self, seq: int, on_progress: ProgressFn | None, should_cancel: Callable[[], bool] | None,
                 quiet: bool = False) -> dict[int, tuple[str, object]]:
        """Relay progress and wait for one outcome per rank: {rank: (kind, payload)}."""
        outcomes: dict[int, tuple[str, object]] = {}
        failed_at: float | None = None
        next_cancel_poll = 0.0
        while len(outcomes) < self.ranks:
            if should_cancel is not None and not self._cancel.is_set() and time.monotonic() >= next_cancel_poll:
                next_cancel_poll = time.monotonic() + CANCEL_POLL_S
                if should_cancel():
                    self._cancel.set()
            try:
                event_seq, rank, kind, payload = self._events.get(timeout=POLL_S)
            except queue.Empty:
                dead = [r for r, p in enumerate(self._processes) if not p.is_alive() and r not in outcomes]
                overdue = failed_at is not None and time.monotonic() - failed_at > FAILURE_GRACE_S
                if dead or overdue:
                    missing = sorted(set(range(self.ranks)) - set(outcomes))
                    why = f"rank {dead[0]} exited with code {self._processes[dead[0]].exitcode}" if dead else (
                        f"ranks {missing} did not finish within {FAILURE_GRACE_S} s of the first outcome")
                    self._fail(why, outcomes)
                    if quiet:
                        return outcomes
                    raise RankGroupError(self._down) from None
                continue
            if event_seq != seq:
                continue  # left over from a request the driver stopped waiting for
            if kind == "progress":
                if on_progress is not None:
                    on_progress(*payload)
                next_cancel_poll = 0.0  # ask again right after each step
                continue
            outcomes[rank] = (kind, payload)
            if kind != "done" and failed_at is None:
                # Cancelled / invalid outcomes arrive together from every rank (the vote, deterministic checks);
                # a rank that stays silent past the grace period is stuck in a collective.
                failed_at = time.monotonic()
        if any(kind == "failed" for kind, _ in outcomes.values()):
            self._fail(None, outcomes)
            if not quiet:
                raise RankGroupError(self._down)
        return outcomes

    def _fail(self, why: str | None, outcomes: dict[int, tuple[str, object]]) -> None:
        failure = _first_failure(outcomes)
        detail = f"rank {failure[0]}: {failure[1]}" if failure else ""
        self._down = "; ".join(part for part in (why, detail) if part)
        log.error("rank group stopped: %s", self._down)
        _stop_processes(self._processes, self._commands)


def _stop_processes(processes, commands, wait_s: float = 30.0) -> None:
    """Ask every live rank to stop, wait `wait_s`, then terminate what is left (our own children, by handle)."""
    for proc, command_queue in zip(processes, commands):
        if proc.is_alive():
            command_queue.put(("stop",))
    deadline = time.monotonic() + wait_s
    for proc in processes:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
    for proc in processes:
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=10.0)


def _first_failure(outcomes: dict[int, tuple[str, object]]) -> tuple[int, str] | None:
    for rank in sorted(outcomes):
        kind, payload = outcomes[rank]
        if kind == "failed":
            return rank, str(payload).strip().splitlines()[-1]
    return None


def _outcome(outcomes: dict[int, tuple[str, object]]) -> RenderResult:
    """Rank 0 decides: its result, or its cancellation / invalid-request error (the vote keeps the ranks agreed)."""
    kind, payload = outcomes[0]
    if kind == "done":
        return payload
    if kind == "cancelled":
        raise RenderCancelled(payload)
    if kind == "invalid":
        raise ValueError(payload)
    raise RankGroupError(f"rank 0 reported {kind!r}: {payload}")


def _wait_ready(processes, events, ranks: int, timeout_s: float | None) -> dict:
    """Wait for a "ready" event from every rank; ValueError / RankGroupError when one fails or dies."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    ready: dict[int, dict] = {}
    while len(ready) < ranks:
        try:
            _, rank, kind, payload = events.get(timeout=POLL_S * 4)
        except queue.Empty:
            dead = [r for r, p in enumerate(processes) if not p.is_alive()]
            if dead:
                raise RankGroupError(f"rank {dead[0]} exited with code {processes[dead[0]].exitcode} while loading")
            if deadline is not None and time.monotonic() > deadline:
                raise RankGroupError(f"ranks {sorted(set(range(ranks)) - set(ready))} not ready after {timeout_s} s")
            continue
        if kind == "ready":
            ready[rank] = payload
        elif kind == "invalid":
            raise ValueError(payload)
        else:
            raise RankGroupError(f"rank {rank} failed while loading: {payload}")
    return ready[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Rank side -----------------------------------------------------------------------------------------------------------


class BroadcastTextEncoder:
    """One text encoder per group: rank 0 encodes and broadcasts (L, features); the other ranks receive them.

    Features travel in the DiT's stream dtype, the first thing `refine_text` casts them to anyway.
    """

    def __init__(self, encoder, group, device: torch.device, text_dim: int, dtype: torch.dtype):
        self.encoder = encoder  # the real TextEncoder on rank 0, None elsewhere
        self.group, self.device, self.text_dim, self.dtype = group, device, text_dim, dtype

    def encode(self, prompt: str) -> tuple[torch.Tensor, int]:
        """(features [1, L, text_dim] in the stream dtype on this rank's device, L), the same on every rank.

        A prompt rank 0 refuses (ValueError, e.g. over-long) is broadcast as L = −1 so every rank raises together
        and no rank is left waiting in the features broadcast.
        """
        import torch.distributed as dist

        refusal: ValueError | None = None
        length = torch.zeros(1, dtype=torch.long, device=self.device)
        if self.encoder is not None:
            try:
                features, rows = self.encoder.encode(prompt)
                features = features.to(device=self.device, dtype=self.dtype).contiguous()  # [1, L, text_dim]
                length.fill_(rows)
            except ValueError as err:
                refusal = err
                length.fill_(-1)
        dist.broadcast(length, src=0, group=self.group)
        rows = int(length.item())
        if rows < 0:
            raise refusal if refusal is not None else ValueError("prompt: refused by the text encoder on rank 0")
        if self.encoder is None:
            features = torch.empty((1, rows, self.text_dim), dtype=self.dtype, device=self.device)
        dist.broadcast(features, src=0, group=self.group)
        return features, rows

    def settle(self, sequence_rows: int) -> None:
        """Rank 0's hosted encoder leaves the GPU unless the clip fits beside it (text_placement.py)."""
        settle = getattr(self.encoder, "settle", None)
        if settle is not None:
            settle(sequence_rows)


class StepBoundaryVote:
    """`should_cancel` for `Pipeline.denoise` on every rank: rank 0 reads the cancel event, all ranks get its answer."""

    def __init__(self, cancel, group, device: torch.device, is_source: bool):
        self.cancel, self.group, self.device, self.is_source = cancel, group, device, is_source

    def __call__(self) -> bool:
        import torch.distributed as dist

        flag = torch.tensor([int(self.is_source and self.cancel.is_set())], dtype=torch.int32, device=self.device)
        dist.broadcast(flag, src=0, group=self.group)
        return bool(flag.item())


def _load_rank_pipeline(rank: int, spec: RankSpec, device: torch.device) -> Pipeline:
    """Rank 0: the whole release; other ranks: the DiT only (a Hub release: its DiT files only). Then the SP DiT and
    the shared text encoder."""
    from h3batch.worker.h3 import contract, release_ref
    from h3batch.worker.h3.loader import load_transformer
    from h3batch.worker.h3.parallel import apply_sequence_parallel
    from h3batch.worker.h3.precision import apply_precision

    if rank == 0:
        pipe = Pipeline.load(spec.release_dir, device=device, hf_cache=spec.hf_cache,
                             require_pinned_base=spec.require_pinned_base, text_placement=spec.text_placement,
                             ranks=spec.world, precision=spec.precision)
    else:
        resolved = release_ref.resolve_release(spec.release_dir, release_ref.ReleaseRole.DIT, cache_dir=spec.hf_cache)
        info = contract.validate_release(resolved.path, require_pinned_base=spec.require_pinned_base,
                                         conditioner=False)
        if info.kind is contract.ReleaseKind.NATIVE:
            raise ValueError(NATIVE_RANKS_REFUSAL.format(ranks=spec.world))
        dit = apply_precision(load_transformer(Path(info.path) / "transformer", vsa_gates=True, device=device),
                              spec.precision)
        pipe = Pipeline(info, dit, None, None, None, device)
    apply_sequence_parallel(pipe.dit)
    pipe.text_encoder = BroadcastTextEncoder(pipe.text_encoder, None, device, pipe.dit.config.text_dim,
                                             pipe.dit.stream_dtype)
    return pipe


def _rank_main(rank: int, spec: RankSpec, commands, events, cancel) -> None:
    """Entry point of one rank process: init the group, load, then serve render commands until "stop"."""
    import torch.distributed as dist

    logging.basicConfig(level=spec.log_level, format=f"%(asctime)s rank{rank} %(name)s %(levelname)s %(message)s")
    parent = os.getppid()
    if spec.threads is not None:
        torch.set_num_threads(spec.threads)
    if spec.device_type == "cuda":
        torch.cuda.set_device(rank)
        device, backend = torch.device("cuda", rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{spec.port}", rank=rank, world_size=spec.world,
                            timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S),
                            device_id=device if backend == "nccl" else None)  # NCCL: bind this rank's GPU now
    try:
        try:
            pipe = _load_rank_pipeline(rank, spec, device)
        except ValueError as err:  # contract / provenance / loader: one line naming the field
            events.put((0, rank, "invalid", str(err).splitlines()[0]))
            return
        except BaseException:
            events.put((0, rank, "failed", traceback.format_exc()))
            return
        events.put((0, rank, "ready", {"release_id": pipe.release_id, "contract_hash": pipe.contract_hash,
                                       "provenance": pipe.provenance, "canvas": pipe.canvas,
                                       "memory_plan": pipe.memory_plan}))
        _serve(rank, pipe, commands, events, cancel, device, parent)
    finally:
        dist.destroy_process_group()


def _serve(rank: int, pipe: Pipeline, commands, events, cancel, device: torch.device, parent: int) -> None:
    vote = StepBoundaryVote(cancel, None, device, is_source=rank == 0)
    while True:
        try:
            command = commands.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:  # the driver died without a "stop": do not linger
                return
            continue
        if command[0] == "stop":
            return
        _, seq, req, out_path = command

        def progress(stage: str, step: int, total: int, seq=seq) -> None:
            events.put((seq, rank, "progress", (stage, step, total)))

        try:
            clip = pipe.denoise(req, on_progress=progress if rank == 0 else None, should_cancel=vote)
            result = None
            if rank == 0:
                result = pipe.write(clip, out_path, on_progress=progress, should_cancel=cancel.is_set)
                result = dataclasses.replace(result, extra={**result.extra, "ranks": _sp_world(pipe)})
            events.put((seq, rank, "done", result))
        except RenderCancelled as err:
            events.put((seq, rank, "cancelled", str(err)))
        except ValueError as err:
            events.put((seq, rank, "invalid", str(err).splitlines()[0] if str(err) else repr(err)))
        except BaseException:
            events.put((seq, rank, "failed", traceback.format_exc()))


def _sp_world(pipe: Pipeline) -> int:
    """World size of the SP DiT a pipeline runs (1 when it is not sequence-parallel)."""
    sp = getattr(pipe.dit, "sequence_parallel", None)
    return 1 if sp is None else sp.world
