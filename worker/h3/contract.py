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
    entry: RegistryEntry
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

    @property
    def model_id(self) -> str:
        return self.entry.model_id

    def summary(self) -> str:
        return (
            f"release OK: model_id={self.model_id} contract_sha256={self.contract_hash} "
            f"shards={len(self.shard_files)} tensors={self.tensor_count} "
            f"base={self.base_repo_id}@{self.base_revision}"
        )


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


def _check_transformer(root: Path, entry: RegistryEntry | None) -> tuple[list[str], tuple[str, ...], int]:
    """Transformer config, index, shards and gates; returns (violations, shard files, tensor count)."""
    tdir = root / TRANSFORMER_DIR
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
    if entry is not None:
        gates = sorted(int(m.group(1)) for k in weight_map if (m := GATE_KEY_RE.fullmatch(k)))
        expected = list(range(entry.expected_gate_count))
        if gates != expected:
            missing = sorted(set(expected) - set(gates))
            extra = sorted(set(gates) - set(expected))
            violations.append(
                f"{index_name}: expected {entry.expected_gate_count} compression gates "
                f"transformer_blocks.{{0..{entry.expected_gate_count - 1}}}.attn.to_gate_compress.weight, "
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


def find_violations(path: str | Path, *, require_pinned_base: bool = False) -> list[str]:
    """Every contract violation of the release at ``path``, one line each; empty when valid."""
    return _inspect(path, require_pinned_base=require_pinned_base).violations


def validate_release(path: str | Path, *, require_pinned_base: bool = False, conditioner: bool = True) -> ReleaseInfo:
    """Check the release at ``path`` (§6); raise ``ContractError`` (a ``ValueError``) naming the first violation."""
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


def main(argv: list[str]) -> int:
    """``h3batch check-release DIR``: one summary line and exit 0, or one line per violation and exit 2."""
    parser = OneLineArgumentParser(prog="h3batch check-release", description="validate a FastH3 release directory")
    parser.add_argument("release_dir", help="release directory (holds fastvideo_inference.json)")
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

