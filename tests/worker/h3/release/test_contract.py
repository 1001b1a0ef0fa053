"""Checkpoint contract: registry, `validate_release`, `h3batch check-release` (spec §6, §13.5-6)."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from h3batch.worker.h3 import contract
from h3batch.worker.h3.contract import ContractError, check_contract, find_violations, validate_release

REPO = Path(__file__).resolve().parents[4]

# The V2 block exactly as spec §6.2 lists it (written out here, not taken from the module under test).
V2_CONTRACT = {
    "model_id": "FastVideo/FastVideo-FastH3-8-Step-V2",
    "schema_version": "fasth3-inference-contract-v1",
    "dmd_denoising_steps": [999, 874, 749, 624, 500, 375, 250, 125],
    "transformer_forwards": 8,
    "video_scheduler_shift": 10.0,
    "audio_scheduler_shift": 3.0,
    "guidance_scale": 1.0,
    "attention_backend": "VIDEO_SPARSE_ATTN_H3",
    "vsa_sparsity": 0.8,
    "vsa_tile_size": 64,
    "task": "t2av",
}
DRIFTS = [
    ("model_id", "FastVideo/FastH3-other"),
    ("schema_version", "fasth3-inference-contract-v0"),
    ("dmd_denoising_steps", [999, 749, 500, 250]),
    ("transformer_forwards", 4),
    ("video_scheduler_shift", 12.0),
    ("audio_scheduler_shift", 4.0),
    ("guidance_scale", 2.0),
    ("attention_backend", "FLASH_ATTN"),
    ("vsa_sparsity", 0.9),
    ("vsa_tile_size", 32),
    ("task", "t2va"),
]
BOOLEANS = [("guidance_scale", True), ("transformer_forwards", True), ("dmd_denoising_steps", [True] * 8)]
PROVENANCE_REJECTED = [
    {"base_model": "MiniMaxAI/MiniMax-H3@main"},
    {"base_model": "hf://MiniMaxAI/MiniMax-H3@"},
    {"base_model": "hf://Other/MiniMax-H3@revision"},
    {"base_model": ""},
    {"base_model": None},
    {},
    {"base_model": "hf://MiniMaxAI/MiniMax-H3@  "},  # a blank revision is no revision
]
UNPINNED = [
    {"base_model": "hf://MiniMaxAI/MiniMax-H3@main"},  # a branch
    {"base_model": "hf://MiniMaxAI/MiniMax-H3@v1.0"},  # a tag
    {"base_model": "hf://MiniMaxAI/MiniMax-H3@" + "A" * 40},  # commit ids are lowercase hex
]


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _cli(release: Path, capsys) -> tuple[int, list[str], list[str]]:
    code = contract.main([str(release)])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def test_tiny_release_validates(tiny):
    """The built tiny release passes and reports its registry entry, pinned base commit and tensor inventory."""
    info = validate_release(tiny.release_dir)
    assert info.entry is contract.FASTH3_V2_TINY
    assert info.base_repo_id == "MiniMaxAI/MiniMax-H3" and info.base_revision == tiny.base_commit
    assert info.tensor_count == 74 + 3  # 18 + 12·3 + 10·2 diffusers keys + one gate per DiT block
    assert len(info.shard_files) >= 2
    assert info.num_inference_steps == 8


def test_cli_summary_line_on_valid_release(tiny):
    """`h3batch check-release DIR` exits 0 with one line naming model id, contract hash, shards and tensors."""
    run = subprocess.run(
        [sys.executable, "-P", "-m", "h3batch.cli", "check-release", str(tiny.release_dir)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 1
    info = validate_release(tiny.release_dir)
    for part in (info.model_id, info.contract_hash, f"shards={len(info.shard_files)}", "tensors=77"):
        assert part in lines[0]


def test_real_v2_contract_is_accepted_and_hash_is_canonical_json():
    """The literal V2 block of §6.2 matches the V2 entry; the hash is sha256 of its sorted, compact JSON."""
    violations, entry = check_contract(dict(V2_CONTRACT))
    assert violations == [] and entry is contract.FASTH3_V2
    canonical = json.dumps(V2_CONTRACT, sort_keys=True, separators=(",", ":"))
    assert contract.FASTH3_V2.contract.sha256() == hashlib.sha256(canonical.encode()).hexdigest()


def test_python_equality_accepts_int_valued_floats():
    """Equality is Python `!=`: `8.0` passes for `8`, `64.0` for `64` (§6.2)."""
    data = dict(V2_CONTRACT, transformer_forwards=8.0, vsa_tile_size=64.0)
    assert check_contract(data)[0] == []


@pytest.mark.parametrize("field,value", DRIFTS, ids=[f for f, _ in DRIFTS])
def test_single_drift_names_the_field(release_copy, capsys, field, value):
    """Each of the 11 single drifts fails validation with the §6.2 message and the CLI prints exactly that line."""
    _edit_json(release_copy / "fastvideo_inference.json", lambda d: d.__setitem__(field, value))
    with pytest.raises(ContractError) as err:
        validate_release(release_copy)
    assert str(err.value).startswith(f"unsupported FastH3 contract: {field}={value!r}, expected ")
    code, out, lines = _cli(release_copy, capsys)
    assert code == 2 and out == []
    assert len(lines) == 1 and f"{field}={value!r}" in lines[0]


def test_missing_task_reads_as_null(release_copy, capsys):
    """A dropped `task` key reads as None and fails on `task`."""
    _edit_json(release_copy / "fastvideo_inference.json", lambda d: d.pop("task"))
    with pytest.raises(ContractError, match=r"^unsupported FastH3 contract: task=None, expected 't2av'$"):
        validate_release(release_copy)
    code, _, lines = _cli(release_copy, capsys)
    assert code == 2 and len(lines) == 1 and "task=None" in lines[0]


@pytest.mark.parametrize("field,value", BOOLEANS, ids=[f for f, _ in BOOLEANS])
def test_booleans_are_rejected(field, value):
    """`True == 1` in Python, but a boolean is never an accepted contract value."""
    violations, _ = check_contract(dict(V2_CONTRACT, **{field: value}))
    assert len(violations) == 1 and violations[0].startswith(f"unsupported FastH3 contract: {field}=")


def test_legacy_release_block_fails_on_model_id_first():
    """A legacy MiniMax release block fails, and its first violation is `model_id`."""
    legacy = {"schema_version": 1, "partition": "fl2va", "tasks": ["t2va"], "sigma_shift_scales": {"video": 10.0}}
    violations, entry = check_contract(legacy)
    assert entry is None
    assert violations[0].startswith("unsupported FastH3 contract: model_id=None, expected ")


def test_every_violation_gets_its_own_line(release_copy, capsys):
    """Two drifts and a missing tokenizer give three lines, in check order."""
    def drift(d):
        d["guidance_scale"] = 2.0
        d["vsa_tile_size"] = 32
    _edit_json(release_copy / "fastvideo_inference.json", drift)
    for p in (release_copy / "tokenizer").iterdir():
        p.unlink()
    code, _, lines = _cli(release_copy, capsys)
    assert code == 2 and len(lines) == 3
    assert "guidance_scale=2.0" in lines[0] and "vsa_tile_size=32" in lines[1] and "tokenizer/" in lines[2]


@pytest.mark.parametrize("provenance", UNPINNED, ids=range(len(UNPINNED)))
def test_any_non_empty_revision_is_accepted_unless_pinning_is_required(release_copy, capsys, monkeypatch, provenance):
    """A branch, a tag or upper-case hex is a revision (as vllm-omni reads it); REQUIRE_PINNED_BASE refuses it."""
    (release_copy / "provenance.json").write_text(json.dumps(provenance))
    revision = provenance["base_model"].split("@", 1)[1]
    assert validate_release(release_copy).base_revision == revision
    with pytest.raises(ContractError, match=r"provenance.*H3BATCH_REQUIRE_PINNED_BASE.*40-hex") as err:
        validate_release(release_copy, require_pinned_base=True)
    assert repr(provenance["base_model"]) in str(err.value)
    assert _cli(release_copy, capsys)[0] == 0
    monkeypatch.setenv("H3BATCH_REQUIRE_PINNED_BASE", "1")
    code, _, lines = _cli(release_copy, capsys)
    assert code == 2 and len(lines) == 1 and "40-hex" in lines[0]


@pytest.mark.parametrize("provenance", PROVENANCE_REJECTED, ids=range(len(PROVENANCE_REJECTED)))
def test_provenance_must_name_a_base_revision(release_copy, capsys, provenance):
    """The §6.3 rejected forms (and a blank revision) fail naming provenance and the value, pinned or not."""
    (release_copy / "provenance.json").write_text(json.dumps(provenance))
    with pytest.raises(ContractError, match="provenance") as err:
        validate_release(release_copy)
    assert repr(provenance.get("base_model")) in str(err.value)
    code, _, lines = _cli(release_copy, capsys)
    assert code == 2 and len(lines) == 1 and "provenance" in lines[0]


def _drop_index(r: Path) -> None:
    (r / "transformer" / "diffusion_pytorch_model.safetensors.index.json").unlink()


def _drop_first_shard(r: Path) -> None:
    sorted((r / "transformer").glob("*-of-*.safetensors"))[0].unlink()


def _extra_shard(r: Path) -> None:
    (r / "transformer" / "diffusion_pytorch_model-00009-of-00009.safetensors").write_bytes(b"stray")


def _drop_gate(r: Path) -> None:
    _edit_json(
        r / "transformer" / "diffusion_pytorch_model.safetensors.index.json",
        lambda d: d["weight_map"].pop("transformer_blocks.1.attn.to_gate_compress.weight"),
    )


def _drop_dir(name):
    def drop(r: Path) -> None:
        for p in (r / name).iterdir():
            p.unlink()
        (r / name).rmdir()
    return drop


def _wrong_modular_class(r: Path) -> None:
    _edit_json(r / "modular_model_index.json", lambda d: d.__setitem__("_class_name", "MiniMaxH3Pipeline"))


FILE_VIOLATIONS = [
    ("missing-index", _drop_index, "diffusion_pytorch_model.safetensors.index.json"),
    ("missing-shard", _drop_first_shard, "missing shard named in transformer/"),
    ("extra-shard", _extra_shard, "extra file transformer/diffusion_pytorch_model-00009-of-00009.safetensors"),
    ("missing-gate", _drop_gate, "missing blocks [1]"),
    ("missing-text-encoder", _drop_dir("text_encoder"), "text_encoder/config.json"),
    ("missing-tokenizer", _drop_dir("tokenizer"), "tokenizer/tokenizer.json"),
    ("missing-provenance", lambda r: (r / "provenance.json").unlink(), "provenance.json"),
    ("missing-contract", lambda r: (r / "fastvideo_inference.json").unlink(), "fastvideo_inference.json"),
    ("wrong-modular-class", _wrong_modular_class, "_class_name='MiniMaxH3Pipeline'"),
]


@pytest.mark.parametrize(
    "damage,expected", [(d, e) for _, d, e in FILE_VIOLATIONS], ids=[i for i, _, _ in FILE_VIOLATIONS]
)
def test_file_violations_name_the_file(release_copy, capsys, damage, expected):
    """Missing or extra required files are each reported, naming the file, and fail the check."""
    damage(release_copy)
    violations = find_violations(release_copy)
    assert violations and any(expected in v for v in violations), violations
    with pytest.raises(ContractError):
        validate_release(release_copy)
    code, _, lines = _cli(release_copy, capsys)
    assert code == 2 and lines == [f"check-release: {v}" for v in violations]


def test_derived_metadata_and_startup_line(tiny):
    """Release metadata equals §6.4 exactly and the startup log line is vllm-omni's."""
    info = validate_release(tiny.release_dir)
    assert info.metadata.as_dict() == {
        "partition": "fl2va",
        "tasks": ["t2va"],
        "sigma_shift_scales": {"video": 10.0, "audio": 3.0},
        "base_schedule": [0.999, 0.874, 0.749, 0.624, 0.5, 0.375, 0.25, 0.125, 0.0],
    }
    assert info.startup_log_line == "8 transformer forwards, video/audio shifts 10/3, VSA sparsity=0.8 tile=64"


def test_cli_bad_arguments_one_line(capsys, tmp_path):
    """No argument, or a path that is not a directory, exits 2 with one line."""
    with pytest.raises(SystemExit) as exit_:
        contract.main([])
    assert exit_.value.code == 2 and len(capsys.readouterr().err.splitlines()) == 1
    code, _, lines = _cli(tmp_path / "nope", capsys)
    assert code == 2 and len(lines) == 1 and "nope" in lines[0]


def test_release_canvas_is_recorded_by_build_tiny_and_v2_by_default(tiny, release_copy):
    """build-tiny records the tiny canvas (256x128); a release without the file (the published V2) gets 1344x768."""
    from h3batch.core.geometry import TINY_CANVAS, V2_CANVAS

    assert validate_release(tiny.release_dir).canvas == TINY_CANVAS
    assert json.loads((tiny.release_dir / contract.CANVAS_FILE).read_text())["default_width"] == 256
    (release_copy / contract.CANVAS_FILE).unlink()
    assert validate_release(release_copy).canvas == V2_CANVAS and V2_CANVAS.default == (1344, 768)


@pytest.mark.parametrize("content, words", [
    ({"default_width": 250, "default_height": 128, "short_edge": 128, "max_pixels": 32768}, "width"),
    ({"default_width": 256}, "expected an object with keys"),
])
def test_malformed_canvas_file_is_a_violation(release_copy, content, words):
    """A canvas record that is incomplete or unrenderable is refused naming the file and the problem."""
    (release_copy / contract.CANVAS_FILE).write_text(json.dumps(content))
    violations = find_violations(release_copy)
    assert len(violations) == 1 and contract.CANVAS_FILE in violations[0] and words in violations[0]


def test_a_v2_release_is_kind_v2_serving_t2va(tiny):
    """Beside the native kind (tests/worker/h3/native/), a V2 release is recognised as kind v2 with task t2va."""
    info = validate_release(tiny.release_dir)
    assert info.kind.value == "v2" and info.tasks == ("t2va",) and info.native is None
    assert info.summary().startswith("release OK: kind=v2 tasks=t2va model_id=")
