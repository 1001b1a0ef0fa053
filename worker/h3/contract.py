"""FastH3 V2 checkpoint contract: the registry of accepted releases and the release-directory checker (spec §6).

A release directory is accepted only if

1. ``fastvideo_inference.json`` carries the 11 contract fields of a registry entry, compared in table order with
   Python ``!=`` (so ``8.0`` passes for ``8``) and booleans refused (``True == 1`` would otherwise slip through);
   a missing key reads as ``None``;
2. ``provenance.json`` names the base repo as ``hf://MiniMaxAI/MiniMax-H3@<revision>`` with any non-empty revision,
   as vllm-omni accepts (a tag or branch too: ``worker/h3/base_vae_fetch.py`` resolves it to the commit it stands
   for, and that commit is what jobs record); ``require_pinned_base=True`` (``H3BATCH_REQUIRE_PINNED_BASE=1``)
   restores the 40-hex commit requirement;
3. the required files are there: the modular marker, the Diffusers transformer index and every shard it names (and
   no unindexed shard beside them), the text encoder and tokenizer (not checked with ``conditioner=False``, for a
   DiT-only rank that fetched no conditioner); the index holds one compression gate per DiT block.

An optional ``h3batch_canvas.json`` (written by ``h3batch build-tiny``) records the release's canvas: the size a
request without one renders and the pixel budget of its aspect buckets (``core.geometry.CanvasProfile``); a release
without it (the published V2) has the V2 33B canvas, 1344x768 (``ReleaseInfo.canvas``).

Beside V2 the checker recognises the **native MiniMax-H3 release** (``ReleaseKind.NATIVE``): the layout diffusers'
``MiniMaxH3ModularPipeline`` loads (docs/model.md "The native release"): no ``fastvideo_inference.json``, a
``modular_model_index.json``, the ``transformer/`` partition (t2va, fl2va; no compression gates), the optional
``transformer_ref/`` partition (ref2va), ``processor/`` (the Qwen3-VL image processor: without it the release serves t2va
only), ``vae/`` and ``audio_vae/`` in Diffusers format, ``scheduler/`` and
``audio_scheduler/`` (their ``shift`` is the sampler's: 12 and 3 as published) and the conditioner. Its sampling is
diffusers' (``linspace(1, 0, 50)`` shifted, 49 forwards), unless an optional ``h3batch_sampling.json`` (written by
``build-tiny --kind native``) names another grid size or text-encoder layer. ``release_capabilities`` says which kind a
directory is and which tasks it serves.

``find_violations`` lists every problem, one line each (``h3batch check-release`` prints them and exits 2);
``validate_release`` raises ``ContractError`` with the first one and returns a ``ReleaseInfo`` for the worker.
Only JSON files and the transformer index are read here; no tensor is loaded.
"""
from __future__ import annotations

import hashlib
import json
import re
import sys
from dataclasses import asdict, dataclass, fields
from enum import Enum
from pathlib import Path
from typing import Any

from h3batch.cli_args import OneLineArgumentParser
from h3batch.core.geometry import V2_CANVAS, CanvasProfile, GeometryError
from h3batch.settings import env_value

CONTRACT_FILE = "fastvideo_inference.json"
PROVENANCE_FILE = "provenance.json"
MODULAR_INDEX_FILE = "modular_model_index.json"
MODULAR_CLASS_NAME = "MiniMaxH3ModularPipeline"
TRANSFORMER_DIR = "transformer"
TRANSFORMER_CLASS_NAME = "MiniMaxH3Transformer3DModel"
TRANSFORMER_INDEX_FILE = "diffusion_pytorch_model.safetensors.index.json"
TEXT_ENCODER_DIR = "text_encoder"
TOKENIZER_DIR = "tokenizer"
CANVAS_FILE = "h3batch_canvas.json"
REF_TRANSFORMER_DIR = "transformer_ref"
VIDEO_VAE_DIR = "vae"
AUDIO_VAE_DIR = "audio_vae"
VIDEO_VAE_CLASS_NAME = "AutoencoderKLMiniMaxH3"
AUDIO_VAE_CLASS_NAME = "AutoencoderKLMiniMaxH3Audio"
SCHEDULER_DIRS = ("scheduler", "audio_scheduler")
SCHEDULER_CONFIG_FILE = "scheduler_config.json"
SCHEDULER_CLASS_NAME = "MiniMaxH3Scheduler"
SAMPLING_FILE = "h3batch_sampling.json"
PROCESSOR_DIR = "processor"
PROCESSOR_CONFIG_FILE = "preprocessor_config.json"

NATIVE_DEFAULT_GRID_POINTS = 50
"""diffusers' default ``num_inference_steps`` for the native release: a 50-point grid ``linspace(1, 0, 50)``, so 49
forwards (the terminal 0 is a grid point with no forward)."""
NATIVE_TEXT_LAYER = 50
"""``hidden_states`` index the native DiT is conditioned on (``MiniMaxH3ModularPipeline.text_encoder_layer``)."""
NATIVE_REFERENCE_SHORT_EDGE = 2048
"""diffusers' default ``reference_image_short_edge``: a ref2va image is encoded at this short edge, whatever the
canvas; a release may set another in its ``modular_model_index.json`` (the tiny native release: 128)."""
NATIVE_VIDEO_SHIFT = 12.0
NATIVE_AUDIO_SHIFT = 3.0
"""The published schedulers' shifts (diffusers' ``MiniMaxH3Scheduler`` default 12; ``audio_scheduler`` 3); the
values served are read from the release's own scheduler configs."""


class ReleaseKind(str, Enum):
    """Which checkpoint layout a release directory is (core/routing.RELEASE_KINDS spells the values)."""

    V2 = "v2"
    NATIVE = "native"


V2_TASKS = ("t2va",)
"""FastH3 V2 is distilled for text to video + audio only."""

BASE_REPO_ID = "MiniMaxAI/MiniMax-H3"
PROVENANCE_PREFIX = f"hf://{BASE_REPO_ID}@"
COMMIT_RE = re.compile(r"[0-9a-f]{40}")
VAE_ALLOW_PATTERNS = ("FL2VA/video_vae/**", "FL2VA/audio_vae/**")
"""The only base-repo files a release may pull (§6.3): the two native VAE folders of the FL2VA partition."""
VAE_ROOT = "FL2VA"

GATE_KEY_RE = re.compile(r"transformer_blocks\.(\d+)\.attn\.to_gate_compress\.weight")


@dataclass(frozen=True)
class FastH3Contract:
    """The 11 fields of ``fastvideo_inference.json``, in the order they are checked (§6.2)."""

    model_id: str
    schema_version: str
    dmd_denoising_steps: tuple[int, ...]
    transformer_forwards: int
    video_scheduler_shift: float
    audio_scheduler_shift: float
    guidance_scale: float
    attention_backend: str
    vsa_sparsity: float
    vsa_tile_size: int
    task: str

    def as_json(self) -> dict[str, Any]:
        """The JSON object a release writes (tuples become lists)."""
        return {f.name: list(v) if isinstance(v, tuple) else v for f, v in zip(fields(self), self._values())}

    def canonical_json(self) -> str:
        """Sorted keys, no whitespace: the text the contract hash is taken over."""
        return json.dumps(self.as_json(), sort_keys=True, separators=(",", ":"))

    def sha256(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    def _values(self) -> list[Any]:
        return [getattr(self, f.name) for f in fields(self)]


@dataclass(frozen=True)
class RegistryEntry:
    """One accepted release: its contract plus the facts h3batch needs to serve it."""

    contract: FastH3Contract
    base_repo_id: str
    text_hidden_layer: int
    """``hidden_states`` index of the text encoder the DiT is conditioned on (pre-final-norm, §8)."""
    transformer_num_layers: int
    """DiT blocks; V2 carries exactly one ``to_gate_compress`` per block (never in the refiner)."""
    description: str

    @property
    def model_id(self) -> str:
        return self.contract.model_id

    @property
    def expected_gate_count(self) -> int:
        return self.transformer_num_layers


_V2_SHARED = dict(
    schema_version="fasth3-inference-contract-v1",
    dmd_denoising_steps=(999, 874, 749, 624, 500, 375, 250, 125),
    transformer_forwards=8,
    video_scheduler_shift=10.0,
    audio_scheduler_shift=3.0,
    guidance_scale=1.0,
    attention_backend="VIDEO_SPARSE_ATTN_H3",
    vsa_sparsity=0.8,
    vsa_tile_size=64,
    task="t2av",  # contract spelling; the pipeline task is "t2va" (§14.5)
)

FASTH3_V2 = RegistryEntry(
    contract=FastH3Contract(model_id="FastVideo/FastVideo-FastH3-8-Step-V2", **_V2_SHARED),
    base_repo_id=BASE_REPO_ID,
    text_hidden_layer=50,
    transformer_num_layers=50,
    description="FastH3 8-Step V2 (MiniMax-H3 33B DiT, distilled, VSA-H3 gates)",
)

FASTH3_V2_TINY = RegistryEntry(
    contract=FastH3Contract(model_id="h3batch/FastH3-8-Step-V2-tiny", **_V2_SHARED),
    base_repo_id=BASE_REPO_ID,
    # 3-layer tiny Qwen3-VL read after decoder layer 1: the last entry would be post-norm (§8 pitfall).
    text_hidden_layer=2,
    transformer_num_layers=3,
    description="random-weight CPU test release in the exact V2 layout (tiny DiT config T2)",
)

REGISTRY: dict[str, RegistryEntry] = {e.model_id: e for e in (FASTH3_V2, FASTH3_V2_TINY)}


@dataclass(frozen=True)
class ReleaseMetadata:
    """Release metadata derived from the contract (§6.4), as vllm-omni reports it."""

    partition: str
    tasks: tuple[str, ...]
    sigma_shift_scales: dict[str, float]
    base_schedule: tuple[float, ...]

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def derive_metadata(contract: FastH3Contract) -> ReleaseMetadata:
    """9-node ladder = ``dmd_denoising_steps / 1000`` plus the terminal 0; shifts per modality."""
    return ReleaseMetadata(
        partition="fl2va",
        tasks=("t2va",),
        sigma_shift_scales={
            "video": float(contract.video_scheduler_shift),
            "audio": float(contract.audio_scheduler_shift),
        },
        base_schedule=tuple(step / 1000 for step in contract.dmd_denoising_steps) + (0.0,),
    )


def startup_log_line(contract: FastH3Contract) -> str:
    """The serving startup line: ``8 transformer forwards, video/audio shifts 10/3, VSA sparsity=0.8 tile=64``."""
    return (
        f"{contract.transformer_forwards} transformer forwards, "
        f"video/audio shifts {contract.video_scheduler_shift:g}/{contract.audio_scheduler_shift:g}, "
        f"VSA sparsity={contract.vsa_sparsity:g} tile={contract.vsa_tile_size}"
    )


@dataclass(frozen=True)
class ReleaseInfo:
    """What the worker needs from a validated release directory."""

    path: Path
    entry: RegistryEntry | None
    """The V2 registry entry; None for a native release (``native`` holds its facts)."""
    contract_hash: str
    """sha256 of the entry's canonical contract JSON (``FastH3Contract.canonical_json``)."""
    base_repo_id: str
    base_revision: str
    metadata: ReleaseMetadata
    num_inference_steps: int
    shard_files: tuple[str, ...]
    tensor_count: int
    startup_log_line: str
    canvas: CanvasProfile = V2_CANVAS
    """Default canvas and bucket budget (``CANVAS_FILE`` when the release has one, else V2's 1344x768)."""
    kind: ReleaseKind = ReleaseKind.V2
    tasks: tuple[str, ...] = V2_TASKS
    """The tasks the release's layout serves (V2: t2va; native: t2va, fl2va, and ref2va with ``transformer_ref/``)."""
    native: NativeSampling | None = None
    """The native release's sampling facts; None for V2 (whose facts are its registry entry's contract)."""

    @property
    def model_id(self) -> str:
        return self.native.model_id if self.native is not None else self.entry.model_id

    @property
    def text_hidden_layer(self) -> int:
        return self.native.text_encoder_layer if self.native is not None else self.entry.text_hidden_layer

    @property
    def vsa_sparsity(self) -> float:
        """V2's contract sparsity; 0.0 (dense) for the native release, which carries no compression gates."""
        return 0.0 if self.native is not None else float(self.entry.contract.vsa_sparsity)

    def summary(self) -> str:
        return (
            f"release OK: kind={self.kind.value} tasks={','.join(self.tasks)} model_id={self.model_id} "
            f"contract_sha256={self.contract_hash} shards={len(self.shard_files)} tensors={self.tensor_count} "
            f"base={self.base_repo_id}@{self.base_revision}"
        )


@dataclass(frozen=True)
class NativeSampling:
    """What the worker serves a native release with: diffusers' sampling, read from the release (docs/model.md)."""

    model_id: str
    grid_points: int = NATIVE_DEFAULT_GRID_POINTS
    """``num_inference_steps`` in diffusers' sense: grid points of ``linspace(1, 0, n)``; forwards = n - 1."""
    video_shift: float = NATIVE_VIDEO_SHIFT
    audio_shift: float = NATIVE_AUDIO_SHIFT
    text_encoder_layer: int = NATIVE_TEXT_LAYER
    reference_short_edge: int = NATIVE_REFERENCE_SHORT_EDGE
    """ref2va: the short edge a reference image is encoded at (the index's ``reference_image_short_edge``)."""

    @property
    def forwards(self) -> int:
        return self.grid_points - 1

    def canonical_json(self) -> str:
        return json.dumps({"kind": ReleaseKind.NATIVE.value, **asdict(self)}, sort_keys=True, separators=(",", ":"))

    def sha256(self) -> str:
        """The native release's contract hash: over its sampling facts (it has no FastH3 contract file)."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    def startup_log_line(self) -> str:
        return (f"native MiniMax-H3: {self.forwards} transformer forwards ({self.grid_points}-point grid), "
                f"video/audio shifts {self.video_shift:g}/{self.audio_shift:g}, dense attention")


class ContractError(ValueError):
    """A release directory violates the checkpoint contract; ``violations`` lists every problem, first one in str()."""

    def __init__(self, violations: list[str]) -> None:
        super().__init__(violations[0])
        self.violations = list(violations)


# ---------------------------------------------------------------------------------------------------------------
# Checks. Each returns a list of one-line violations; none raises on bad content.


def _has_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return True
    return isinstance(value, (list, tuple)) and any(isinstance(v, bool) for v in value)


def _field_matches(actual: Any, expected: Any) -> bool:
    if _has_bool(actual):
        return False
    if isinstance(expected, tuple):
        return isinstance(actual, list) and actual == list(expected)
    return not (actual != expected)


def _expected_repr(value: Any) -> str:
    return repr(list(value)) if isinstance(value, tuple) else repr(value)


def check_contract(data: Any) -> tuple[list[str], RegistryEntry | None]:
    """Compare a parsed ``fastvideo_inference.json`` with the registry; returns (violations, matched entry)."""
    if not isinstance(data, dict):
        return [f"{CONTRACT_FILE}: expected a JSON object, found {type(data).__name__}"], None
    model_id = data.get("model_id")
    entry = REGISTRY.get(model_id) if isinstance(model_id, str) else None
    violations: list[str] = []
    if entry is None:
        known = " or ".join(repr(k) for k in REGISTRY)
        violations.append(f"unsupported FastH3 contract: model_id={model_id!r}, expected {known}")
        reference = FASTH3_V2.contract  # the other fields are still reported against V2
    else:
        reference = entry.contract
    for f in fields(reference):
        if f.name == "model_id":
            continue
        expected = getattr(reference, f.name)
        actual = data.get(f.name)
        if not _field_matches(actual, expected):
            violations.append(f"unsupported FastH3 contract: {f.name}={actual!r}, expected {_expected_repr(expected)}")
    return violations, entry


def parse_provenance(data: Any, *, require_pinned: bool = False) -> tuple[str | None, str | None]:
    """(revision, None) for ``{"base_model": "hf://MiniMaxAI/MiniMax-H3@<revision>"}``, else (None, violation).

    Any non-empty revision is accepted; ``require_pinned`` accepts only a 40-hex (lower-case) commit.
    """
    base_model = data.get("base_model") if isinstance(data, dict) else None
    revision = base_model[len(PROVENANCE_PREFIX):] if isinstance(base_model, str) else ""
    if isinstance(base_model, str) and base_model.startswith(PROVENANCE_PREFIX) and revision.strip():
        if not require_pinned or COMMIT_RE.fullmatch(revision):
            return revision, None
    expected = "<40-hex commit>" if require_pinned else "<revision>"
    pinned = " (H3BATCH_REQUIRE_PINNED_BASE=1)" if require_pinned else ""
    return None, (
        f"FastH3 V2 provenance must pin a {BASE_REPO_ID} base revision{pinned}: "
        f"{PROVENANCE_FILE} base_model={base_model!r}, expected '{PROVENANCE_PREFIX}{expected}'"
    )


def _read_json(path: Path) -> tuple[Any, str | None]:
    try:
        return json.loads(path.read_text()), None
    except FileNotFoundError:
        return None, f"missing required file {path.name}: expected {path}"
    except (OSError, ValueError) as err:
        return None, f"unreadable {path.name}: expected JSON, found {type(err).__name__}: {err}"


def _check_transformer(root: Path, entry: RegistryEntry | None, folder: str = TRANSFORMER_DIR,
                       expected_gates: int | None = None) -> tuple[list[str], tuple[str, ...], int]:
    """Transformer config, index, shards and gates; returns (violations, shard files, tensor count).

    Gates expected: the V2 entry's one per block; ``expected_gates`` overrides it (0 for a native partition)."""
    tdir = root / folder
    TRANSFORMER_DIR = folder  # noqa: N806 - the messages below name the partition checked
    index_name = f"{TRANSFORMER_DIR}/{TRANSFORMER_INDEX_FILE}"
    violations: list[str] = []
    config, err = _read_json(tdir / "config.json")
    if err:
        violations.append(f"{TRANSFORMER_DIR}/{err}")
    elif not isinstance(config, dict) or config.get("_class_name") != TRANSFORMER_CLASS_NAME:
        found = config.get("_class_name") if isinstance(config, dict) else config
        violations.append(
            f"{TRANSFORMER_DIR}/config.json: _class_name={found!r}, expected {TRANSFORMER_CLASS_NAME!r}"
        )
    index, err = _read_json(tdir / TRANSFORMER_INDEX_FILE)
    if err:
        violations.append(f"{TRANSFORMER_DIR}/{err}")
        return violations, (), 0
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        violations.append(f"{index_name}: expected a non-empty weight_map, found {weight_map!r}")
        return violations, (), 0
    shards = tuple(sorted(set(weight_map.values())))
    for shard in shards:
        if not (tdir / shard).is_file():
            violations.append(f"missing shard named in {index_name}: expected {TRANSFORMER_DIR}/{shard}")
    for stray in sorted(p.name for p in tdir.glob("*.safetensors") if p.name not in shards):
        violations.append(
            f"extra file {TRANSFORMER_DIR}/{stray}: not named in {TRANSFORMER_INDEX_FILE}, expected only {list(shards)}"
        )
    count = expected_gates if expected_gates is not None else (entry.expected_gate_count if entry else None)
    if count is not None:
        gates = sorted(int(m.group(1)) for k in weight_map if (m := GATE_KEY_RE.fullmatch(k)))
        expected = list(range(count))
        if gates != expected:
            missing = sorted(set(expected) - set(gates))
            extra = sorted(set(gates) - set(expected))
            which = (f"transformer_blocks.{{0..{count - 1}}}.attn.to_gate_compress.weight" if count
                     else "(a native partition has none)")
            violations.append(
                f"{index_name}: expected {count} compression gates {which}, "
                f"found {len(gates)} (missing blocks {missing}, unexpected blocks {extra})"
            )
    return violations, shards, len(weight_map)


def _check_conditioner(root: Path) -> list[str]:
    """One line per conditioner folder that lacks something: text_encoder config + weights, tokenizer files."""
    te, tok = root / TEXT_ENCODER_DIR, root / TOKENIZER_DIR
    required = {
        TEXT_ENCODER_DIR: [
            ("config.json", (te / "config.json").is_file()),
            ("*.safetensors", any(te.glob("*.safetensors"))),
        ],
        TOKENIZER_DIR: [
            ("tokenizer.json", (tok / "tokenizer.json").is_file()),
            ("tokenizer_config.json", (tok / "tokenizer_config.json").is_file()),
        ],
    }
    violations = []
    for folder, checks in required.items():
        missing = [f"{folder}/{name}" for name, present in checks if not present]
        if missing:
            violations.append(f"missing required file(s) in {folder}/: expected {', '.join(missing)}")
    return violations


def read_canvas(root: Path) -> tuple[CanvasProfile, str | None]:
    """(canvas, None) from ``CANVAS_FILE`` (V2's canvas when absent), else (V2's canvas, violation)."""
    if not (root / CANVAS_FILE).exists():
        return V2_CANVAS, None
    data, err = _read_json(root / CANVAS_FILE)
    if err:
        return V2_CANVAS, err
    keys = set(V2_CANVAS.as_json())
    if not isinstance(data, dict) or set(data) != keys:
        return V2_CANVAS, f"{CANVAS_FILE}: expected an object with keys {sorted(keys)}, found {data!r}"
    try:
        return CanvasProfile(**data), None
    except GeometryError as exc:
        return V2_CANVAS, f"{CANVAS_FILE}: {exc}"


@dataclass(frozen=True)
class _Findings:
    violations: list[str]
    entry: RegistryEntry | None
    revision: str | None
    shards: tuple[str, ...]
    tensor_count: int
    canvas: CanvasProfile = V2_CANVAS


def _inspect(path: str | Path, *, require_pinned_base: bool = False, conditioner: bool = True) -> _Findings:
    root = Path(path)
    if not root.is_dir():
        return _Findings([f"release directory not found: expected a directory at {root}"], None, None, (), 0)
    violations: list[str] = []
    contract_data, err = _read_json(root / CONTRACT_FILE)
    entry = None
    if err:
        violations.append(err)
    else:
        found, entry = check_contract(contract_data)
        violations += found
    provenance_data, err = _read_json(root / PROVENANCE_FILE)
    revision = None
    if err:
        violations.append(err)
    else:
        revision, problem = parse_provenance(provenance_data, require_pinned=require_pinned_base)
        if problem:
            violations.append(problem)
    index_data, err = _read_json(root / MODULAR_INDEX_FILE)
    if err:
        violations.append(err)
    elif not isinstance(index_data, dict) or index_data.get("_class_name") != MODULAR_CLASS_NAME:
        found = index_data.get("_class_name") if isinstance(index_data, dict) else index_data
        violations.append(f"{MODULAR_INDEX_FILE}: _class_name={found!r}, expected {MODULAR_CLASS_NAME!r}")
    found, shards, tensor_count = _check_transformer(root, entry)
    violations += found
    if conditioner:
        violations += _check_conditioner(root)
    canvas, problem = read_canvas(root)
    if problem:
        violations.append(problem)
    return _Findings(violations, entry, revision, shards, tensor_count, canvas)


# ---------------------------------------------------------------------------------------------------------------
# The native MiniMax-H3 release (diffusers' layout)


def release_kind_of(path: str | Path) -> ReleaseKind:
    """NATIVE when the directory has a modular index and neither of V2's own files (``fastvideo_inference.json``,
    ``provenance.json``); V2 otherwise, so a V2 release that lost one of them, or a directory that is neither, is
    reported against the V2 contract as before native releases were known."""
    root = Path(path)
    v2_files = (root / CONTRACT_FILE).exists() or (root / PROVENANCE_FILE).exists()
    if not v2_files and (root / MODULAR_INDEX_FILE).exists():
        return ReleaseKind.NATIVE
    return ReleaseKind.V2


def _check_component(root: Path, folder: str, class_name: str) -> list[str]:
    """A Diffusers model folder: ``config.json`` naming ``class_name`` and at least one safetensors file."""
    config, err = _read_json(root / folder / "config.json")
    if err:
        return [f"{folder}/{err}"]
    violations = []
    found = config.get("_class_name") if isinstance(config, dict) else config
    if found != class_name:
        violations.append(f"{folder}/config.json: _class_name={found!r}, expected {class_name!r}")
    if not any((root / folder).glob("*.safetensors")):
        violations.append(f"missing required file(s) in {folder}/: expected {folder}/*.safetensors")
    return violations


def _scheduler_shift(root: Path, folder: str) -> tuple[float | None, str | None]:
    """The ``shift`` of ``folder/scheduler_config.json`` (a ``MiniMaxH3Scheduler``), or a violation."""
    config, err = _read_json(root / folder / SCHEDULER_CONFIG_FILE)
    if err:
        return None, f"{folder}/{err}"
    found = config.get("_class_name") if isinstance(config, dict) else config
    if found != SCHEDULER_CLASS_NAME:
        return None, f"{folder}/{SCHEDULER_CONFIG_FILE}: _class_name={found!r}, expected {SCHEDULER_CLASS_NAME!r}"
    shift = config.get("shift", NATIVE_VIDEO_SHIFT)  # diffusers' default when the key is absent
    if isinstance(shift, bool) or not isinstance(shift, (int, float)) or not shift > 0:
        return None, f"{folder}/{SCHEDULER_CONFIG_FILE}: shift={shift!r}, expected a positive number"
    return float(shift), None


def _read_sampling(root: Path) -> tuple[dict[str, int], str | None]:
    """The optional ``SAMPLING_FILE``: ``num_inference_steps`` (>= 2) and ``text_encoder_layer`` (>= 1)."""
    if not (root / SAMPLING_FILE).exists():
        return {}, None
    data, err = _read_json(root / SAMPLING_FILE)
    if err:
        return {}, err
    minimum = {"num_inference_steps": 2, "text_encoder_layer": 1}
    if not isinstance(data, dict) or not set(data) <= set(minimum):
        return {}, f"{SAMPLING_FILE}: expected an object with keys among {sorted(minimum)}, found {data!r}"
    for key, value in data.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum[key]:
            return {}, f"{SAMPLING_FILE}: {key}={value!r}, expected an integer >= {minimum[key]}"
    return data, None


@dataclass(frozen=True)
class _NativeFindings:
    violations: list[str]
    tasks: tuple[str, ...] = ()
    sampling: NativeSampling | None = None
    shards: tuple[str, ...] = ()
    tensor_count: int = 0
    canvas: CanvasProfile = V2_CANVAS


def _inspect_native(root: Path, *, conditioner: bool = True) -> _NativeFindings:
    violations: list[str] = []
    index, err = _read_json(root / MODULAR_INDEX_FILE)
    model_id = BASE_REPO_ID
    reference_edge = NATIVE_REFERENCE_SHORT_EDGE
    if err:
        violations.append(err)
    elif not isinstance(index, dict) or index.get("_class_name") != MODULAR_CLASS_NAME:
        found = index.get("_class_name") if isinstance(index, dict) else index
        violations.append(f"{MODULAR_INDEX_FILE}: _class_name={found!r}, expected {MODULAR_CLASS_NAME!r}")
    else:  # the repo the index's components come from names the release
        spec = index.get(TRANSFORMER_DIR)
        named = spec[2].get("pretrained_model_name_or_path") if isinstance(spec, list) and len(spec) == 3 \
            and isinstance(spec[2], dict) else None
        model_id = named if isinstance(named, str) and named else BASE_REPO_ID
        edge = index.get("reference_image_short_edge", NATIVE_REFERENCE_SHORT_EDGE)
        if isinstance(edge, bool) or not isinstance(edge, int) or edge < 32:
            violations.append(f"{MODULAR_INDEX_FILE}: reference_image_short_edge={edge!r}, expected an integer >= 32")
        else:
            reference_edge = edge
    found, shards, tensor_count = _check_transformer(root, None, TRANSFORMER_DIR, expected_gates=0)
    violations += found
    tasks = ["t2va"]
    vision = (root / PROCESSOR_DIR / PROCESSOR_CONFIG_FILE).is_file()  # the image processor of fl2va and ref2va
    if vision:
        tasks.append("fl2va")
    if vision and (root / REF_TRANSFORMER_DIR).exists():
        found, ref_shards, ref_count = _check_transformer(root, None, REF_TRANSFORMER_DIR, expected_gates=0)
        violations += found
        shards += tuple(f"{REF_TRANSFORMER_DIR}/{name}" for name in ref_shards)
        tensor_count += ref_count
        tasks.append("ref2va")
    violations += _check_component(root, VIDEO_VAE_DIR, VIDEO_VAE_CLASS_NAME)
    violations += _check_component(root, AUDIO_VAE_DIR, AUDIO_VAE_CLASS_NAME)
    shifts = []
    for folder in SCHEDULER_DIRS:
        shift, problem = _scheduler_shift(root, folder)
        shifts.append(shift)
        if problem:
            violations.append(problem)
    if conditioner:
        violations += _check_conditioner(root)
    sampling_data, problem = _read_sampling(root)
    if problem:
        violations.append(problem)
    canvas, problem = read_canvas(root)
    if problem:
        violations.append(problem)
    if violations:
        return _NativeFindings(violations)
    sampling = NativeSampling(
        model_id=model_id, grid_points=sampling_data.get("num_inference_steps", NATIVE_DEFAULT_GRID_POINTS),
        video_shift=shifts[0], audio_shift=shifts[1],
        text_encoder_layer=sampling_data.get("text_encoder_layer", NATIVE_TEXT_LAYER),
        reference_short_edge=reference_edge)
    return _NativeFindings([], tuple(tasks), sampling, shards, tensor_count, canvas)


def release_capabilities(path: str | Path) -> tuple[ReleaseKind, tuple[str, ...]]:
    """(kind, tasks) of the release at ``path``; ``ContractError`` naming the first violation when it is invalid."""
    info = validate_release(path, conditioner=False)
    return info.kind, info.tasks


def find_violations(path: str | Path, *, require_pinned_base: bool = False) -> list[str]:
    """Every contract violation of the release at ``path``, one line each; empty when valid."""
    if release_kind_of(path) is ReleaseKind.NATIVE:
        return _inspect_native(Path(path)).violations
    return _inspect(path, require_pinned_base=require_pinned_base).violations


def validate_release(path: str | Path, *, require_pinned_base: bool = False, conditioner: bool = True) -> ReleaseInfo:
    """Check the release at ``path`` (§6, or the native layout); raise ``ContractError`` (a ``ValueError``) naming
    the first violation."""
    if release_kind_of(path) is ReleaseKind.NATIVE:
        return _validate_native(Path(path), conditioner=conditioner)
    found = _inspect(path, require_pinned_base=require_pinned_base, conditioner=conditioner)
    if found.violations:
        raise ContractError(found.violations)
    assert found.entry is not None and found.revision is not None
    contract = found.entry.contract
    return ReleaseInfo(
        path=Path(path).resolve(),
        entry=found.entry,
        contract_hash=contract.sha256(),
        base_repo_id=found.entry.base_repo_id,
        base_revision=found.revision,
        metadata=derive_metadata(contract),
        num_inference_steps=contract.transformer_forwards,
        shard_files=found.shards,
        tensor_count=found.tensor_count,
        startup_log_line=startup_log_line(contract),
        canvas=found.canvas,
    )


def _validate_native(root: Path, *, conditioner: bool) -> ReleaseInfo:
    found = _inspect_native(root, conditioner=conditioner)
    if found.violations:
        raise ContractError(found.violations)
    sampling = found.sampling
    assert sampling is not None
    grid = [round(1 - i / (sampling.grid_points - 1), 6) for i in range(sampling.grid_points)]
    return ReleaseInfo(
        path=root.resolve(),
        entry=None,
        contract_hash=sampling.sha256(),
        base_repo_id=sampling.model_id,
        base_revision="(this release)",  # the native release carries its own VAEs: nothing is fetched
        metadata=ReleaseMetadata(partition="fl2va", tasks=found.tasks,
                                 sigma_shift_scales={"video": sampling.video_shift, "audio": sampling.audio_shift},
                                 base_schedule=tuple(grid)),
        num_inference_steps=sampling.forwards,
        shard_files=found.shards,
        tensor_count=found.tensor_count,
        startup_log_line=sampling.startup_log_line(),
        canvas=found.canvas,
        kind=ReleaseKind.NATIVE,
        tasks=found.tasks,
        native=sampling,
    )


def main(argv: list[str]) -> int:
    """``h3batch check-release DIR``: one summary line and exit 0, or one line per violation and exit 2."""
    parser = OneLineArgumentParser(prog="h3batch check-release",
                                   description="validate a FastH3 V2 or native MiniMax-H3 release directory; prints "
                                               "its kind and tasks")
    parser.add_argument("release_dir", help="release directory (fastvideo_inference.json for V2, "
                                            "modular_model_index.json alone for the native release)")
    parser.add_argument("--require-pinned-base", action="store_true", default=None,
                        help="refuse a base revision that is not a 40-hex commit "
                             "(default: $H3BATCH_REQUIRE_PINNED_BASE)")
    args = parser.parse_args(argv)
    pinned = bool(args.require_pinned_base or env_value("H3BATCH_REQUIRE_PINNED_BASE"))
    violations = find_violations(args.release_dir, require_pinned_base=pinned)
    if violations:
        for line in violations:
            print(f"check-release: {line}", file=sys.stderr)
        return 2
    info = validate_release(args.release_dir, require_pinned_base=pinned)
    print(info.summary())
    return 0

