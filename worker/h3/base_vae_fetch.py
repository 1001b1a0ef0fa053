"""Fetch the base VAEs a FastH3 release names in its provenance (spec §6.3).

A validated release pins ``hf://MiniMaxAI/MiniMax-H3@<40-hex commit>``. From that repo, at exactly that commit, only
``FL2VA/video_vae/**`` and ``FL2VA/audio_vae/**`` are requested through ``huggingface_hub.snapshot_download`` (into the
Hugging Face cache, never into the release directory); both folders must then be present. The returned path is the
``FL2VA`` root that ``h3batch.worker.h3.vae_checkpoint_convert.load_video_vae`` / ``load_audio_vae`` read.

Set ``HF_HUB_OFFLINE=1`` to resolve from the cache only (tests, air-gapped workers).
"""
from __future__ import annotations

from pathlib import Path

from h3batch.worker.h3.contract import COMMIT_RE, VAE_ALLOW_PATTERNS, VAE_ROOT, ReleaseInfo, validate_release


class BaseModelError(ValueError):
    """The pinned base repo revision cannot be resolved or lacks the VAE folders."""


def fetch_base_vaes(release: ReleaseInfo | str | Path, cache_dir: str | Path | None = None) -> Path:
    """Download (or resolve from cache) the two native VAE folders at the pinned revision; return the FL2VA root.

    ``release`` is a ``ReleaseInfo`` or a release directory (validated first). ``cache_dir`` defaults to the
    huggingface_hub cache (``$HF_HUB_CACHE``). Raises ``ContractError`` for an unpinned provenance and
    ``BaseModelError`` naming the repo and revision when that revision is unavailable or incomplete.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    info = release if isinstance(release, ReleaseInfo) else validate_release(release)
    repo_id, revision = info.base_repo_id, info.base_revision
    if not COMMIT_RE.fullmatch(revision):  # validate_release guarantees it; a hand-made ReleaseInfo might not
        raise BaseModelError(f"base model {repo_id} revision {revision!r} is not pinned: expected a 40-hex commit")
    try:
        snapshot = snapshot_download(
            repo_id=repo_id,
            revision=revision,
            allow_patterns=list(VAE_ALLOW_PATTERNS),
            cache_dir=str(cache_dir) if cache_dir is not None else None,
        )
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as err:
        # HfHubHTTPError covers RevisionNotFoundError / RepositoryNotFoundError; LocalEntryNotFoundError and the
        # incomplete-snapshot error are what an offline cache miss raises.
        raise BaseModelError(
            f"base model {repo_id} at revision {revision} is unavailable "
            f"(cache {cache_dir or 'default'}): {type(err).__name__}: {str(err).splitlines()[0]}"
        ) from err
    root = Path(snapshot) / VAE_ROOT
    for folder in ("video_vae", "audio_vae"):
        if not (root / folder).is_dir() or not any((root / folder).iterdir()):
            raise BaseModelError(
                f"base model {repo_id} at revision {revision} has no {VAE_ROOT}/{folder}/ files: "
                f"expected them under {root}"
            )
    return root
