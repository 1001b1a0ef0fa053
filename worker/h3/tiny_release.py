"""``h3batch build-tiny``: a deterministic random-weight release in the exact FastH3 V2 layout, plus its base repo.

Writes into ``--out`` (spec §6.1): ``fastvideo_inference.json`` (the tiny registry entry's contract),
``provenance.json`` (pinned to the tiny base repo's commit), ``modular_model_index.json``, ``h3batch_canvas.json``
(the tiny canvas: 256x128 by default, buckets at 256·128 pixels), ``transformer/`` (Diffusers
config of DiT config T2 + >= 2 safetensors shards + index, with one bf16 ``to_gate_compress`` per DiT block, fp32 for
the 12 boundary tensors), ``text_encoder/`` (tiny Qwen3-VL) and ``tokenizer/`` (a byte-level BPE trained offline on a
built-in text, saved as ``Qwen2Tokenizer``), ``scheduler/`` + ``audio_scheduler/`` (shift 10 / 3; ignored by
h3batch, present for layout fidelity). No ``processor/``: loading ``Qwen3VLProcessor`` needs torchvision's
image/video processors, and the text path does not use it (see ``worker/h3/text_encoder.py``).

Into the Hugging Face cache (``--hf-cache``, default ``$HF_HUB_CACHE`` or ``<out>/../hf-cache``) it writes a tiny
``MiniMaxAI/MiniMax-H3`` in the hub cache layout (``blobs/``, ``snapshots/<commit>/``, ``refs/main``, ``trees/``):
``FL2VA/video_vae/`` and ``FL2VA/audio_vae/`` in MiniMax's native format, converted from randomised diffusers VAEs
with ``worker/h3/vae_checkpoint_convert.py``'s table, plus files outside the two VAE patterns that a correct fetch
never touches. The cache is written by hand because huggingface_hub only fills it from a live Hub; blob names, the
LFS pointer ``blob_id`` and the tree listing follow what ``snapshot_download`` itself stores. The commit id is a sha1
over the repo's file list, so it is a pure function of the seed.

``place_release_in_hub_cache`` (``--hub-repo ORG/NAME``) puts the built release itself into that cache the same way,
as a Hub repo at a commit, so a Hub reference (``--release ORG/NAME@revision``) is testable offline.

``build-tiny --kind native`` (``build_tiny_native_release``) writes the native MiniMax-H3 layout instead
(worker/h3/contract.py, docs/model.md "The native release"): ``modular_model_index.json``, ``transformer/`` (DiT
config T2 without compression gates), ``transformer_ref/`` (the Ref2VA partition: same config, its own weights),
``vae/`` and ``audio_vae/`` in Diffusers format (the same tiny configs as the V2 base repo's), ``scheduler/`` and
``audio_scheduler/`` (shift 12 / 3, the published values), the conditioner and ``processor/`` (the Qwen3-VL image
processor's config), ``h3batch_canvas.json`` and
``h3batch_sampling.json`` (4 grid points, i.e. 3 forwards instead of the published 50 / 49, and text-encoder layer 2
of the 3-layer tiny Qwen3-VL). It needs no hub cache: a native release carries its own VAEs.

Same seed -> byte-identical files. Every tensor is drawn from one seeded CPU ``torch.Generator`` per component, in
sorted-name order, at a scale that keeps the tiny models' outputs finite and non-trivial.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save as safetensors_bytes

from h3batch.cli_args import OneLineArgumentParser
from h3batch.core.geometry import TINY_CANVAS
from h3batch.worker.h3 import contract
from h3batch.worker.h3.config import DIFFUSERS_TO_NATIVE_FIELD, T2, H3Config
from h3batch.worker.h3.tiny_configs import TINY_AUDIO_VAE, TINY_TEXT_ENCODER, TINY_TEXT_HIDDEN_LAYER, TINY_VIDEO_VAE
from h3batch.worker.h3.vae_checkpoint_convert import (
    AUDIO_VAE_RULES,
    VIDEO_VAE_RULES,
    audio_config_to_native,
    diffusers_to_native,
    video_config_to_native,
)

TINY_ENTRY = contract.FASTH3_V2_TINY
TINY_DIT_CONFIG: H3Config = T2
SHARD_PATTERN = "diffusion_pytorch_model{suffix}.safetensors"

# Component seeds are offsets from the --seed value, so components never share a random stream.
_TRANSFORMER, _TEXT_ENCODER, _VIDEO_VAE, _AUDIO_VAE, _REF_TRANSFORMER = range(5)
NATIVE_TINY_MODEL_ID = "h3batch/MiniMax-H3-native-tiny"
NATIVE_TINY_SAMPLING = {"num_inference_steps": 4, "text_encoder_layer": TINY_TEXT_HIDDEN_LAYER}
"""4 grid points (3 forwards) keep a CPU render short; the published release runs diffusers' 50 (49 forwards)."""
NATIVE_TINY_REFERENCE_SHORT_EDGE = 128
"""ref2va references are encoded at a 128-pixel short edge in the tiny release (2048 in the published one)."""

# Fixed built-in text the tokenizer is trained on (prompt-like English, so tiny prompts tokenize compactly).
_TOKENIZER_CORPUS = """\
A red fox runs across a snowy field at dawn, its breath visible in the cold air.
Waves crash against black rocks while seagulls circle above the stormy sea.
A street musician plays the violin under warm lamps as people walk past in the rain.
Close-up of a chef slicing fresh vegetables on a wooden board, the knife tapping steadily.
A small robot rolls through a quiet library, its lights blinking softly between the shelves.
Children laugh and splash in a fountain on a bright summer afternoon in the city square.
An old train crosses a stone bridge over a green valley, steam rising into the clouds.
A cat sleeps on a sunny windowsill while the curtains move gently in the breeze.
Fireworks burst over a river at night, reflections shimmering on the dark water.
A drummer counts in the band and the crowd cheers as the first chord rings out.
Snow falls on a mountain cabin; inside, a kettle whistles and a fire crackles.
The camera slowly pans across a desert at sunset, wind drawing lines in the sand.
"""
_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_VISION_TOKENS = (
    ("<|vision_start|>", "vision_start_token_id"),
    ("<|vision_end|>", "vision_end_token_id"),
    ("<|image_pad|>", "image_token_id"),
    ("<|video_pad|>", "video_token_id"),
)

_UNRELATED_BASE_FILES = {
    # Outside FL2VA/video_vae/** and FL2VA/audio_vae/**: a correct fetch neither downloads nor reads them.
    "README.md": b"# MiniMax-H3 (h3batch tiny stand-in)\n\nRandom weights for tests. Not a model.\n",
    "model_index.json": json.dumps(
        {"_minimax_h3": {"sigma_shift_scales": {"video": 10.0, "audio": 3.0}}}, indent=2
    ).encode(),
    "FL2VA/video_vae_legacy/config.json": b'{"note": "near-miss folder name; must not match FL2VA/video_vae/**"}\n',
    "Ref2VA/video_vae/config.json": b'{"note": "other partition; must not match FL2VA/video_vae/**"}\n',
    "vae/config.json": b'{"_class_name": "AutoencoderKLMiniMaxH3", "note": "Diffusers-format VAE, not used"}\n',
}


@dataclass(frozen=True)
class TinyRelease:
    """Where a build put things."""

    release_dir: Path
    hf_cache: Path
    base_repo_id: str
    base_commit: str
    base_snapshot: Path
    seconds: float


# ---------------------------------------------------------------------------------------------------------------
# Random weights


def _generator(seed: int, component: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(1000 * seed + component)


def _random_tensor(
    name: str, shape: tuple[int, ...], default: torch.Tensor | None, gen: torch.Generator
) -> torch.Tensor:
    """One fp32 tensor: fan-in scaled matrices, small biases, constants (norm weights, scales) perturbed by 0.1."""
    leaf = name.rsplit(".", 1)[-1]
    noise = torch.randn(shape, generator=gen, dtype=torch.float32)
    if leaf == "bias":
        return 0.02 * noise
    if len(shape) >= 2 and leaf in ("weight", "weight_v"):
        return noise / math.sqrt(max(1, math.prod(shape[1:])))
    # Vectors and odd parameters (norm weights, ViT residual scales, Snake alphas, register tokens): keep the
    # constant the module initialises them to (1 or 0) and perturb it.
    base = 1.0 if default is not None and default.numel() and bool(torch.all(default == 1)) else 0.0
    return base + 0.1 * noise


def randomize_module_(module: torch.nn.Module, gen: torch.Generator) -> torch.nn.Module:
    """Overwrite every parameter in sorted-name order; weight-norm magnitudes follow their directions (w = v)."""
    params = dict(module.named_parameters())
    with torch.no_grad():
        for name in sorted(params):
            if name.endswith("weight_g"):
                continue
            p = params[name]
            p.copy_(_random_tensor(name, tuple(p.shape), p.detach(), gen))
        for name in sorted(params):
            if name.endswith("weight_g"):
                v = params[name[: -len("weight_g")] + "weight_v"]
                params[name].copy_(v.flatten(1).norm(dim=1).view(params[name].shape))
    return module


def diffusers_transformer_kwargs(config: H3Config) -> dict[str, Any]:
    """``MiniMaxH3Transformer3DModel`` kwargs for an ``H3Config`` (inverse of the seven-name alias rule, §2.1)."""
    native_to_diffusers = {n: d for d, n in DIFFUSERS_TO_NATIVE_FIELD.items()}
    skip = {"adaln_out_features", "final_adaln_out_features", "vsa_gates"}
    kwargs = {}
    for f in fields(config):
        if f.name not in skip:
            value = getattr(config, f.name)
            kwargs[native_to_diffusers.get(f.name, f.name)] = list(value) if isinstance(value, tuple) else value
    return kwargs


def random_transformer(seed: int, *, gates: bool = True, component: int = _TRANSFORMER):
    """(diffusers model with the tiny config, its full state dict in storage dtypes: V2's with the gates, or a native
    partition's without them when ``gates=False``)."""
    from diffusers import MiniMaxH3Transformer3DModel

    model = MiniMaxH3Transformer3DModel(**diffusers_transformer_kwargs(TINY_DIT_CONFIG))
    defaults = model.state_dict()
    shapes = {k: tuple(v.shape) for k, v in defaults.items()}
    inner, hidden = TINY_DIT_CONFIG.inner_dim, TINY_DIT_CONFIG.hidden_size
    for i in range(TINY_DIT_CONFIG.num_layers if gates else 0):
        shapes[f"transformer_blocks.{i}.attn.to_gate_compress.weight"] = (inner, hidden)  # [I, H], V2 only
    fp32_modules = set(model._keep_in_fp32_modules)
    gen = _generator(seed, component)
    state = {}
    for name in sorted(shapes):
        tensor = _random_tensor(name, shapes[name], defaults.get(name), gen)
        # Boundary modules are stored fp32 (§3.1), everything else bf16.
        state[name] = tensor if name.split(".")[0] in fp32_modules else tensor.to(torch.bfloat16)
    n_fp32 = sum(t.dtype == torch.float32 for t in state.values())
    if n_fp32 != 12:
        raise AssertionError(f"tiny transformer has {n_fp32} fp32 tensors, expected the 12 boundary tensors")
    return model, state


def random_video_vae(seed: int):
    from diffusers import AutoencoderKLMiniMaxH3

    return randomize_module_(AutoencoderKLMiniMaxH3(**TINY_VIDEO_VAE), _generator(seed, _VIDEO_VAE)).eval()


def random_audio_vae(seed: int):
    from diffusers import AutoencoderKLMiniMaxH3Audio

    return randomize_module_(AutoencoderKLMiniMaxH3Audio(**TINY_AUDIO_VAE), _generator(seed, _AUDIO_VAE)).eval()


def random_text_encoder(seed: int):
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    config = Qwen3VLConfig(**TINY_TEXT_ENCODER)
    if not 1 <= TINY_ENTRY.text_hidden_layer < config.text_config.num_hidden_layers:
        raise AssertionError("registry text_hidden_layer must read a pre-final-norm layer of the tiny encoder")
    if TINY_ENTRY.text_hidden_layer != TINY_TEXT_HIDDEN_LAYER:
        raise AssertionError(
            f"registry text layer {TINY_ENTRY.text_hidden_layer} != tiny_configs {TINY_TEXT_HIDDEN_LAYER}"
        )
    model = Qwen3VLForConditionalGeneration(config)
    return randomize_module_(model, _generator(seed, _TEXT_ENCODER)).to(torch.bfloat16).eval()


# ---------------------------------------------------------------------------------------------------------------
# Tokenizer


def build_tokenizer():
    """A ``Qwen2Tokenizer`` whose byte-level BPE is trained offline on ``_TOKENIZER_CORPUS``.

    Ids: BPE tokens first, then ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``, then the four vision tokens at
    the ids the tiny Qwen3-VL config names (the top of its vocabulary).
    """
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    vocab_size = TINY_TEXT_ENCODER["text_config"]["vocab_size"]
    vision_ids = [TINY_TEXT_ENCODER[key] for _, key in _VISION_TOKENS]
    first_special = vocab_size - len(_VISION_TOKENS) - len(_SPECIAL_TOKENS)
    if vision_ids != list(range(vocab_size - len(_VISION_TOKENS), vocab_size)):
        raise AssertionError(f"tiny text config must put the vision tokens at the top of the vocab, got {vision_ids}")

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence(  # the Qwen2 pre-tokenizer, so training sees the same words
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    trainer = trainers.BpeTrainer(
        vocab_size=first_special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_TOKENIZER_CORPUS.splitlines(), trainer=trainer)
    model = json.loads(bpe.to_str())["model"]
    vocab: dict[str, int] = dict(model["vocab"])
    if len(vocab) > first_special:
        raise AssertionError(f"trained BPE vocab {len(vocab)} exceeds {first_special}")
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    specials = list(_SPECIAL_TOKENS) + [tok for tok, _ in _VISION_TOKENS]
    for offset, token in enumerate(specials):
        vocab[token] = first_special + offset
    tokenizer = Qwen2Tokenizer(
        vocab=vocab,
        merges=merges,
        extra_special_tokens=[tok for tok, _ in _VISION_TOKENS] + ["<|im_start|>", "<|im_end|>"],
        model_max_length=4096,
    )
    return tokenizer


# ---------------------------------------------------------------------------------------------------------------
# Writers


def _json_bytes(data: Any) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _write_transformer(release: Path, seed: int, *, folder: str = contract.TRANSFORMER_DIR, gates: bool = True,
                       component: int = _TRANSFORMER) -> None:
    from huggingface_hub import save_torch_state_dict

    model, state = random_transformer(seed, gates=gates, component=component)
    tdir = release / folder
    tdir.mkdir(parents=True, exist_ok=True)
    model.save_config(tdir)  # diffusers' own config.json (every __init__ argument, _class_name, version)
    total = sum(t.numel() * t.element_size() for t in state.values())
    save_torch_state_dict(
        state, tdir, filename_pattern=SHARD_PATTERN, max_shard_size=total // 2 + 1, metadata={"format": "pt"}
    )
    shards = sorted(p.name for p in tdir.glob("*.safetensors"))
    if len(shards) < 2:
        raise AssertionError(f"expected >= 2 transformer shards, wrote {shards}")


def _write_text_encoder(release: Path, seed: int) -> None:
    random_text_encoder(seed).save_pretrained(release / contract.TEXT_ENCODER_DIR)
    build_tokenizer().save_pretrained(release / contract.TOKENIZER_DIR)


def _write_schedulers(release: Path) -> None:
    """scheduler/ and audio_scheduler/ as the V2 layout likely has them (§6.1; h3batch ignores both)."""
    from diffusers import MiniMaxH3Scheduler

    contract_values = TINY_ENTRY.contract
    MiniMaxH3Scheduler(shift=contract_values.video_scheduler_shift).save_pretrained(release / "scheduler")
    MiniMaxH3Scheduler(shift=contract_values.audio_scheduler_shift).save_pretrained(release / "audio_scheduler")


def _modular_index(model_id: str, *, native: bool = False) -> dict[str, Any]:
    import diffusers

    components = {
        "text_encoder": ("transformers", "Qwen3VLForConditionalGeneration"),
        "tokenizer": ("transformers", "Qwen2TokenizerFast"),
        "transformer": ("diffusers", "MiniMaxH3Transformer3DModel"),
        "scheduler": ("diffusers", "MiniMaxH3Scheduler"),
        "audio_scheduler": ("diffusers", "MiniMaxH3Scheduler"),
    }
    if native:  # the native release carries both partitions and its own VAEs (diffusers' component names)
        components.update({
            contract.REF_TRANSFORMER_DIR: ("diffusers", "MiniMaxH3Transformer3DModel"),
            contract.VIDEO_VAE_DIR: ("diffusers", contract.VIDEO_VAE_CLASS_NAME),
            contract.AUDIO_VAE_DIR: ("diffusers", contract.AUDIO_VAE_CLASS_NAME),
        })
    index: dict[str, Any] = {
        "_class_name": contract.MODULAR_CLASS_NAME,
        "_diffusers_version": diffusers.__version__,
        "_blocks_class_name": "MiniMaxH3Blocks",
    }
    for name, (library, cls) in components.items():
        spec = {"type_hint": [library, cls], "pretrained_model_name_or_path": model_id, "subfolder": name,
                "variant": None, "revision": None}
        index[name] = [library, cls, spec]
    return index


def base_repo_files(seed: int) -> dict[str, bytes]:
    """Every file of the tiny ``MiniMaxAI/MiniMax-H3`` (repo path -> bytes): native VAEs plus unrelated files."""
    video = random_video_vae(seed)
    video_native = diffusers_to_native(
        video.state_dict(), VIDEO_VAE_RULES, qkv_heads=TINY_VIDEO_VAE["decoder_num_attention_heads"]
    )
    # The native decoder also stores its (all-zero, unused) MAE mask token, which the mapping drops. Shape
    # [1, 1, width] is an assumption; nothing reads it.
    width = TINY_VIDEO_VAE["decoder_num_attention_heads"] * TINY_VIDEO_VAE["decoder_attention_head_dim"]
    video_native["decoder.mask_token"] = torch.zeros(1, 1, width)
    video_wrapper, video_source = video_config_to_native(TINY_VIDEO_VAE)
    audio = random_audio_vae(seed)
    audio_native = diffusers_to_native(audio.state_dict(), AUDIO_VAE_RULES)
    audio_metadata, audio_wrapper = audio_config_to_native(TINY_AUDIO_VAE)
    dummy_dit = {"blocks.0.attn.qkv_proj.weight": torch.zeros(6, 4, dtype=torch.bfloat16)}
    files = {
        "FL2VA/video_vae/config.json": _json_bytes(video_wrapper),
        "FL2VA/video_vae/source/config.json": _json_bytes(video_source),
        "FL2VA/video_vae/source/model.safetensors": safetensors_bytes(
            {k: v.contiguous() for k, v in sorted(video_native.items())}, metadata={"format": "pt"}
        ),
        "FL2VA/audio_vae/config.json": _json_bytes(audio_wrapper),
        "FL2VA/audio_vae/metadata.json": _json_bytes(audio_metadata),
        "FL2VA/audio_vae/model.safetensors": safetensors_bytes(
            {k: v.contiguous() for k, v in sorted(audio_native.items())}, metadata={"format": "pt"}
        ),
        "FL2VA/transformer/model.safetensors": safetensors_bytes(dummy_dit, metadata={"format": "pt"}),
    }
    files.update(_UNRELATED_BASE_FILES)
    return files


def _git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def write_hub_cache(cache_dir: Path, repo_id: str, files: dict[str, bytes]) -> tuple[str, Path]:
    """Place ``files`` in ``cache_dir`` as if ``snapshot_download`` had fetched them; returns (commit, snapshot)."""
    from huggingface_hub._tree_cache import TreeCacheEntry, write_tree_cache

    storage = cache_dir / ("models--" + repo_id.replace("/", "--"))
    entries: dict[str, TreeCacheEntry] = {}
    blob_names: dict[str, str] = {}
    for path in sorted(files):
        data = files[path]
        if path.endswith(".safetensors"):  # LFS: blob named by sha256, tree blob_id = sha1 of the pointer file
            sha256 = hashlib.sha256(data).hexdigest()
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {len(data)}\n"
            entries[path] = TreeCacheEntry(
                size=len(data), blob_id=_git_blob_sha1(pointer.encode()), lfs_sha256=sha256, lfs_size=len(data)
            )
            blob_names[path] = sha256
        else:
            entries[path] = TreeCacheEntry(size=len(data), blob_id=_git_blob_sha1(data))
            blob_names[path] = entries[path].blob_id
    listing = "".join(f"{path} {entries[path].blob_id}\n" for path in sorted(entries))
    commit = hashlib.sha1(f"{repo_id}\n{listing}".encode()).hexdigest()
    snapshot = storage / "snapshots" / commit
    for path, data in sorted(files.items()):
        blob = storage / "blobs" / blob_names[path]
        _write(blob, data)
        link = snapshot / path
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(blob, link.parent))
    _write(storage / "refs" / "main", commit.encode())
    write_tree_cache(str(storage), commit, entries)
    return commit, snapshot


def release_files(release_dir: Path) -> dict[str, bytes]:
    """Every file of a release directory (repo path -> bytes), as a Hub repo of it would hold them."""
    return {path.relative_to(release_dir).as_posix(): path.read_bytes()
            for path in sorted(release_dir.rglob("*")) if path.is_file()}


def place_release_in_hub_cache(release_dir: str | Path, cache_dir: str | Path,
                               repo_id: str = TINY_ENTRY.model_id) -> tuple[str, Path]:
    """Put a built release into ``cache_dir`` as Hub repo ``repo_id`` at a commit (``refs/main`` points at it), as
    ``snapshot_download`` would have left it; returns (commit, snapshot). Lets ``--release org/name@revision`` be
    tested offline with ``HF_HUB_OFFLINE=1``."""
    return write_hub_cache(Path(cache_dir), repo_id, release_files(Path(release_dir)))


def default_hf_cache(release_dir: Path) -> Path:
    env = os.environ.get("HF_HUB_CACHE")
    return Path(env) if env else release_dir.resolve().parent / "hf-cache"


def build_tiny_release(out: str | Path, hf_cache: str | Path | None = None, seed: int = 0) -> TinyRelease:
    """Write the tiny release into ``out`` and its base repo into ``hf_cache``; same seed -> same bytes."""
    start = time.perf_counter()
    release = Path(out)
    cache = Path(hf_cache) if hf_cache is not None else default_hf_cache(release)
    if release.exists() and any(release.iterdir()):
        raise ValueError(f"output directory must be empty or absent, found files in {release}")
    commit, snapshot = write_hub_cache(cache, TINY_ENTRY.base_repo_id, base_repo_files(seed))
    release.mkdir(parents=True, exist_ok=True)
    _write(release / contract.CONTRACT_FILE, _json_bytes(TINY_ENTRY.contract.as_json()))
    _write(release / contract.PROVENANCE_FILE, _json_bytes({"base_model": f"{contract.PROVENANCE_PREFIX}{commit}"}))
    _write(release / contract.MODULAR_INDEX_FILE, _json_bytes(_modular_index(TINY_ENTRY.model_id)))
    _write(release / contract.CANVAS_FILE, _json_bytes(TINY_CANVAS.as_json()))  # 256x128: fast on a CPU
    _write_transformer(release, seed)
    _write_text_encoder(release, seed)
    _write_schedulers(release)
    return TinyRelease(release, cache, TINY_ENTRY.base_repo_id, commit, snapshot, time.perf_counter() - start)


def tiny_image_processor():
    """Qwen3-VL's image processor settings (16-pixel patches, 2x2 merge, mean/std 0.5) with a pixel budget sized for
    the tiny canvas (a 256x128 keyframe is 32 vision tokens); the PIL backend (no torchvision here)."""
    from transformers import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3,
                                    image_std=[0.5] * 3, size={"shortest_edge": 64 * 64, "longest_edge": 512 * 512})


def build_tiny_native_release(out: str | Path, seed: int = 0) -> TinyRelease:
    """Write the tiny native MiniMax-H3 release into ``out`` (module docstring); same seed -> same bytes."""
    from diffusers import MiniMaxH3Scheduler

    start = time.perf_counter()
    release = Path(out)
    if release.exists() and any(release.iterdir()):
        raise ValueError(f"output directory must be empty or absent, found files in {release}")
    release.mkdir(parents=True, exist_ok=True)
    index = _modular_index(NATIVE_TINY_MODEL_ID, native=True)
    index["reference_image_short_edge"] = NATIVE_TINY_REFERENCE_SHORT_EDGE  # a pipeline config diffusers reads here
    _write(release / contract.MODULAR_INDEX_FILE, _json_bytes(index))
    _write(release / contract.CANVAS_FILE, _json_bytes(TINY_CANVAS.as_json()))
    _write(release / contract.SAMPLING_FILE, _json_bytes(NATIVE_TINY_SAMPLING))
    _write_transformer(release, seed, gates=False)
    _write_transformer(release, seed, folder=contract.REF_TRANSFORMER_DIR, gates=False, component=_REF_TRANSFORMER)
    random_video_vae(seed).save_pretrained(release / contract.VIDEO_VAE_DIR)
    random_audio_vae(seed).save_pretrained(release / contract.AUDIO_VAE_DIR)
    _write_text_encoder(release, seed)
    tiny_image_processor().save_pretrained(release / contract.PROCESSOR_DIR)
    MiniMaxH3Scheduler(shift=contract.NATIVE_VIDEO_SHIFT).save_pretrained(release / "scheduler")
    MiniMaxH3Scheduler(shift=contract.NATIVE_AUDIO_SHIFT).save_pretrained(release / "audio_scheduler")
    return TinyRelease(release, release, NATIVE_TINY_MODEL_ID, "", release, time.perf_counter() - start)


def main(argv: list[str]) -> int:
    parser = OneLineArgumentParser(prog="h3batch build-tiny", description="write the deterministic tiny V2 release "
                                   "(or, with --kind native, the tiny native MiniMax-H3 release)")
    parser.add_argument("--kind", choices=("v2", "native"), default="v2",
                        help="release layout: v2 (FastH3 8-Step V2, default) or native (MiniMax-H3 with its "
                             "transformer_ref/ partition)")
    parser.add_argument("--out", required=True, help="release directory to create (must be empty or absent)")
    parser.add_argument("--hf-cache", default=None, help="Hugging Face hub cache for the tiny base repo "
                        "(default: $HF_HUB_CACHE, else OUT/../hf-cache)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (same seed -> byte-identical files)")
    parser.add_argument("--hub-repo", default=None, metavar="ORG/NAME",
                        help=f"also place the release in the hub cache as this repo (e.g. {TINY_ENTRY.model_id}), "
                             "so `--release ORG/NAME` resolves offline")
    parser.add_argument("--if-absent", action="store_true",
                        help="exit 0 without writing when OUT already holds a release that passes check-release "
                             "(compose's one-shot model-init runs on every `up`)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.if_absent and out.is_dir() and any(out.iterdir()):
        violations = contract.find_violations(out)
        if violations:
            print(f"h3batch build-tiny: {out} holds files but no valid release: {violations[0]}", file=sys.stderr)
            return 2
        print(f"release already in {out}; nothing written")
        return 0
    if args.kind == "native" and args.hub_repo:
        print("h3batch build-tiny: --hub-repo: expected with --kind v2 only", file=sys.stderr)
        return 2
    try:
        if args.kind == "native":
            built = build_tiny_native_release(args.out, args.seed)
            print(f"tiny native release {NATIVE_TINY_MODEL_ID} in {built.release_dir} ({built.seconds:.1f} s); "
                  f"tasks {', '.join(contract.validate_release(built.release_dir).tasks)}")
            return 0
        built = build_tiny_release(args.out, args.hf_cache, args.seed)
    except ValueError as err:
        print(f"h3batch build-tiny: {err}", file=sys.stderr)
        return 2
    print(
        f"tiny release {TINY_ENTRY.model_id} in {built.release_dir} ({built.seconds:.1f} s); base "
        f"{built.base_repo_id}@{built.base_commit} in {built.hf_cache}"
    )
    if args.hub_repo:
        commit, _ = place_release_in_hub_cache(built.release_dir, built.hf_cache, args.hub_repo)
        print(f"hub repo {args.hub_repo}@{commit} in {built.hf_cache}")
    return 0
