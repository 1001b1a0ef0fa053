"""The legacy FastH3 four-step adapter (``H3BATCH_ADAPTER``): fused once into the native release's DiT at start, with
its own DMD2 sampling.

FastVideo's FastH3 preview is a DMD2 student of MiniMax-H3 shipped as an adapter over the native base, not as a full
release. Facts of the format (as vLLM-Omni's ``--lora-path`` loader reads it; no code carried over):

* One ``.safetensors`` file whose metadata says ``format = fastvideo-lora-v2``, names the student in
  ``finetuned_model`` (FastVideo's namespace, "fasth3" in the name), the base in ``base_model``
  (``MiniMaxAI/MiniMax-H3``), the ``rank`` and how many tensors of each kind it holds (``low_rank_tensors``,
  ``diff_tensors``, ``set_weight_tensors``).
* Tensor names are diffusers module paths plus a role: ``.lora_A.weight`` / ``.lora_B.weight`` (rank-r factors, no
  alpha: ``W += B @ A`` at scale 1), ``.diff`` / ``.diff_b`` (full-rank weight / bias deltas: RMSNorm weights
  including the q/k norms and the token refiner's final norm, biases, patch projections, final layer) and
  ``.set_weight`` (VSA compression gates the base does not have).
* The sampling contract: ``dmd_denoising_steps`` [999, 749, 500, 250] — timestep positions out of 1000, closed by 0 —
  on which the release's own per-modality shifts (native: 12 video, 3 audio) give the sigmas; four DiT forwards, T2VA
  only, guidance-free. ``adapter_manifest.json`` beside the file carries it, with the fixed VSA top-k of the sparse
  variants (None = dense).

Here the suffix -> native parameter table is the full-checkpoint loader's (``loader.map_diffusers_name``: QKV thirds,
gate-first ``fc1``, q/k norms, refiner final norm), so an adapter tensor lands exactly where the same diffusers weight
would. Every tensor must land on a parameter of the DiT and every one must be applied; the first that does not stops
the worker at start with its key named (``LegacyAdapterError``). Fused in fp32 and rounded once to the weight's dtype:
the adapter is never removed, so the unfused per-job path (worker/h3/adapters.py) is not needed here.

A FastH3 V2 release is a full checkpoint (its student is already in the weights): the adapter is refused on it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from h3batch.settings import HUB_RELEASE_RE
from h3batch.worker.h3.loader import map_diffusers_name
from h3batch.worker.h3.model import H3Transformer
from h3batch.worker.h3.sampler import SigmaLadder, shifted_sigmas

FORMAT = "fastvideo-lora-v2"
BASE_MODEL = "MiniMaxAI/MiniMax-H3"
MANIFEST = "adapter_manifest.json"
WEIGHTS = "adapter_model.safetensors"
ROLES = (".lora_A.weight", ".lora_B.weight", ".diff_b", ".diff", ".set_weight")
COUNT_KEYS = ("low_rank_tensors", "diff_tensors", "set_weight_tensors")
ENV = "H3BATCH_ADAPTER"


class LegacyAdapterError(ValueError):
    """The adapter cannot be fused into this release; the message starts with H3BATCH_ADAPTER and names the key."""

    def __init__(self, message: str):
        super().__init__(f"{ENV}: {message}")


@dataclass(frozen=True)
class LegacySampling:
    """The adapter's own sampling: DMD2 timestep positions (of 1000), the fixed VSA top-k, the tasks it distils."""

    dmd_denoising_steps: tuple[int, ...]
    vsa_topk: int | None = None
    tasks: tuple[str, ...] = ("t2va",)

    @property
    def num_steps(self) -> int:
        return len(self.dmd_denoising_steps)

    @property
    def base_nodes(self) -> tuple[float, ...]:
        """Positions t/1000 closed by 0.0: (0.999, 0.749, 0.5, 0.25, 0.0) for the release."""
        return tuple(step / 1000.0 for step in self.dmd_denoising_steps) + (0.0,)

    def ladder(self, video_shift: float, audio_shift: float) -> SigmaLadder:
        """The release's shifts on the adapter's positions: native 12/3 give video 0.999917…0.8, audio 0.999666…0.5."""
        return SigmaLadder(shifted_sigmas(video_shift, self.base_nodes), shifted_sigmas(audio_shift, self.base_nodes))

    @classmethod
    def from_manifest(cls, data: Mapping, source: Path) -> LegacySampling:
        sampling = data.get("sampling") if isinstance(data, Mapping) else None
        if not isinstance(sampling, Mapping):
            raise LegacyAdapterError(f"{source}: manifest has no 'sampling' object")
        steps = sampling.get("dmd_denoising_steps")
        integers = isinstance(steps, list) and all(isinstance(s, int) and not isinstance(s, bool) for s in steps)
        if (not integers or not steps or any(not 0 < s < 1000 for s in steps)
                or steps != sorted(set(steps), reverse=True)):
            raise LegacyAdapterError(
                f"{source}: sampling.dmd_denoising_steps must be strictly decreasing integers in (0, 1000), "
                f"got {steps!r}"
            )
        topk = sampling.get("vsa_topk")
        if topk is not None and (isinstance(topk, bool) or not isinstance(topk, int) or topk < 1):
            raise LegacyAdapterError(f"{source}: sampling.vsa_topk must be a positive integer or null, got {topk!r}")
        tasks = sampling.get("tasks", ["t2va"])
        if not isinstance(tasks, list) or not tasks or not all(isinstance(t, str) for t in tasks):
            raise LegacyAdapterError(f"{source}: sampling.tasks must be a non-empty list of task names, got {tasks!r}")
        return cls(tuple(steps), topk, tuple(tasks))


@dataclass(frozen=True)
class LegacyAdapter:
    """A read adapter: its file, metadata, sampling and tensors (by adapter key)."""

    path: Path
    metadata: Mapping[str, str]
    sampling: LegacySampling
    tensors: Mapping[str, torch.Tensor]

    @property
    def rank(self) -> int:
        return int(self.metadata["rank"])

    @property
    def identity(self) -> str:
        return self.metadata.get("finetuned_model", "")


def _split(key: str) -> tuple[str, str] | None:
    for role in ROLES:
        if key.endswith(role):
            return key[: -len(role)], role
    return None


def read_legacy_adapter(path: str | Path) -> LegacyAdapter:
    """Read an adapter folder (``adapter_model.safetensors`` + ``adapter_manifest.json``); checks the format marker,
    the identity, the base, the rank and the declared counts, nothing about the model yet."""
    folder = Path(path)
    weights, manifest = folder / WEIGHTS, folder / MANIFEST
    for needed in (weights, manifest):
        if not needed.is_file():
            raise LegacyAdapterError(f"{folder} is not a FastH3 adapter: {needed.name} is missing")
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise LegacyAdapterError(f"{manifest}: not JSON ({err})") from None
    sampling = LegacySampling.from_manifest(data, manifest)
    with safe_open(str(weights), framework="pt", device="cpu") as handle:
        metadata = dict(handle.metadata() or {})
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    if metadata.get("format") != FORMAT:
        raise LegacyAdapterError(f"{weights}: metadata format={metadata.get('format')!r}, expected {FORMAT!r}")
    identity = metadata.get("finetuned_model", "").lower()
    if not identity.startswith("fastvideo/") or "fasth3" not in identity:
        raise LegacyAdapterError(f"{weights}: finetuned_model={identity!r} is not a FastVideo FastH3 student")
    if metadata.get("base_model", BASE_MODEL).casefold() != BASE_MODEL.casefold():
        raise LegacyAdapterError(f"{weights}: base_model={metadata.get('base_model')!r}, expected {BASE_MODEL}")
    if not str(metadata.get("rank", "")).isdigit() or int(metadata["rank"]) < 1:
        raise LegacyAdapterError(f"{weights}: metadata rank={metadata.get('rank')!r} is not a positive integer")
    counts = dict.fromkeys(COUNT_KEYS, 0)
    for key in tensors:
        role = (_split(key) or ("", ""))[1]
        kind = {".lora_A.weight": 0, ".lora_B.weight": 0, ".diff": 1, ".diff_b": 1, ".set_weight": 2}.get(role)
        if kind is not None:
            counts[COUNT_KEYS[kind]] += 1
    for name, seen in counts.items():
        if str(metadata.get(name)) != str(seen):
            raise LegacyAdapterError(f"{weights}: metadata {name}={metadata.get(name)!r} but the file holds {seen}")
    return LegacyAdapter(folder, metadata, sampling, tensors)


def _delta_rows(model: H3Transformer, module: str, leaf: str) -> tuple[str, slice, bool]:
    """Native parameter name, the rows of it the diffusers tensor covers, and whether fc1 halves swap."""
    target = map_diffusers_name(f"{module}.{leaf}")
    rows = slice(None)
    if target.qkv_part is not None:
        inner = model.config.inner_dim
        start = "qkv".index(target.qkv_part) * inner
        rows = slice(start, start + inner)
    return target.name, rows, target.swap_halves


@torch.no_grad()
def fuse_legacy_adapter(model: H3Transformer, adapter: LegacyAdapter) -> set[str]:
    """Add every adapter tensor to its DiT parameter (fp32 sum, one rounding); returns the native names changed.

    Refuses (``LegacyAdapterError`` naming the first bad key, before any parameter is written): a key with no role or
    no native parameter, a lone low-rank factor, a factor whose rank is not the declared one, a delta whose shape is
    not its target's, a DiT or refiner block the adapter leaves untouched. After writing, every tensor must have been
    consumed ("none left unapplied").
    """
    params = dict(model.named_parameters())
    plan: list[tuple[str, slice, torch.Tensor, bool]] = []  # (native name, rows, delta in D layout, assign)
    consumed: set[str] = set()
    factors: dict[str, dict[str, torch.Tensor]] = {}
    blocks = {"transformer_blocks.": set(), "token_refiner.refiner_blocks.": set()}
    for key in sorted(adapter.tensors):
        split = _split(key)
        if split is None:
            raise LegacyAdapterError(f"unknown key {key}: no lora_A/lora_B/diff/diff_b/set_weight role")
        module, role = split
        leaf = "bias" if role == ".diff_b" else "weight"
        try:
            native, rows, swap = _delta_rows(model, module, leaf)
        except ValueError:
            raise LegacyAdapterError(f"unknown key {key}: names no parameter of the H3 DiT") from None
        if native not in params:
            raise LegacyAdapterError(f"unknown key {key}: the DiT has no parameter {native}")
        for prefix, seen in blocks.items():
            if module.startswith(prefix):
                seen.add(int(module[len(prefix):].split(".", 1)[0]))
        if role in (".lora_A.weight", ".lora_B.weight"):
            factors.setdefault(module, {})[role] = adapter.tensors[key]
            continue
        delta = adapter.tensors[key].to(torch.float32)
        target_shape = tuple(params[native][rows].shape)
        if tuple(delta.shape) != target_shape:
            raise LegacyAdapterError(
                f"shape mismatch at {key}: {list(delta.shape)} vs {list(target_shape)} of {native}")
        plan.append((native, rows, _swap(delta) if swap else delta, role == ".set_weight"))
        consumed.add(key)
    for module in sorted(factors):
        pair = factors[module]
        key_a, key_b = f"{module}.lora_A.weight", f"{module}.lora_B.weight"
        if len(pair) != 2:
            raise LegacyAdapterError(f"unknown key {key_a if '.lora_A.weight' in pair else key_b}: its pair is missing")
        a, b = pair[".lora_A.weight"].to(torch.float32), pair[".lora_B.weight"].to(torch.float32)
        if a.ndim != 2 or b.ndim != 2 or a.shape[0] != adapter.rank or b.shape[1] != adapter.rank:
            raise LegacyAdapterError(
                f"wrong rank at {key_a}: lora_A {list(a.shape)}, lora_B {list(b.shape)}, declared rank {adapter.rank}"
            )
        native, rows, swap = _delta_rows(model, module, "weight")
        target_shape = tuple(params[native][rows].shape)
        if (b.shape[0], a.shape[1]) != target_shape:
            raise LegacyAdapterError(
                f"shape mismatch at {key_a}: B @ A is {[b.shape[0], a.shape[1]]} vs {list(target_shape)} of {native}"
            )
        plan.append((native, rows, (_swap(b) if swap else b) @ a, False))
        consumed.update((key_a, key_b))
    expected = {"transformer_blocks.": model.config.num_layers,
                "token_refiner.refiner_blocks.": model.config.token_refiner_num_layers}
    for prefix, count in expected.items():
        missing = sorted(set(range(count)) - blocks[prefix])
        if missing:
            raise LegacyAdapterError(f"edits no tensor of {prefix}{missing[0]}: not an adapter for this DiT")
    left = sorted(set(adapter.tensors) - consumed)
    if left:
        raise LegacyAdapterError(f"tensor {left[0]} was not applied")
    changed = set()
    for native, rows, delta, assign in plan:
        weight = params[native]
        base = torch.zeros_like(weight[rows], dtype=torch.float32) if assign else weight[rows].to(torch.float32)
        weight[rows] = (base + delta).to(weight.dtype)
        changed.add(native)
    return changed


def _swap(rows: torch.Tensor) -> torch.Tensor:
    """D [value; gate] -> N [gate; up] over the first axis."""
    half = rows.shape[0] // 2
    return torch.cat((rows[half:], rows[:half]), dim=0)


def adapter_folder(ref: str, hf_cache: str | Path | None = None) -> Path:
    """H3BATCH_ADAPTER's folder: a directory as given, or a Hub repo ``org/name@revision`` fetched into the hub cache
    (huggingface_hub; ``HF_HUB_OFFLINE=1`` serves only what the cache holds)."""
    if Path(ref).is_dir():
        return Path(ref)
    match = HUB_RELEASE_RE.fullmatch(ref)
    if match is None:
        raise LegacyAdapterError(f"expected a folder or org/name@revision, found {ref!r}")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(match["repo"], revision=match["revision"], cache_dir=hf_cache,
                                      allow_patterns=[WEIGHTS, MANIFEST]))
    except Exception as exc:  # noqa: BLE001  # the hub's many error types: one line naming the variable
        raise LegacyAdapterError(f"could not fetch {ref}: {type(exc).__name__}: {exc}") from None


def refuse_on_full_checkpoint(release_kind: str) -> None:
    """The adapter edits the native MiniMax-H3 base; a FastH3 V2 release is a full checkpoint that already holds its
    student, so an adapter on it is refused (as vLLM-Omni refuses ``--lora-path`` on V2)."""
    if release_kind != "native":
        raise LegacyAdapterError(
            f"the served release is {release_kind!r} (a full FastH3 checkpoint); the legacy FastH3 adapter applies to "
            "the native MiniMax-H3 release only: unset H3BATCH_ADAPTER or serve the native release"
        )


# Writing (the tiny builder, tests) ----------------------------------------------------------------------------------

TINY_IDENTITY = "FastVideo/FastH3-tiny-4-step"
RELEASE_STEPS = [999, 749, 500, 250]


def write_legacy_adapter(folder: str | Path, tensors: Mapping[str, torch.Tensor], *, rank: int,
                         identity: str = TINY_IDENTITY, steps: list[int] = RELEASE_STEPS,
                         vsa_topk: int | None = None, extra_metadata: Mapping[str, str] | None = None) -> Path:
    """Write ``tensors`` as an adapter folder, metadata counts derived from the tensors (tests tamper after)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    counts = dict.fromkeys(COUNT_KEYS, 0)
    for key in tensors:
        role = (_split(key) or ("", ""))[1]
        index = {".lora_A.weight": 0, ".lora_B.weight": 0, ".diff": 1, ".diff_b": 1, ".set_weight": 2}.get(role)
        if index is not None:
            counts[COUNT_KEYS[index]] += 1
    metadata = {"format": FORMAT, "finetuned_model": identity, "base_model": BASE_MODEL, "rank": str(rank),
                **{k: str(v) for k, v in counts.items()}, **dict(extra_metadata or {})}
    save_file(dict(tensors), str(folder / WEIGHTS), metadata=metadata)
    manifest = {"format": FORMAT, "base_model": BASE_MODEL,
                "sampling": {"dmd_denoising_steps": list(steps), "vsa_topk": vsa_topk, "tasks": ["t2va"],
                             "guidance_scale": 1.0}}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return folder


def sigma_summary(ladder: SigmaLadder) -> str:
    """``video 0.999917…0.8, audio 0.999666…0.5`` for the start-up log line."""
    def ends(sigmas: torch.Tensor) -> str:
        return f"{float(sigmas[0]):.6g}…{float(sigmas[-2]):.6g}"
    return f"video {ends(ladder.video_sigmas)}, audio {ends(ladder.audio_sigmas)}"

