"""Base-VAE fetch through huggingface_hub at the pinned revision, offline from the tiny hub cache (spec §6.3, §13.6)."""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest
from huggingface_hub import snapshot_download
from huggingface_hub.utils import filter_repo_objects

from h3batch.worker.h3.base_vae_fetch import BaseModelError, fetch_base_vaes, resolve_base_vaes
from h3batch.worker.h3.contract import ContractError, validate_release
from h3batch.worker.h3.vae_checkpoint_convert import load_audio_vae, load_video_vae

REPO_ID = "MiniMaxAI/MiniMax-H3"
PATTERNS = ["FL2VA/video_vae/**", "FL2VA/audio_vae/**"]


class _OpenRecorder:
    """Records every path Python opens or lists while active (audit hooks cannot be removed, so it is toggled)."""

    def __init__(self) -> None:
        self.active = False
        self.paths: list[str] = []
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple) -> None:
        if self.active and event in ("open", "os.listdir", "os.scandir") and args:
            if isinstance(args[0], (str, bytes, os.PathLike)):
                self.paths.append(os.path.realpath(os.fsdecode(args[0])))


RECORDER = _OpenRecorder()


def _storage(cache: Path) -> Path:
    return cache / "models--MiniMaxAI--MiniMax-H3"


def _split_repo_files(cache: Path, commit: str) -> tuple[dict[str, Path], dict[str, Path]]:
    """(files inside the two VAE patterns, files outside) -> their blob paths, from the cached tree listing."""
    storage = _storage(cache)
    tree = json.loads((storage / "trees" / f"{commit}.json").read_text())["files"]
    blob = {path: storage / "blobs" / (info.get("lfs_sha256") or info["blob_id"]) for path, info in tree.items()}
    inside = set(filter_repo_objects(items=list(tree), allow_patterns=PATTERNS))
    return {p: b for p, b in blob.items() if p in inside}, {p: b for p, b in blob.items() if p not in inside}


def _tree_state(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def test_fetch_returns_fl2va_root_of_pinned_snapshot(tiny):
    """The FL2VA root lies in the cache snapshot of exactly the provenance commit and holds both VAE folders."""
    info = validate_release(tiny.release_dir)
    root = fetch_base_vaes(info, cache_dir=tiny.hf_cache)
    assert root == _storage(tiny.hf_cache) / "snapshots" / tiny.base_commit / "FL2VA"
    assert (root / "video_vae" / "source" / "model.safetensors").is_file()
    assert (root / "audio_vae" / "model.safetensors").is_file()
    assert fetch_base_vaes(tiny.release_dir, cache_dir=tiny.hf_cache) == root  # a directory works as well


def test_files_outside_the_patterns_are_not_needed(tiny, cache_copy):
    """With every blob outside the two patterns deleted, fetch and both VAE loads still succeed."""
    inside, outside = _split_repo_files(cache_copy, tiny.base_commit)
    assert len(inside) == 6 and len(outside) >= 5
    for blob in outside.values():
        blob.unlink()
    root = fetch_base_vaes(tiny.release_dir, cache_dir=cache_copy)
    load_video_vae(root)
    load_audio_vae(root)
    # Control: a fetch without the patterns notices the deleted files, so the deletion would have been caught.
    with pytest.raises(OSError, match="cannot find the requested files in the local cache"):
        snapshot_download(REPO_ID, revision=tiny.base_commit, cache_dir=cache_copy)


def test_files_outside_the_patterns_are_never_opened(tiny):
    """While fetching and loading, Python never opens or lists a path of a file outside the two patterns."""
    inside, outside = _split_repo_files(tiny.hf_cache, tiny.base_commit)
    snapshot = _storage(tiny.hf_cache) / "snapshots" / tiny.base_commit
    forbidden = {os.path.realpath(b) for b in outside.values()} | {str(snapshot / p) for p in outside}
    RECORDER.paths.clear()
    RECORDER.active = True
    try:
        root = fetch_base_vaes(tiny.release_dir, cache_dir=tiny.hf_cache)
        load_video_vae(root)
        load_audio_vae(root)
    finally:
        RECORDER.active = False
    opened = set(RECORDER.paths)
    assert os.path.realpath(inside["FL2VA/video_vae/config.json"]) in opened  # the recorder does see reads
    assert not opened & forbidden
    assert not [p for p in opened if "video_vae_legacy" in p or "Ref2VA" in p or p.endswith("README.md")]


def test_missing_vae_blob_fails_naming_the_revision(tiny, cache_copy):
    """If a file inside the patterns is absent from the cache, the fetch fails naming repo and revision."""
    inside, _ = _split_repo_files(cache_copy, tiny.base_commit)
    inside["FL2VA/audio_vae/model.safetensors"].unlink()
    with pytest.raises(BaseModelError, match=tiny.base_commit) as err:
        fetch_base_vaes(tiny.release_dir, cache_dir=cache_copy)
    assert REPO_ID in str(err.value)


def test_unknown_commit_fails_naming_the_revision(tiny, release_copy):
    """A well-formed but unknown commit is unavailable offline; the error names it."""
    unknown = "0123456789abcdef0123456789abcdef01234567"
    (release_copy / "provenance.json").write_text(json.dumps({"base_model": f"hf://{REPO_ID}@{unknown}"}))
    with pytest.raises(BaseModelError, match=unknown):
        fetch_base_vaes(release_copy, cache_dir=tiny.hf_cache)


def test_branch_revision_resolves_to_its_commit_unless_pinning_is_required(tiny, release_copy):
    """`@main` is fetched at the commit refs/main names and that commit is reported; require_pinned refuses it."""
    assert (_storage(tiny.hf_cache) / "refs" / "main").read_text() == tiny.base_commit
    (release_copy / "provenance.json").write_text(json.dumps({"base_model": f"hf://{REPO_ID}@main"}))
    base = resolve_base_vaes(release_copy, cache_dir=tiny.hf_cache)
    assert (base.revision, base.commit) == ("main", tiny.base_commit)
    assert base.root == _storage(tiny.hf_cache) / "snapshots" / tiny.base_commit / "FL2VA"
    with pytest.raises(ContractError, match="provenance.*'hf://MiniMaxAI/MiniMax-H3@main'"):
        fetch_base_vaes(release_copy, cache_dir=tiny.hf_cache, require_pinned=True)
    unpinned = dataclasses.replace(validate_release(tiny.release_dir), base_revision="main")
    with pytest.raises(BaseModelError, match="'main'"):
        fetch_base_vaes(unpinned, cache_dir=tiny.hf_cache, require_pinned=True)


def test_unknown_tag_fails_naming_repo_and_revision(tiny, release_copy):
    """A tag the cache has no ref for is unavailable offline; the error names the repo and the tag."""
    (release_copy / "provenance.json").write_text(json.dumps({"base_model": f"hf://{REPO_ID}@v9.9"}))
    with pytest.raises(BaseModelError, match=f"{REPO_ID} at revision v9.9"):
        resolve_base_vaes(release_copy, cache_dir=tiny.hf_cache)


def test_nothing_is_written_into_the_release_directory(tiny):
    """Fetching and loading both VAEs leaves the release tree (names, sizes, mtimes) unchanged."""
    before = _tree_state(tiny.release_dir)
    root = fetch_base_vaes(tiny.release_dir, cache_dir=tiny.hf_cache)
    load_video_vae(root)
    load_audio_vae(root)
    assert _tree_state(tiny.release_dir) == before
    assert not Path(root).is_relative_to(tiny.release_dir)
