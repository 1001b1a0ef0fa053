"""Spec §6.5 request table: which sampler knobs FastH3 V2 accepts and the wording of each refusal."""
import subprocess
import sys

import pytest

from h3batch.core.request_rules import RequestRuleError, check_sampler_fields


@pytest.mark.parametrize("fields", [
    {},
    {"flow_shift": 10, "audio_flow_shift": 3, "guidance_scale": 1},
    {"num_inference_steps": 8, "flow_shift": "10", "audio_flow_shift": 3.0, "guidance_scale": None},
])
def test_accepted_requests(fields):
    """Omitted knobs and the V2 values (10 / 3 / 1, steps 8) are accepted."""
    check_sampler_fields(fields)


@pytest.mark.parametrize("fields, field, words", [
    ({"num_inference_steps": 7}, "num_inference_steps", "num_inference_steps=8"),
    ({"num_inference_steps": 9}, "num_inference_steps", "must be 8"),
    ({"num_inference_steps": "8"}, "num_inference_steps", "num_inference_steps=8"),
    ({"num_inference_steps": True}, "num_inference_steps", "num_inference_steps=8"),
    ({"flow_shift": 9}, "flow_shift", "flow_shift=10"),
    ({"flow_shift": "bad"}, "flow_shift", "flow_shift=10"),
    ({"audio_flow_shift": 4}, "audio_flow_shift", "audio_flow_shift=3"),
    ({"guidance_scale": 2.0}, "guidance_scale", "guidance_scale=1"),
    ({"lora_request": {"path": "x"}}, "lora_request", "per-request LoRA"),
    ({"sigmas": [1.0, 0.0]}, "sigmas", "custom sigmas"),
])
def test_rejected_requests(fields, field, words):
    """Each knob V2 cannot honour is refused naming the field, with the spec's wording."""
    with pytest.raises(RequestRuleError) as err:
        check_sampler_fields(fields)
    assert err.value.field == field
    assert words in str(err.value)


def test_order_lora_before_steps():
    """Checks run in the spec's order: a LoRA request is reported before a wrong step count."""
    with pytest.raises(RequestRuleError, match="per-request LoRA"):
        check_sampler_fields({"lora_request": "x", "num_inference_steps": 9})


def test_step_execution_mode():
    """In step-execution mode the step count must be given explicitly and custom schedules are refused."""
    with pytest.raises(RequestRuleError, match="step execution requires num_inference_steps=8"):
        check_sampler_fields({}, step_execution=True)
    with pytest.raises(RequestRuleError, match="does not support custom timesteps or sigmas"):
        check_sampler_fields({"num_inference_steps": 8, "timesteps": [999]}, step_execution=True)
    check_sampler_fields({"num_inference_steps": 8}, step_execution=True)


def test_module_is_torch_free():
    """The API process can import the rules without torch."""
    code = "import sys, h3batch.core.request_rules; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-P", "-c", code], check=True)
