"""worker/capacity.py and worker/oom.py in process: the advertised figure's precedence, the injected OOM knob, and
that `release_memory` lets go of what a failed render's traceback pinned."""
from __future__ import annotations

import weakref

import pytest
import torch

import subprocess
import sys

from h3batch.core.geometry import CONTRACT_MAX_ROWS, MAX_TEXT_ROWS, TINY_CANVAS
from h3batch.core.routing import Capability
from h3batch.settings import DEBUG_OOM_STAGES, ConfigError, Settings
from h3batch.worker import capacity, oom
from h3batch.worker.h3.text_encoder import MAX_PROMPT_TOKENS
from h3batch.worker.pipeline import STAGES


class _Plan:
    max_rows = 42_000


class _PlannedPipeline:
    memory_plan = _Plan()
    device = "cuda:0"


class _CpuPipeline:
    memory_plan = _Plan()
    device = "cpu"


def test_override_beats_the_plan_which_beats_the_contract():
    assert capacity.advertised_max_rows() == CONTRACT_MAX_ROWS
    assert capacity.advertised_max_rows(plan_max_rows=42_000) == 42_000
    assert capacity.advertised_max_rows(5000, plan_max_rows=42_000) == 5000
    assert capacity.capacity_source(None, None) == "contract maximum"
    assert capacity.capacity_source(None, 1) == "memory plan" and capacity.capacity_source(1, 1) == "H3BATCH_MAX_ROWS"
    with pytest.raises(ValueError, match="memory plan: max_rows"):
        capacity.advertised_max_rows(plan_max_rows=0)


def test_the_plan_hook_reads_a_pipelines_memory_plan():
    assert capacity.plan_max_rows_of(_PlannedPipeline()) == 42_000
    assert capacity.plan_max_rows_of(object()) is None
    assert capacity.plan_max_rows_of(_CpuPipeline()) == 42_000  # a CPU plan is made with the CPU's own costs


def test_a_plan_past_the_contracts_largest_request_advertises_the_contract():
    assert capacity.advertised_max_rows(plan_max_rows=290_426) == CONTRACT_MAX_ROWS


def test_capacity_measure_counts_the_longest_prompt_the_encoder_reads():
    assert MAX_TEXT_ROWS == MAX_PROMPT_TOKENS


def test_settings_parse_max_rows_and_the_oom_knob():
    """H3BATCH_MAX_ROWS is a positive integer; H3BATCH_DEBUG_OOM_AT is `stage` or `stage:rows` of a real stage."""
    assert DEBUG_OOM_STAGES == STAGES
    env = Settings.from_env({"H3BATCH_MAX_ROWS": "3000", "H3BATCH_DEBUG_OOM_AT": "decode:2000"})
    assert (env.max_rows, env.debug_oom_at) == (3000, ("decode", 2000))
    assert Settings.from_env({"H3BATCH_DEBUG_OOM_AT": "denoise"}).debug_oom_at == ("denoise", 0)
    assert Settings.from_env({}).max_rows is None and Settings.from_env({}).debug_oom_at is None
    for name, raw in (("H3BATCH_MAX_ROWS", "0"), ("H3BATCH_MAX_ROWS", "many"), ("H3BATCH_DEBUG_OOM_AT", "vae"),
                      ("H3BATCH_DEBUG_OOM_AT", "denoise:-1"), ("H3BATCH_DEBUG_OOM_AT", "denoise:1e3")):
        with pytest.raises(ConfigError, match=name):
            Settings.from_env({name: raw})


def test_injected_oom_raises_torchs_class_at_its_stage_from_its_row_count():
    knob = oom.InjectedOom("denoise", 2000)
    knob.check("text_encode", 5000)
    knob.check("denoise", 1999)
    with pytest.raises(torch.cuda.OutOfMemoryError, match="injected"):
        knob.check("denoise", 2000)


def _render_that_runs_out(refs: list) -> None:
    latents = torch.zeros(1 << 16)  # what a render's frames hold when the allocation after it fails
    refs.append(weakref.ref(latents))
    raise oom.OutOfMemoryError("CUDA out of memory (test)")


def test_release_memory_frees_what_the_failed_render_held():
    """While the error is handled its traceback keeps the render's tensors alive; release_memory lets them go."""
    refs: list = []
    try:
        _render_that_runs_out(refs)
    except oom.OutOfMemoryError as exc:
        assert refs[0]() is not None
        oom.release_memory(exc)
        assert refs[0]() is None and exc.__traceback__ is None
    summary = oom.memory_summary()
    assert summary == "device=cpu" if not torch.cuda.is_available() else "allocated_gib=" in summary


class _Loaded:
    """What capability_of reads of a loaded pipeline: its canvas (and `precision`, `info.kind` when it has them)."""

    canvas = TINY_CANVAS


class _Fp8Loaded(_Loaded):
    precision = "fp8"


def test_a_v2_pipeline_serves_t2va_in_its_precision_on_its_canvas():
    """The capability a worker advertises: the release kind and its tasks (one function of the loaded release),
    the precision the pipeline renders in, the canvas and max_rows."""
    assert capacity.release_kind_and_tasks(_Loaded()) == ("v2", ("t2va",))
    assert capacity.capability_of(_Loaded(), Settings.from_env({}), 3000) == Capability(
        max_rows=3000, precision="bf16", release_kind="v2", tasks=("t2va",), canvas=TINY_CANVAS.as_json())
    fp8 = capacity.capability_of(_Fp8Loaded(), Settings.from_env({"H3BATCH_PRECISION": "fp8"}), 3000)
    assert fp8.precision == "fp8" and fp8.queues()[0] == "render.t2va.fp8.2896"


def test_a_worker_that_could_serve_nothing_stops_naming_the_variable():
    """H3BATCH_PRECISION the pipeline does not render in, or a max_rows below the smallest request, is a ValueError
    naming the variable (the worker prints it and exits 2); a bad H3BATCH_PRECISION is a ConfigError."""
    with pytest.raises(ValueError, match="H3BATCH_PRECISION=fp8: the loaded pipeline renders in bf16 only"):
        capacity.capability_of(_Loaded(), Settings.from_env({"H3BATCH_PRECISION": "fp8"}), 3000)
    with pytest.raises(ValueError, match="H3BATCH_MAX_ROWS / memory plan: this worker serves 1000 rows"):
        capacity.capability_of(_Loaded(), Settings.from_env({}), 1000)
    for name in ("H3BATCH_PRECISION", "H3BATCH_DEFAULT_PRECISION"):
        with pytest.raises(ConfigError, match=f"{name}: expected one of bf16, fp8, found 'int4'"):
            Settings.from_env({name: "int4"})


@pytest.mark.parametrize("command,name", [("worker", "H3BATCH_PRECISION"), ("api", "H3BATCH_DEFAULT_PRECISION")])
def test_the_worker_and_the_api_stop_at_start_on_a_bad_precision(command, name):
    done = subprocess.run([sys.executable, "-P", "-m", "h3batch.cli", command], env={"PATH": "/usr/bin:/bin",
                          name: "int4"}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert f"{name}: expected one of bf16, fp8, found 'int4'" in done.stderr.strip().splitlines()[-1]
