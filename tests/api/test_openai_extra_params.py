"""`extra_params` of POST /v1/videos (api/openai_protocol.py): the release's fixed sampler values pass as no-ops."""
from __future__ import annotations

import json

import pytest

from h3batch.api.errors import ApiError
from h3batch.api.openai_protocol import DEFAULT_MODEL_ID, parse_create

FIXED = {"flow_shift": 10, "audio_flow_shift": 3, "num_inference_steps": 8, "guidance_scale": 1}


def _create(extra) -> dict:
    return parse_create({"prompt": "a fox", "extra_params": extra}, DEFAULT_MODEL_ID)


@pytest.mark.parametrize("encode", [json.dumps, dict], ids=["json-text", "object"])
def test_the_release_fixed_values_are_accepted_as_no_ops(encode):
    """The vllm-omni recipe (flow_shift 10, audio_flow_shift 3, steps 8, guidance 1, task t2va) changes nothing."""
    plain = parse_create({"prompt": "a fox"}, DEFAULT_MODEL_ID)
    assert _create(encode({**FIXED, "task": "t2va"})) == plain
    assert _create(encode({"flow_shift": 10.0, "audio_flow_shift": "3"})) == plain  # numbers read as the top level


@pytest.mark.parametrize("name, value", [("flow_shift", 12), ("audio_flow_shift", 4.0), ("num_inference_steps", 4),
                                         ("num_inference_steps", 8.5), ("guidance_scale", 2), ("flow_shift", True)])
def test_any_other_value_is_refused_naming_the_field(name, value):
    """A different value of a fixed knob is 400 unsupported_parameter naming extra_params.<field> and the value."""
    with pytest.raises(ApiError) as err:
        _create(json.dumps({**FIXED, name: value}))
    assert err.value.status == 400 and err.value.code == "unsupported_parameter"
    assert str(err.value.message).startswith(f"extra_params.{name}: ") and repr(value) in err.value.message


def test_unknown_extra_params_are_still_refused():
    """A knob outside the fixed four (and task) is refused naming it."""
    with pytest.raises(ApiError) as err:
        _create({"sample_solver": "unipc"})
    assert err.value.code == "unsupported_parameter" and err.value.message.startswith("extra_params.sample_solver:")
