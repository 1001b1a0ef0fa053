"""Fetch the base VAEs a FastH3 release names in its provenance (spec §6.3).

A validated release names ``hf://MiniMaxAI/MiniMax-H3@<revision>``: a commit, or a tag or branch. From that repo, at
that revision, only ``FL2VA/video_vae/**`` and ``FL2VA/audio_vae/**`` are requested through
``huggingface_hub.snapshot_download`` (into the Hugging Face cache, never into the release directory); both folders
must then be present. The snapshot folder is named by the commit the revision resolved to, which ``resolve_base_vaes``
returns beside the ``FL2VA`` root that ``h3batch.worker.h3.vae_checkpoint_convert.load_video_vae`` /
``load_audio_vae`` read: the worker logs it at start, keeps it on every job record and writes it as MP4 tag
``h3batch_base_commit``, so a clip names the exact base weights even when the release named a branch.

Set ``HF_HUB_OFFLINE=1`` to resolve from the cache only (tests, air-gapped workers).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from h3batch.worker.h3.contract import COMMIT_RE, VAE_ALLOW_PATTERNS, VAE_ROOT, ReleaseInfo, validate_release


class BaseModelError(ValueError):
    """The base repo revision cannot be resolved or lacks the VAE folders."""


@dataclass(frozen=True)
class BaseVaes:
    """The fetched base VAEs: their FL2VA root and the commit the provenance revision resolved to."""

    root: Path
    repo_id: str
    revision: str
    commit: str


def fetch_base_vaes(release: ReleaseInfo | str | Path, cache_dir: str | Path | None = None, *,
                    require_pinned: bool = False) -> Path:
    """The FL2VA root of ``resolve_base_vaes`` (same arguments and errors)."""
    return resolve_base_vaes(release, cache_dir, require_pinned=require_pinned).root


def resolve_base_vaes(release: ReleaseInfo | str | Path, cache_dir: str | Path | None = None, *,
                      require_pinned: bool = False) -> BaseVaes:
    """Download (or resolve from cache) the two native VAE folders at the provenance revision.

    ``release`` is a ``ReleaseInfo`` or a release directory (validated first). ``cache_dir`` defaults to the
    huggingface_hub cache (``$HF_HUB_CACHE``). Raises ``ContractError`` for a malformed provenance,
    ``BaseModelError`` for a revision that is not a 40-hex commit when ``require_pinned``, and ``BaseModelError``
    naming the repo and revision when that revision is unavailable or incomplete.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    info = release if isinstance(release, ReleaseInfo) else validate_release(release,
                                                                             require_pinned_base=require_pinned)
    repo_id, revision = info.base_repo_id, info.base_revision
    if require_pinned and not COMMIT_RE.fullmatch(revision):  # a hand-made ReleaseInfo may carry anything
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
    commit = Path(snapshot).name  # the cache names each snapshot folder by its commit
    for folder in ("video_vae", "audio_vae"):
        if not (root / folder).is_dir() or not any((root / folder).iterdir()):
            raise BaseModelError(
                f"base model {repo_id} at revision {revision} has no {VAE_ROOT}/{folder}/ files: "
                f"expected them under {root}"
            )
    return BaseVaes(root, repo_id, revision, commit)
