"""Release references: a local directory or a Hub repo at a revision, resolved to a local release folder (issue P4.1).

`--release` / `H3BATCH_RELEASE` take a directory, `org/name`, `org/name@revision` or `hf://org/name@revision`
(grammar: `h3batch.settings.HUB_RELEASE_RE`; an existing directory always wins over the Hub reading). A Hub reference
is fetched with ``huggingface_hub.snapshot_download`` at that revision (default ``main``) into the Hugging Face cache,
asking only for the files the caller's role needs (spec §6.1 download patterns, as the vllm-omni loader does):

* ``ReleaseRole.DIT``: a rank that runs the DiT only — the three contract files and ``transformer/**``;
* ``ReleaseRole.TEXT``: the rank that also encodes text (rank 0, or the single-process worker) — those plus
  ``text_encoder/**``, ``tokenizer/**`` and ``processor/**``.

The snapshot folder's name is the commit the revision resolved to; it is kept as ``ResolvedRelease.commit`` (logged
at start, on every job record, MP4 tag ``h3batch_release_commit``). Progress bars are huggingface_hub's own (on by
default; ``HF_HUB_DISABLE_PROGRESS_BARS=1`` turns them off, as ``h3batch worker`` does). With ``HF_HUB_OFFLINE=1``
only the cache is read; a reference the cache cannot serve raises ``ReleaseRefError`` whose one-line message names the
repo and revision. ``h3batch fetch-release REF`` pre-fetches (an init step in compose) and prints the local path.
"""
from __future__ import annotations

import enum
import sys
from dataclasses import dataclass
from pathlib import Path

from h3batch.cli_args import OneLineArgumentParser
from h3batch.settings import HUB_RELEASE_RE, env_value, unpinned_release
from h3batch.worker.h3.contract import (
    CONTRACT_FILE,
    MODULAR_INDEX_FILE,
    PROVENANCE_FILE,
    TEXT_ENCODER_DIR,
    TOKENIZER_DIR,
    TRANSFORMER_DIR,
)

DEFAULT_REVISION = "main"
PROCESSOR_DIR = "processor"


class ReleaseRole(enum.Enum):
    """What the process loading a release does with it, and so which files it fetches."""

    DIT = "dit"
    TEXT = "text"

    @property
    def allow_patterns(self) -> tuple[str, ...]:
        dit = (MODULAR_INDEX_FILE, CONTRACT_FILE, PROVENANCE_FILE, f"{TRANSFORMER_DIR}/**")
        if self is ReleaseRole.DIT:
            return dit
        return (*dit, f"{TEXT_ENCODER_DIR}/**", f"{TOKENIZER_DIR}/**", f"{PROCESSOR_DIR}/**")


class ReleaseRefError(ValueError):
    """A release reference that is malformed or that neither the disk nor the Hub (or its cache) can serve."""


@dataclass(frozen=True)
class ReleaseRef:
    """A parsed reference: `directory` for a local release, else `repo_id` at `revision` on the Hub."""

    text: str
    directory: Path | None = None
    repo_id: str | None = None
    revision: str = DEFAULT_REVISION

    @property
    def is_hub(self) -> bool:
        return self.repo_id is not None

    def __str__(self) -> str:
        return f"{self.repo_id}@{self.revision}" if self.is_hub else str(self.directory)


@dataclass(frozen=True)
class ResolvedRelease:
    """Where a reference's files are on this machine; `commit` is the Hub commit (None for a local directory)."""

    ref: ReleaseRef
    path: Path
    commit: str | None = None


def parse_release_ref(text: str | Path) -> ReleaseRef:
    """A directory (existing, or any text not in a Hub form) or a Hub repo at a revision (default `main`)."""
    raw = str(text).strip() if isinstance(text, (str, Path)) else ""
    if not raw:
        raise ReleaseRefError(f"release: expected a directory or org/name[@revision], found {text!r}")
    match = HUB_RELEASE_RE.fullmatch(raw)
    if raw.startswith("hf://") and match is None:
        raise ReleaseRefError(f"release: expected hf://org/name@revision, found {raw!r}")
    if match is None or (match["scheme"] is None and Path(raw).is_dir()):
        return ReleaseRef(raw, directory=Path(raw))
    return ReleaseRef(raw, repo_id=match["repo"], revision=match["revision"] or DEFAULT_REVISION)


def resolve_release(release: str | Path | ReleaseRef, role: ReleaseRole = ReleaseRole.TEXT,
                    cache_dir: str | Path | None = None) -> ResolvedRelease:
    """The local folder of `release` for `role`, fetching a Hub reference's role files into the cache first.

    Raises ReleaseRefError (one line naming repo and revision) when the Hub or the offline cache cannot serve it.
    A local directory is returned as it is (the contract check reports what it lacks).
    """
    ref = release if isinstance(release, ReleaseRef) else parse_release_ref(release)
    if not ref.is_hub:
        return ResolvedRelease(ref, ref.directory)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        snapshot = snapshot_download(repo_id=ref.repo_id, revision=ref.revision,
                                     allow_patterns=list(role.allow_patterns),
                                     cache_dir=str(cache_dir) if cache_dir is not None else None)
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as err:
        # LocalEntryNotFoundError: offline cache miss; HfHubHTTPError: unknown repo or revision online.
        no_dir = "" if ref.text.startswith("hf://") or "@" in ref.text else f" (and no directory {ref.text!r})"
        raise ReleaseRefError(
            f"release {ref.repo_id} at revision {ref.revision} is unavailable{no_dir} "
            f"(cache {cache_dir or 'default'}): {type(err).__name__}: {(str(err).splitlines() or [''])[0]}"
        ) from err
    path = Path(snapshot)
    return ResolvedRelease(ref, path, commit=path.name)


def main(argv: list[str]) -> int:
    """``h3batch fetch-release REF``: fetch what a role needs, print the local release folder; exit 2 on a miss."""
    parser = OneLineArgumentParser(prog="h3batch fetch-release",
                                   description="pre-fetch a release from the Hub and print its local folder")
    parser.add_argument("release", help="directory, org/name, org/name@revision or hf://org/name@revision")
    parser.add_argument("--role", choices=[r.value for r in ReleaseRole], default=ReleaseRole.TEXT.value,
                        help="text: everything a text-encoding rank loads (default); dit: contract + transformer")
    parser.add_argument("--hf-cache", default=None, help="Hugging Face cache (default: $HF_HUB_CACHE)")
    parser.add_argument("--require-commit", action="store_true",
                        help="refuse a revision that is not a 40-hex commit (on when H3BATCH_REQUIRE_PINNED_RELEASE is)")
    args = parser.parse_args(argv)
    if args.require_commit or env_value("H3BATCH_REQUIRE_PINNED_RELEASE"):
        if why := unpinned_release(args.release):
            print(f"h3batch fetch-release: release: {why}", file=sys.stderr)
            return 2
    try:
        resolved = resolve_release(args.release, ReleaseRole(args.role), cache_dir=args.hf_cache)
    except ReleaseRefError as err:
        print(f"h3batch fetch-release: {err}", file=sys.stderr)
        return 2
    if not resolved.path.is_dir():
        print(f"h3batch fetch-release: release directory {str(resolved.path)!r} does not exist", file=sys.stderr)
        return 2
    print(resolved.path)
    return 0
