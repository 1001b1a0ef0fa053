"""The native MiniMax-H3 release kind: layout check, kind and tasks, `build-tiny --kind native`, heartbeat facts."""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from h3batch.core.routing import Capability
from h3batch.settings import Settings
from h3batch.worker import capacity
from h3batch.worker.h3 import contract
from h3batch.worker.h3.tiny_release import build_tiny_native_release


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_tiny_native_release_is_native_and_serves_three_tasks(native):
    """The tiny native release validates as kind native with t2va, fl2va and ref2va, diffusers' shifts 12 / 3 read
    from its scheduler configs and its own 4-point grid (3 forwards)."""
    info = contract.validate_release(native.release_dir)
    assert info.kind is contract.ReleaseKind.NATIVE and info.entry is None
    assert info.tasks == ("t2va", "fl2va", "ref2va")
    assert contract.release_capabilities(native.release_dir) == (contract.ReleaseKind.NATIVE, info.tasks)
    assert info.native.video_shift == 12.0 and info.native.audio_shift == 3.0
    assert (info.native.grid_points, info.num_inference_steps, info.text_hidden_layer) == (4, 3, 2)
    assert info.vsa_sparsity == 0.0 and info.model_id == "h3batch/MiniMax-H3-native-tiny"
    for folder in ("transformer", "transformer_ref", "vae", "audio_vae", "scheduler", "audio_scheduler",
                   "text_encoder", "tokenizer"):
        assert (native.release_dir / folder).is_dir(), folder
    assert not (native.release_dir / contract.CONTRACT_FILE).exists()


def test_published_defaults_without_the_sampling_file(native_copy):
    """Without h3batch_sampling.json the release samples as diffusers does by default: 50 grid points, 49 forwards,
    text-encoder layer 50 (the tiny encoder then cannot serve it, but the contract facts are the published ones)."""
    (native_copy / contract.SAMPLING_FILE).unlink()
    info = contract.validate_release(native_copy)
    assert (info.native.grid_points, info.num_inference_steps, info.text_hidden_layer) == (50, 49, 50)


def test_without_the_ref_partition_ref2va_is_not_served(native_copy):
    shutil.rmtree(native_copy / "transformer_ref")
    assert contract.release_capabilities(native_copy) == (contract.ReleaseKind.NATIVE, ("t2va", "fl2va"))


@pytest.mark.parametrize("damage,expected", [
    (lambda r: (r / "scheduler" / "scheduler_config.json").unlink(), "scheduler/missing required file "
                                                                     "scheduler_config.json"),
    (lambda r: (r / "audio_scheduler" / "scheduler_config.json").write_text('{"_class_name": "MiniMaxH3Scheduler", '
                                                                             '"shift": -1}'),
     "audio_scheduler/scheduler_config.json: shift=-1, expected a positive number"),
    (lambda r: [p.unlink() for p in (r / "vae").glob("*.safetensors")], "missing required file(s) in vae/"),
    (lambda r: (r / contract.SAMPLING_FILE).write_text('{"num_inference_steps": 1}'),
     "h3batch_sampling.json: num_inference_steps=1, expected an integer >= 2"),
    (lambda r: (r / "transformer_ref" / "config.json").unlink(), "transformer_ref/missing required file config.json"),
])
def test_native_violations_name_the_file(native_copy, capsys, damage, expected):
    """A damaged native release fails check-release with exit 2 and one line naming the file and what was expected."""
    damage(native_copy)
    assert contract.main([str(native_copy)]) == 2
    assert expected in capsys.readouterr().err


def test_a_gated_transformer_is_not_a_native_partition(native_copy):
    """The index of a native partition naming VSA compression gates is refused (a V2 DiT in the wrong layout)."""
    index_path = native_copy / "transformer" / contract.TRANSFORMER_INDEX_FILE
    index = json.loads(index_path.read_text())
    shard = next(iter(index["weight_map"].values()))
    index["weight_map"]["transformer_blocks.0.attn.to_gate_compress.weight"] = shard
    index_path.write_text(json.dumps(index))
    with pytest.raises(contract.ContractError, match="expected 0 compression gates"):
        contract.validate_release(native_copy)


def test_check_release_prints_kind_and_tasks(native):
    """`h3batch check-release` on the native release: exit 0, one line with kind and tasks."""
    run = subprocess.run([sys.executable, "-P", "-m", "h3batch.cli", "check-release", str(native.release_dir)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("release OK: kind=native tasks=t2va,fl2va,ref2va model_id=h3batch/MiniMax-H3-native")


def test_build_is_deterministic_and_the_cli_writes_the_same_bytes(native, tmp_path):
    """Same seed -> byte-identical native release, from the function and from `h3batch build-tiny --kind native`."""
    run = subprocess.run([sys.executable, "-P", "-m", "h3batch.cli", "build-tiny", "--kind", "native", "--out",
                          str(tmp_path / "cli")], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "tasks t2va, fl2va, ref2va" in run.stdout
    assert _digest(tmp_path / "cli") == _digest(native.release_dir)
    other = build_tiny_native_release(tmp_path / "other", seed=1)
    assert _digest(other.release_dir) != _digest(native.release_dir)


def test_the_heartbeat_capability_advertises_kind_and_tasks(native):
    """A worker on the native release advertises kind native and the tasks its pipeline renders, whose render
    queues it consumes; a pipeline that implements fewer tasks than its release holds advertises only those."""

    class Loaded:
        info = contract.validate_release(native.release_dir)
        canvas = info.canvas
        tasks = ("t2va",)

    cap = capacity.capability_of(Loaded(), Settings.from_env({}), 3000)
    assert (cap.release_kind, cap.tasks) == ("native", ("t2va",))
    assert Capability.from_json(json.loads(json.dumps(cap.as_json()))) == cap
    assert all(q.startswith("render.t2va.bf16.") for q in cap.queues())
    Loaded.tasks = None
    assert capacity.release_kind_and_tasks(Loaded()) == ("native", ("t2va", "fl2va", "ref2va"))


def test_a_rank_group_refuses_the_native_release_at_start(native):
    """H3BATCH_RANKS > 1 on a native release stops at load with one line naming the variable and what serves it,
    before any weight is loaded."""
    from h3batch.worker.pipeline import Pipeline

    with pytest.raises(ValueError, match=r"H3BATCH_RANKS=2: a native MiniMax-H3 release is served by one GPU per "
                                         r"worker \(H3BATCH_RANKS=1\)"):
        Pipeline.load(native.release_dir, device="cpu", ranks=2)
