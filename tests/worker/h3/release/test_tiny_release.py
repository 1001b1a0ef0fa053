"""`h3batch build-tiny`: layout, dtypes, determinism and loadability of the tiny release (spec §6.1, §3.1, §2.2)."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from h3batch.worker.h3 import tiny_release
from h3batch.worker.h3.tiny_configs import TINY_TEXT_ENCODER
from h3batch.worker.h3.tiny_release import build_tiny_release

REPO = Path(__file__).resolve().parents[4]

BOUNDARY = {
    f"{module}.{leaf}"
    for module in ("proj_in", "audio_proj_in", "time_embedder.linear_1", "time_embedder.linear_2", "proj_out",
                   "audio_proj_out")
    for leaf in ("weight", "bias")
}
T2_DIFFUSERS = {
    "num_attention_heads": 4, "attention_head_dim": 32, "hidden_size": 96, "num_layers": 3, "num_refiner_layers": 2,
    "ffn_dim": 160, "text_dim": 80, "in_channels": 24, "audio_in_channels": 32, "patch_size": [1, 2, 2],
    "freq_dim": 16, "time_embed_hidden_dim": 96, "time_embed_dim": 48, "rope_freq_dim": 4,
}


def _tree_digest(*roots: Path) -> dict[str, str]:
    """sha256 of every file under the roots (symlinks: their target text), keyed by relative path."""
    digest = {}
    for root in roots:
        for path in sorted(root.rglob("*")):
            key = f"{root.name}/{path.relative_to(root)}"
            if path.is_symlink():
                digest[key] = "link:" + os.readlink(path)
            elif path.is_file():
                digest[key] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digest


def _load_transformer_state(release: Path) -> dict[str, torch.Tensor]:
    tdir = release / "transformer"
    index = json.loads((tdir / "diffusion_pytorch_model.safetensors.index.json").read_text())
    state = {}
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(str(tdir / shard), framework="pt") as f:
            for key in f.keys():
                state[key] = f.get_tensor(key)
    assert set(state) == set(index["weight_map"])
    return state


def test_release_file_layout(tiny):
    """The release holds the V2 files (§6.1): contract, provenance, modular index, sharded transformer, conditioner."""
    root = tiny.release_dir
    files = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
    shards = sorted(f for f in files if f.startswith("transformer/diffusion_pytorch_model-"))
    assert len(shards) >= 2
    assert all(s.endswith(f"-of-{len(shards):05d}.safetensors") for s in shards)
    assert {
        "fastvideo_inference.json", "provenance.json", "modular_model_index.json", "transformer/config.json",
        "transformer/diffusion_pytorch_model.safetensors.index.json", "text_encoder/config.json",
        "text_encoder/model.safetensors", "tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json",
        "scheduler/scheduler_config.json", "audio_scheduler/scheduler_config.json",
    } <= files
    folders = ("scheduler", "audio_scheduler")
    shifts = [json.loads((root / d / "scheduler_config.json").read_text())["shift"] for d in folders]
    assert shifts == [10.0, 3.0]
    contract_json = json.loads((root / "fastvideo_inference.json").read_text())
    assert contract_json["model_id"] == "h3batch/FastH3-8-Step-V2-tiny" and len(contract_json) == 11
    assert json.loads((root / "provenance.json").read_text()) == {
        "base_model": f"hf://MiniMaxAI/MiniMax-H3@{tiny.base_commit}"
    }
    assert json.loads((root / "modular_model_index.json").read_text())["_class_name"] == "MiniMaxH3ModularPipeline"


def test_transformer_config_is_t2_in_diffusers_names(tiny):
    """transformer/config.json is diffusers' own config of T2 (§2.2) under `MiniMaxH3Transformer3DModel`."""
    config = json.loads((tiny.release_dir / "transformer" / "config.json").read_text())
    assert config["_class_name"] == "MiniMaxH3Transformer3DModel"
    assert {k: config[k] for k in T2_DIFFUSERS} == T2_DIFFUSERS


def test_transformer_tensors_gates_and_dtypes(tiny):
    """77 tensors: a bf16 [I, H] gate per DiT block, fp32 for exactly the 12 boundary tensors, non-zero AdaLN."""
    state = _load_transformer_state(tiny.release_dir)
    assert len(state) == 77
    gates = sorted(k for k in state if "to_gate_compress" in k)
    assert gates == [f"transformer_blocks.{i}.attn.to_gate_compress.weight" for i in range(3)]
    assert all(state[g].shape == (128, 96) and state[g].dtype == torch.bfloat16 for g in gates)
    assert {k for k, v in state.items() if v.dtype == torch.float32} == BOUNDARY
    assert all(v.dtype == torch.bfloat16 for k, v in state.items() if k not in BOUNDARY)
    for i in range(3):
        adaln = state[f"transformer_blocks.{i}.adaln_proj.linear.weight"]
        assert adaln.shape == (18 * 96, 48) and adaln.float().abs().mean() > 1e-2


def test_diffusers_model_loads_release_and_gives_finite_nontrivial_output(tiny):
    """The diffusers oracle loads transformer/ (gates ignored, §14.7) and a packed forward is finite and non-zero."""
    from diffusers import MiniMaxH3Transformer3DModel

    model = MiniMaxH3Transformer3DModel.from_pretrained(tiny.release_dir / "transformer", torch_dtype=torch.bfloat16)
    model = model.eval()
    assert model.proj_in.weight.dtype == torch.float32 and model.norm_out.linear.weight.dtype == torch.bfloat16
    gen = torch.Generator().manual_seed(0)
    L, A, V = 4, 3, 8  # text rows, audio rows, video rows
    S = L + A + V
    tags = torch.tensor([1] * L + [2] * A + [0] * V)
    with torch.no_grad():
        video, audio = model(
            hidden_states=torch.randn(1, V, 96, generator=gen),
            audio_hidden_states=torch.randn(1, A, 32, generator=gen),
            encoder_hidden_states=torch.randn(1, L, 80, generator=gen),
            timestep=torch.tensor([0.1, 0.3]),
            timestep_indices=(tags == 2).long(),
            token_tags=tags,
            position_ids=torch.rand(S, 3, generator=gen, dtype=torch.float64) * 8,
            video_indices=torch.arange(L + A, S),
            audio_indices=torch.arange(L, L + A),
            text_indices=torch.arange(L),
            return_dict=False,
        )
    assert video.shape == (1, V, 96) and audio.shape == (1, A, 32)
    for out in (video, audio):
        assert torch.isfinite(out).all() and 0.05 < out.float().std() < 100


def test_tokenizer_and_text_encoder_load_with_transformers(tiny):
    """AutoTokenizer and Qwen3-VL load from the folders; vision token ids agree; the chosen layer is finite."""
    from transformers import AutoTokenizer, Qwen3VLForConditionalGeneration

    tok = AutoTokenizer.from_pretrained(tiny.release_dir / "tokenizer")
    assert type(tok).__name__ == "Qwen2Tokenizer" and len(tok) == TINY_TEXT_ENCODER["text_config"]["vocab_size"]
    for token, key in (("<|image_pad|>", "image_token_id"), ("<|video_pad|>", "video_token_id"),
                       ("<|vision_start|>", "vision_start_token_id"), ("<|vision_end|>", "vision_end_token_id")):
        assert tok.convert_tokens_to_ids(token) == TINY_TEXT_ENCODER[key]
    prompt = "A small robot rolls through a quiet library at night."
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == prompt and 4 <= len(ids) < len(prompt)
    model = Qwen3VLForConditionalGeneration.from_pretrained(tiny.release_dir / "text_encoder").eval()
    input_ids = torch.tensor([ids])
    with torch.no_grad():
        hidden = model.model(
            input_ids=input_ids, attention_mask=torch.ones_like(input_ids), use_cache=False, output_hidden_states=True
        ).hidden_states
    layer = tiny_release.TINY_ENTRY.text_hidden_layer
    assert len(hidden) == 4 and layer == 2
    assert hidden[layer].shape == (1, len(ids), 80) and torch.isfinite(hidden[layer].float()).all()


def test_same_seed_gives_byte_identical_files(tiny, tmp_path):
    """A second build with the same seed reproduces every release and cache file byte for byte."""
    again = build_tiny_release(tmp_path / "release", tmp_path / "hf-cache", seed=0)
    assert again.base_commit == tiny.base_commit
    first = _tree_digest(tiny.release_dir, tiny.hf_cache)
    assert _tree_digest(again.release_dir, again.hf_cache) == first
    assert len(first) > 30


def test_other_seed_gives_other_weights_and_commit(tiny, tmp_path):
    """A different seed changes the weights and therefore the pinned base commit."""
    other = build_tiny_release(tmp_path / "release", tmp_path / "hf-cache", seed=1)
    assert other.base_commit != tiny.base_commit
    a, b = _load_transformer_state(tiny.release_dir), _load_transformer_state(other.release_dir)
    assert not torch.equal(a["proj_in.weight"], b["proj_in.weight"])


def test_build_is_fast(tiny):
    """The build (imports excluded) stays well under the 60 s budget on 2 cores."""
    assert tiny.seconds < 60


def test_cli_refuses_non_empty_out_dir(tiny, capsys):
    """`build-tiny --out` on a non-empty directory exits 2 with one line and writes nothing."""
    before = _tree_digest(tiny.release_dir)
    code = tiny_release.main(["--out", str(tiny.release_dir), "--hf-cache", str(tiny.hf_cache)])
    lines = capsys.readouterr().err.splitlines()
    assert code == 2 and len(lines) == 1 and "empty" in lines[0]
    assert _tree_digest(tiny.release_dir) == before


def test_cli_if_absent_keeps_a_valid_release_and_refuses_a_broken_one(tiny, tmp_path, capsys):
    """`build-tiny --if-absent` (compose's model-init, run on every `up`): a valid release in OUT is kept (exit 0,
    nothing written); a non-empty OUT that is no valid release exits 2 with one line naming the problem."""
    before = _tree_digest(tiny.release_dir, tiny.hf_cache)
    code = tiny_release.main(["--if-absent", "--out", str(tiny.release_dir), "--hf-cache", str(tiny.hf_cache)])
    assert code == 0 and "nothing written" in capsys.readouterr().out
    assert _tree_digest(tiny.release_dir, tiny.hf_cache) == before
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "half-written.safetensors").write_bytes(b"x")
    code = tiny_release.main(["--if-absent", "--out", str(broken), "--hf-cache", str(tmp_path / "hf-cache")])
    lines = capsys.readouterr().err.splitlines()
    assert code == 2 and len(lines) == 1 and "no valid release" in lines[0]
    assert sorted(p.name for p in broken.iterdir()) == ["half-written.safetensors"]


def test_cli_in_a_fresh_process_reproduces_the_build_in_the_default_cache(tiny, tmp_path):
    """`h3batch build-tiny` run as a new process (own hash seed) writes the same bytes, cache at OUT/../hf-cache."""
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_CACHE"}
    env["PYTHONHASHSEED"] = "12345"
    run = subprocess.run(
        [sys.executable, "-P", "-m", "h3batch.cli", "build-tiny", "--out", str(tmp_path / "release"), "--seed", "0"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert tiny.base_commit in run.stdout
    assert _tree_digest(tmp_path / "release", tmp_path / "hf-cache") == _tree_digest(tiny.release_dir, tiny.hf_cache)


@pytest.mark.parametrize("argv", [[], ["--out"], ["--out", "x", "--seed", "abc"]])
def test_cli_bad_arguments_one_line(argv, capsys):
    """Bad arguments exit 2 with a single line."""
    with pytest.raises(SystemExit) as exit_:
        tiny_release.main(argv)
    assert exit_.value.code == 2 and len(capsys.readouterr().err.splitlines()) == 1


def _store_only_layers(text_encoder_dir: Path, out: Path, layers: int) -> None:
    """Copy a Qwen3-VL checkpoint keeping decoder layers 0..layers-1 (config and tensors), as FastVideo ships it."""
    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True)
    config = json.loads((text_encoder_dir / "config.json").read_text())
    config["text_config"]["num_hidden_layers"] = layers
    if "layer_types" in config["text_config"]:
        config["text_config"]["layer_types"] = config["text_config"]["layer_types"][:layers]
    (out / "config.json").write_text(json.dumps(config))
    state = {}
    for shard in sorted(text_encoder_dir.glob("*.safetensors")):
        for name, tensor in load_file(shard).items():
            index = name.split("language_model.layers.")[1].split(".")[0] if "language_model.layers." in name else None
            if index is None or int(index) < layers:
                state[name] = tensor
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    for extra in text_encoder_dir.iterdir():
        if extra.suffix != ".safetensors" and extra.name not in ("config.json", "model.safetensors.index.json"):
            (out / extra.name).write_bytes(extra.read_bytes())


def test_text_encoder_storing_exactly_the_layers_read_gives_identical_features(tiny, release_copy):
    """A tiny release whose encoder stores exactly hidden_layer layers loads and encodes bit-identically to the full."""
    import shutil

    from h3batch.worker.h3.contract import find_violations
    from h3batch.worker.h3.text_encoder import TextEncoder

    layer = tiny_release.TINY_ENTRY.text_hidden_layer
    assert layer < TINY_TEXT_ENCODER["text_config"]["num_hidden_layers"]  # the built release stores more
    shutil.rmtree(release_copy / "text_encoder")
    _store_only_layers(tiny.release_dir / "text_encoder", release_copy / "text_encoder", layer)
    assert find_violations(release_copy) == []
    stored = json.loads((release_copy / "text_encoder" / "config.json").read_text())
    assert stored["text_config"]["num_hidden_layers"] == layer

    prompt = "A cat sleeps on a sunny windowsill while the curtains move gently in the breeze."
    full = TextEncoder.load(tiny.release_dir / "text_encoder", tiny.release_dir / "tokenizer", layer, "cpu")
    exact = TextEncoder.load(release_copy / "text_encoder", release_copy / "tokenizer", layer, "cpu")
    (a, length_a), (b, length_b) = full.encode(prompt), exact.encode(prompt)
    assert length_a == length_b and a.dtype == b.dtype == torch.bfloat16
    assert torch.equal(a, b)
