"""H3Config: Diffusers aliases, derived fields, named tiny configs and the §12 parameter formula."""

import json

import pytest
import torch
from diffusers import MiniMaxH3Transformer3DModel

from h3batch.worker.h3.config import CONFIGS, H3_33B, T1, T2, H3Config, parameter_count
from h3batch.worker.h3.model import H3Transformer, count_parameters


def test_parameter_formula_33b():
    """The §12 formula gives 33,122,992,896 parameters, 35,049,751,296 with the 50 V2 gates."""
    assert parameter_count(H3_33B) == 33_122_992_896
    assert parameter_count(H3_33B.with_gates()) == 35_049_751_296


def test_parameter_formula_tiny_configs():
    """T1 has 267,936 parameters, T2 780,016 and 816,880 with gates (§2.2)."""
    assert parameter_count(T1) == 267_936
    assert parameter_count(T2) == 780_016
    assert parameter_count(T2.with_gates()) == 816_880


@pytest.mark.parametrize("gates", [False, True])
def test_meta_device_model_matches_formula(gates):
    """The native 33B model built on the meta device has exactly the formula's parameter count."""
    config = H3_33B.with_gates(gates)
    with torch.device("meta"):
        model = H3Transformer(config)
    assert count_parameters(model) == parameter_count(config)


@pytest.mark.parametrize("name", ["minimax-h3-33b", "T1", "T2"])
def test_diffusers_oracle_has_formula_count(name):
    """diffusers' MiniMaxH3Transformer3DModel (meta device) built from to_diffusers_config has the formula's count."""
    config = CONFIGS[name]
    with torch.device("meta"):
        oracle = MiniMaxH3Transformer3DModel(**config.to_diffusers_config())
    assert sum(p.numel() for p in oracle.parameters()) == parameter_count(config)


def test_alias_example_from_spec():
    """The seven Diffusers names map to their native fields and patch_size becomes a tuple (§13.4)."""
    config = H3Config.from_diffusers_config(
        {
            "num_refiner_layers": 3,
            "ffn_dim": 12,
            "in_channels": 4,
            "audio_in_channels": 6,
            "freq_dim": 8,
            "time_embed_hidden_dim": 10,
            "rope_freq_dim": 5,
            "patch_size": [1, 2, 2],
        }
    )
    got = (
        config.token_refiner_num_layers,
        config.ffn_hidden_size,
        config.latents_dim,
        config.audio_latents_dim,
        config.timestep_input_dim,
        config.time_embed_hidden_size,
        config.rope_inv_freq_len,
        config.patch_size,
    )
    assert got == (3, 12, 4, 6, 8, 10, 5, (1, 2, 2))


def test_saved_diffusers_config_reads_as_33b(tmp_path):
    """A config.json written by diffusers for the default model reads back as the 33B config with derived widths."""
    with torch.device("meta"):
        MiniMaxH3Transformer3DModel().save_config(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["_class_name"] == "MiniMaxH3Transformer3DModel"
    config = H3Config.from_diffusers_config(raw, vsa_gates=True)
    assert config == H3_33B.with_gates()
    assert (config.adaln_out_features, config.final_adaln_out_features) == (96768, 10752)
    assert (config.inner_dim, config.video_patch_dim, config.rotary_dim) == (7168, 96, 96)


def test_native_and_diffusers_spelling_of_one_field_is_refused():
    """A config naming the same field in both spellings is an error naming the field."""
    with pytest.raises(ValueError, match="ffn_hidden_size"):
        H3Config.from_diffusers_config({"ffn_dim": 12, "ffn_hidden_size": 12})


def test_inconsistent_derived_field_is_refused():
    """A stored adaln_out_features other than 18·H is refused with both numbers."""
    with pytest.raises(ValueError, match="1728.*got 100"):
        H3Config(hidden_size=96, adaln_out_features=100)


def test_rotary_width_must_leave_passthrough_channels():
    """6·rope_inv_freq_len must stay below the head dim (partial RoPE)."""
    with pytest.raises(ValueError, match="rotary width"):
        H3Config(attention_head_dim=24, rope_inv_freq_len=4)
