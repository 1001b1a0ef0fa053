"""Diffusers -> native DiT loading: name map, layout rules (§3.2-§3.4), every §3.5 error, key counts, directories."""

import json
import logging

import pytest
import torch
from diffusers import MiniMaxH3Transformer3DModel
from safetensors.torch import save_file

from h3batch.worker.h3.config import H3_33B, T2
from h3batch.worker.h3.loader import (
    WeightFormat,
    assign_diffusers_weights,
    assign_native_weights,
    deinterleave_qkv,
    detect_weight_format,
    load_diffusers_weights,
    load_native_weights,
    load_transformer,
    map_diffusers_name,
    swap_fc1_halves,
)
from h3batch.worker.h3.model import H3Transformer, rope_inv_freq
from tests.worker.h3.dit.dit_oracle import gate_tensors, make_oracle, t2va_inputs


@pytest.fixture(scope="module")
def oracle_weights():
    """State dict of a randomised T2 diffusers model (fp32)."""
    return make_oracle(T2, seed=3).state_dict()


def fresh_model(gates: bool = False) -> H3Transformer:
    return H3Transformer(T2.with_gates(gates), dtype=torch.float32)


# Layout fixtures ----------------------------------------------------------------------------------------------------


def test_interleaved_qkv_row_order_example():
    """Native per-head interleaved QKV (2 heads, head_dim 2) re-orders rows as [0,1,6,7,2,3,8,9,4,5,10,11] (§3.2)."""
    rows = torch.arange(12, dtype=torch.float32)[:, None].expand(12, 3)
    reordered = deinterleave_qkv(rows, head_dim=2)
    assert reordered[:, 0].long().tolist() == [0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11]
    assert torch.equal(reordered[:, 1], reordered[:, 0])


def test_fc1_half_swap_example():
    """A 6x3 Diffusers SwiGLU weight W becomes cat(W[3:6], W[0:3]) (§3.3)."""
    weight = torch.arange(18, dtype=torch.float32).reshape(6, 3)
    assert torch.equal(swap_fc1_halves(weight), torch.cat((weight[3:6], weight[0:3])))


def test_inv_freq_two_frequencies_exact():
    """n = 2, theta = 1e4 gives inv_freq exactly [1.0, 0.01] in fp32 (§3.4)."""
    inv_freq = rope_inv_freq(2, 1e4)
    assert inv_freq.dtype == torch.float32 and inv_freq.device.type == "cpu"
    torch.testing.assert_close(inv_freq, torch.tensor([1.0, 0.01]), rtol=0, atol=0)


def test_inv_freq_h3_values():
    """The H3 buffer is 10000^(-k/16): 1.0, 0.56234133, 0.31622776, 0.17782794, 0.1, ..., 1.7782794e-4."""
    inv_freq = rope_inv_freq(16, 10000.0)
    expected_head = torch.tensor([1.0, 0.56234133, 0.31622776, 0.17782794, 0.1])
    torch.testing.assert_close(inv_freq[:5], expected_head, rtol=1e-6, atol=0)
    torch.testing.assert_close(inv_freq[-1], torch.tensor(1.7782794e-4), rtol=1e-6, atol=0)
    assert torch.equal(inv_freq, MiniMaxH3Transformer3DModel(num_layers=0, num_refiner_layers=0,
                                                             hidden_size=8, num_attention_heads=1,
                                                             attention_head_dim=128, text_dim=8, ffn_dim=8,
                                                             time_embed_hidden_dim=8, time_embed_dim=8,
                                                             freq_dim=8).rope.inv_freq)


def test_diffusers_fixture_loaded_set():
    """§3.5 fixture: q, k, v fill qkv thirds in order, fc1 halves swap, inv_freq is recomputed and counted."""
    hidden, inner, half = 3, 4, 3  # 2 heads x 2, fc1 rows 6
    q, k, v = (torch.randn(inner, hidden) for _ in range(3))
    mlp = torch.randn(2 * half, hidden)
    targets = {
        "blocks.0.attn.qkv_proj.weight": torch.zeros(3 * inner, hidden),
        "blocks.0.mlp.fc1.weight": torch.zeros(2 * half, hidden),
        "rope.inv_freq": torch.zeros(2),
    }
    weights = [
        ("transformer_blocks.0.attn.to_q.weight", q),
        ("transformer_blocks.0.attn.to_k.weight", k),
        ("transformer_blocks.0.attn.to_v.weight", v),
        ("transformer_blocks.0.ff.net.0.proj.weight", mlp),
    ]
    loaded = assign_diffusers_weights(targets, weights, rope_inv_freq(2, 1e4))
    assert loaded == {"blocks.0.attn.qkv_proj.weight", "blocks.0.mlp.fc1.weight", "rope.inv_freq"}
    assert torch.equal(targets["blocks.0.attn.qkv_proj.weight"], torch.cat((q, k, v)))
    assert torch.equal(targets["blocks.0.mlp.fc1.weight"], torch.cat((mlp[3:], mlp[:3])))
    assert torch.equal(targets["rope.inv_freq"], torch.tensor([1.0, 0.01]))


def test_native_fixture_loaded_set():
    """§3.5 native fixture: one QKV write in §3.2 order, fc1 unchanged, inv_freq neither loaded nor changed."""
    hidden, head_dim = 3, 2
    interleaved = torch.randn(12, hidden)
    fc1 = torch.randn(6, hidden)
    inv_freq = torch.tensor([7.0, 8.0])
    targets = {
        "blocks.0.attn.qkv_proj.weight": torch.zeros(12, hidden),
        "blocks.0.mlp.fc1.weight": torch.zeros(6, hidden),
        "rope.inv_freq": inv_freq.clone(),
    }
    weights = {"blocks.0.attn.qkv_proj.weight": interleaved, "blocks.0.mlp.fc1.weight": fc1}
    loaded = assign_native_weights(targets, weights, head_dim=head_dim)
    assert loaded == {"blocks.0.attn.qkv_proj.weight", "blocks.0.mlp.fc1.weight"}
    assert torch.equal(targets["blocks.0.attn.qkv_proj.weight"], interleaved[[0, 1, 6, 7, 2, 3, 8, 9, 4, 5, 10, 11]])
    assert torch.equal(targets["blocks.0.mlp.fc1.weight"], fc1)
    assert torch.equal(targets["rope.inv_freq"], inv_freq)


def test_refiner_prefix_is_matched_before_block_prefix():
    """Refiner keys map to token_refiner.blocks.j, DiT keys to blocks.i; nothing is substring-replaced."""
    assert map_diffusers_name("token_refiner.refiner_blocks.1.attn.to_out.0.weight").name == (
        "token_refiner.blocks.1.attn.out_proj.weight"
    )
    assert map_diffusers_name("transformer_blocks.12.ff.net.2.weight").name == "blocks.12.mlp.fc2.weight"
    assert map_diffusers_name("token_refiner.final_norm.weight").name == "token_refiner.final_norm.weight"
    target = map_diffusers_name("transformer_blocks.3.attn.to_k.weight")
    assert (target.name, target.qkv_part) == ("blocks.3.attn.qkv_proj.weight", "k")


def test_weight_format_detection_and_override():
    """The diffusers class name means Diffusers weights unless the caller overrides it."""
    config = {"_class_name": "MiniMaxH3Transformer3DModel"}
    assert detect_weight_format(config) is WeightFormat.DIFFUSERS
    assert detect_weight_format(config, WeightFormat.NATIVE) is WeightFormat.NATIVE
    assert detect_weight_format({"hidden_size": 5376}) is WeightFormat.NATIVE


# Key counts on the real config ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_diffusers_meta_weights():
    """The 33B diffusers state dict on the meta device plus the 50 V2 gate names (688 keys)."""
    with torch.device("meta"):
        oracle = MiniMaxH3Transformer3DModel()
    weights = dict(oracle.state_dict())
    for i in range(H3_33B.num_layers):
        weights[f"transformer_blocks.{i}.attn.to_gate_compress.weight"] = torch.empty(
            H3_33B.inner_dim, H3_33B.hidden_size, dtype=torch.bfloat16, device="meta"
        )
    return weights


def test_real_key_counts(real_diffusers_meta_weights):
    """Diffusers has 638 keys (688 with gates); native has 535 (585 with gates), built on the meta device."""
    assert len([k for k in real_diffusers_meta_weights if "to_gate_compress" not in k]) == 638
    assert len(real_diffusers_meta_weights) == 688
    with torch.device("meta"):
        assert len(H3Transformer(H3_33B).state_dict()) == 535
        assert len(H3Transformer(H3_33B.with_gates()).state_dict()) == 585


def test_name_map_is_a_bijection_except_qkv(real_diffusers_meta_weights):
    """The 688 D names cover every native key but rope.inv_freq; only qkv_proj receives three names."""
    with torch.device("meta"):
        native_keys = set(H3Transformer(H3_33B.with_gates()).state_dict())
    targets: dict[str, list[str]] = {}
    for name in real_diffusers_meta_weights:
        targets.setdefault(map_diffusers_name(name).name, []).append(name)
    assert set(targets) == native_keys - {"rope.inv_freq"}
    multiple = {n for n, sources in targets.items() if len(sources) > 1}
    assert multiple == {n for n in native_keys if n.endswith("attn.qkv_proj.weight")}
    assert all(len(targets[n]) == 3 for n in multiple)


def test_real_config_meta_load_dtypes(real_diffusers_meta_weights):
    """Loading the 688-key V2 layout on meta succeeds; exactly 12 boundary tensors + rope.inv_freq are fp32."""
    with torch.device("meta"):
        model = H3Transformer(H3_33B.with_gates())
    loaded = load_diffusers_weights(model, real_diffusers_meta_weights)
    state = model.state_dict()
    assert loaded == set(state)
    fp32 = sorted(n for n, t in state.items() if t.dtype == torch.float32)
    assert len(fp32) == 13 and "rope.inv_freq" in fp32
    assert all(t.dtype == torch.bfloat16 for n, t in state.items() if n not in fp32)


# §3.5 errors ---------------------------------------------------------------------------------------------------------


def test_duplicate_weight(oracle_weights):
    """The same Diffusers name twice is refused, naming it."""
    weights = list(oracle_weights.items()) + [("proj_in.bias", oracle_weights["proj_in.bias"])]
    with pytest.raises(ValueError, match=r"duplicate Diffusers H3 weight: proj_in\.bias"):
        load_diffusers_weights(fresh_model(), weights)


@pytest.mark.parametrize(
    "name", ["transformer_blocks.0.attn.not_a_projection.weight", "proj_in.scale", "pos_embed.weight"]
)
def test_unsupported_weight(oracle_weights, name):
    """A module path outside the tables, or a leaf other than weight/bias, is refused naming the key."""
    weights = dict(oracle_weights, **{name: torch.zeros(3)})
    with pytest.raises(ValueError, match=f"unsupported Diffusers H3 weight: {name}"):
        load_diffusers_weights(fresh_model(), weights)


@pytest.mark.parametrize(
    "name, shape",
    [
        ("transformer_blocks.0.attn.to_gate_compress.weight", (128, 96)),  # gates not enabled
        ("token_refiner.refiner_blocks.0.adaln_proj.linear.weight", (1728, 48)),  # refiner has no AdaLN
        ("transformer_blocks.3.norm1.weight", (96,)),  # T2 has 3 blocks
        ("transformer_blocks.0.norm1.bias", (96,)),  # RMSNorm has no bias
    ],
)
def test_weight_without_model_parameter(oracle_weights, name, shape):
    """A mapped target the model lacks is refused naming the Diffusers key."""
    weights = dict(oracle_weights, **{name: torch.zeros(shape)})
    with pytest.raises(ValueError, match=f"Diffusers H3 weight has no model parameter: {name}"):
        load_diffusers_weights(fresh_model(), weights)


def test_fc1_rows_must_split_evenly(oracle_weights):
    """An fc1 with an odd row count is refused quoting its shape."""
    weights = dict(oracle_weights)
    weights["transformer_blocks.1.ff.net.0.proj.weight"] = torch.zeros(319, 96)
    message = r"fc1 checkpoint rows must split evenly into gate/up matrices, got \(319, 96\)"
    with pytest.raises(ValueError, match=message):
        load_diffusers_weights(fresh_model(), weights)


def test_incomplete_qkv_group(oracle_weights):
    """A qkv_proj that got q and v but no k is refused naming the group and the parts received."""
    weights = {k: v for k, v in oracle_weights.items() if k != "transformer_blocks.1.attn.to_k.weight"}
    message = r"incomplete Diffusers H3 QKV group blocks\.1\.attn\.qkv_proj\.weight: \['q', 'v'\]"
    with pytest.raises(ValueError, match=message):
        load_diffusers_weights(fresh_model(), weights)


def test_v2_missing_one_gate(oracle_weights):
    """A V2 (gated) load with block 2's gate removed fails naming exactly that gate."""
    gates = gate_tensors(T2, seed=None)
    del gates["transformer_blocks.2.attn.to_gate_compress.weight"]
    with pytest.raises(ValueError, match=r"missing compression gates: \['blocks\.2\.attn\.to_gate_compress\.weight'\]"):
        load_diffusers_weights(fresh_model(gates=True), {**oracle_weights, **gates})


@pytest.mark.parametrize(
    "name, shape, expected",
    [
        ("transformer_blocks.0.norm1.weight", (95,), "[95] vs [96]"),
        ("transformer_blocks.2.attn.to_v.weight", (96, 96), "[96, 96] vs [128, 96]"),
        ("transformer_blocks.0.ff.net.0.proj.weight", (318, 96), "[318, 96] vs [320, 96]"),
    ],
)
def test_shape_mismatch(oracle_weights, name, shape, expected):
    """A tensor whose shape differs from its parameter (or QKV third) is refused with both shapes."""
    weights = dict(oracle_weights, **{name: torch.zeros(shape)})
    with pytest.raises(ValueError, match=f"shape mismatch for {name}: " + expected.replace("[", r"\[")):
        load_diffusers_weights(fresh_model(), weights)


def test_missing_weights(oracle_weights):
    """A checkpoint without proj_out.bias fails listing the native name never written."""
    weights = {k: v for k, v in oracle_weights.items() if k != "proj_out.bias"}
    with pytest.raises(ValueError, match=r"missing H3 weights: \['final_layer\.video_out\.bias'\]"):
        load_diffusers_weights(fresh_model(), weights)


def test_tensors_are_cast_to_parameter_dtype(oracle_weights):
    """fp32 checkpoint tensors land in bf16 block parameters and stay fp32 in boundary modules."""
    model = H3Transformer(T2)
    load_diffusers_weights(model, oracle_weights)
    assert model.blocks[0].attn.qkv_proj.weight.dtype == torch.bfloat16
    assert torch.equal(model.blocks[0].attn.qkv_proj.weight[:128], oracle_weights[
        "transformer_blocks.0.attn.to_q.weight"].to(torch.bfloat16))
    assert torch.equal(model.video_patch_proj.weight, oracle_weights["proj_in.weight"])


def test_native_unknown_names_warn_and_skip(oracle_weights, caplog):
    """A native state dict with an extra unknown key loads, logging the skipped name; duplicates are refused."""
    source = fresh_model()
    load_diffusers_weights(source, oracle_weights)
    weights = dict(source.state_dict())
    weights["blocks.0.attn.unknown_proj.weight"] = torch.zeros(2, 2)
    target = fresh_model()
    with caplog.at_level(logging.WARNING, logger="h3batch.worker.h3.loader"):
        load_native_weights(target, weights, interleaved_qkv=False)
    assert "blocks.0.attn.unknown_proj.weight" in caplog.text
    assert all(torch.equal(t, target.state_dict()[n]) for n, t in source.state_dict().items())
    with pytest.raises(ValueError, match=r"duplicate native H3 weight: condition_proj\.bias"):
        load_native_weights(target, list(weights.items()) + [("condition_proj.bias", weights["condition_proj.bias"])])


# Checkpoint directories ---------------------------------------------------------------------------------------------


def _save_sharded(directory, config: dict, weights: dict[str, torch.Tensor], shards: int) -> None:
    """config.json + `shards` safetensors files + the diffusers index json."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    names = sorted(weights)
    weight_map = {}
    for s in range(shards):
        filename = f"diffusion_pytorch_model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: weights[n].contiguous() for n in names[s::shards]}
        save_file(part, str(directory / filename))
        weight_map.update({n: filename for n in part})
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (directory / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(index))


def test_load_v2_directory_matches_in_memory_load(tmp_path):
    """A sharded V2 transformer/ directory (diffusers' own save + a gate shard) loads to the in-memory load's tensors."""
    oracle = make_oracle(T2, seed=4)
    oracle.save_pretrained(tmp_path / "saved", max_shard_size="400KB")  # diffusers' own sharded layout
    assert len(list((tmp_path / "saved").glob("*.safetensors"))) > 1
    gates = gate_tensors(T2, seed=9)
    save_file(gates, str(tmp_path / "saved" / "gates.safetensors"))
    index_path = tmp_path / "saved" / "diffusion_pytorch_model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"].update({n: "gates.safetensors" for n in gates})
    index_path.write_text(json.dumps(index))

    model = load_transformer(tmp_path / "saved", vsa_gates=True)
    reference = H3Transformer(T2.with_gates())
    load_diffusers_weights(reference, {**oracle.state_dict(), **gates})
    state, expected = model.state_dict(), reference.state_dict()
    assert set(state) == set(expected)
    for name, tensor in expected.items():
        assert state[name].dtype == tensor.dtype and torch.equal(state[name], tensor), name
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    video, audio = model(**t2va_inputs(T2).kwargs())
    assert video.shape == (1, 18, 96) and torch.isfinite(video).all() and torch.isfinite(audio).all()


def test_load_directory_missing_gate_fails(tmp_path, oracle_weights):
    """A V2 directory whose shards lack one gate fails naming it."""
    gates = gate_tensors(T2, seed=None)
    del gates["transformer_blocks.0.attn.to_gate_compress.weight"]
    config = {"_class_name": "MiniMaxH3Transformer3DModel", **T2.to_diffusers_config()}
    _save_sharded(tmp_path / "transformer", config, {**oracle_weights, **gates}, shards=3)
    with pytest.raises(ValueError, match=r"missing compression gates: \['blocks\.0\.attn\.to_gate_compress\.weight'\]"):
        load_transformer(tmp_path / "transformer", vsa_gates=True)


def test_load_native_directory_with_interleaved_qkv(tmp_path, oracle_weights):
    """A native-format directory (per-head interleaved QKV) loads to the same tensors as the Diffusers load."""
    reference = H3Transformer(T2)
    load_diffusers_weights(reference, oracle_weights)
    native = {}
    head_dim = T2.attention_head_dim
    for name, tensor in reference.state_dict().items():
        if name.endswith("attn.qkv_proj.weight"):  # [Q; K; V] -> [h0:q, h0:k, h0:v, h1:q, ...]
            heads = tensor.shape[0] // (3 * head_dim)
            tensor = tensor.reshape(3, heads, head_dim, -1).transpose(0, 1).reshape(tensor.shape)
        native[name] = tensor
    _save_sharded(tmp_path / "native", {"_class_name": "MiniMaxH3Transformer3DModel", **T2.to_diffusers_config()},
                  native, shards=2)
    model = load_transformer(tmp_path / "native", vsa_gates=False, weight_format=WeightFormat.NATIVE)
    for name, tensor in reference.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name


def test_index_naming_a_missing_shard_fails(tmp_path, oracle_weights):
    """An index that lists a shard file not on disk is refused naming the path."""
    config = {"_class_name": "MiniMaxH3Transformer3DModel", **T2.to_diffusers_config()}
    _save_sharded(tmp_path / "t", config, oracle_weights, shards=2)
    (tmp_path / "t" / "diffusion_pytorch_model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ValueError, match="00002-of-00002.safetensors"):
        load_transformer(tmp_path / "t", vsa_gates=False)
