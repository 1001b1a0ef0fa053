"""Serving-side request rules of the FastH3 V2 contract (spec h3-model.md §6.5), pure Python for the API process.

Clients that come from vllm-omni or diffusers send sampler knobs (`num_inference_steps`, `flow_shift`, ...). V2 is
distilled for exactly one setting, so each knob is accepted only when absent or equal to it, and refused with the
spec's wording otherwise; checks run in the spec's order and the first failure is reported.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

REQUIRED_STEPS = 8
VIDEO_FLOW_SHIFT = 10.0
AUDIO_FLOW_SHIFT = 3.0
GUIDANCE_SCALE = 1.0

SAMPLER_FIELDS = ("num_inference_steps", "flow_shift", "audio_flow_shift", "guidance_scale", "timesteps", "sigmas",
                  "lora_request")
"""Request fields this module decides on; everything else is the caller's business."""


class RequestRuleError(ValueError):
    """A sampler knob that FastH3 V2 cannot honour; `field` names it."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


def _is_close_number(value: Any, target: float) -> bool:
    """`float(value)` is close to target, as the spec's rule reads (so "10" passes for 10); booleans never do."""
    if isinstance(value, bool):
        return False
    try:
        number = float(value)
    except (TypeError, ValueError):
        return False
    return math.isfinite(number) and math.isclose(number, target, rel_tol=1e-9, abs_tol=1e-9)


def check_sampler_fields(fields: Mapping[str, Any], *, step_execution: bool = False) -> None:
    """Raise RequestRuleError for the first knob (in §6.5 order) that V2 cannot serve; absent knobs are fine.

    `step_execution` is vllm-omni's step-execution serving mode, where `num_inference_steps` must be given as 8.
    """
    if step_execution:
        if fields.get("num_inference_steps") is None or fields.get("num_inference_steps") != REQUIRED_STEPS:
            raise RequestRuleError("num_inference_steps", "step execution requires num_inference_steps=8")
        if fields.get("timesteps") is not None or fields.get("sigmas") is not None:
            raise RequestRuleError("timesteps", "step execution does not support custom timesteps or sigmas")
    if fields.get("lora_request") is not None:
        raise RequestRuleError("lora_request", "FastH3 V2 does not support per-request LoRA")
    steps = fields.get("num_inference_steps")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps != REQUIRED_STEPS):
        raise RequestRuleError(
            "num_inference_steps", f"FastH3 V2 runs exactly num_inference_steps=8 (must be 8), got {steps!r}")
    for name, target, label in (("flow_shift", VIDEO_FLOW_SHIFT, "flow_shift=10"),
                                ("audio_flow_shift", AUDIO_FLOW_SHIFT, "audio_flow_shift=3")):
        value = fields.get(name)
        if value is not None and not _is_close_number(value, target):
            raise RequestRuleError(name, f"FastH3 V2 is distilled for {label}, got {value!r}")
    guidance = fields.get("guidance_scale")
    if guidance is not None and not _is_close_number(guidance, GUIDANCE_SCALE):
        raise RequestRuleError("guidance_scale", f"FastH3 V2 runs without CFG: guidance_scale=1 only, got {guidance!r}")
    for name in ("timesteps", "sigmas"):
        if fields.get(name) is not None:
            raise RequestRuleError(name, f"FastH3 V2 uses its fixed 8-step schedule; custom {name} are not supported")
