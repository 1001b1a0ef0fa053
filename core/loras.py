"""The per-job LoRA request rule: which adapters a job may name and how they are written on its record. Torch-free.

A job names up to ``max_loras`` adapters as ``loras: [{"ref": ..., "scale": ...}]``. A ``ref`` is either

* the name of an entry of the operator's allow-list (``H3BATCH_LORA_ALLOW``: ``name=org/repo@<40-hex commit>`` for a
  Hub adapter, or ``name=/absolute/folder`` for one on the worker's disk), or
* a Hub reference ``org/repo@<40-hex commit>`` that the allow-list names (as an entry's target, or as a bare
  ``org/repo@<commit>`` entry). A branch, a tag or no revision is refused: a job must render the same weights on
  every worker and on every retry.

Never a URL: the worker only fetches from the Hub (into its cache) or reads an operator's folder. ``scale`` multiplies
the adapter's delta (diffusers' ``set_adapters`` weight), within ``[-MAX_SCALE, MAX_SCALE]``; default 1.

Refusals are ``LoraError``s with a stable code the API answers 400 with: ``too_many_loras``, ``unknown_lora``,
``lora_revision_not_allowed``, ``lora_scale_out_of_range`` (and ``invalid_request`` for a malformed item).
``lora_base_mismatch`` (the served release takes no adapters) depends on the fleet and is decided beside the capacity
check (api/job_service.py); the worker refuses the same way if the fleet changed since.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from h3batch.settings import LORA_ALLOW_ENTRY_RE

DEFAULT_MAX_LORAS = 4
MAX_SCALE = 4.0
ADAPTER_RELEASE_KINDS = ("native",)
"""Release kinds whose DiT takes adapters; a FastH3 V2 release is a full checkpoint (refused like vLLM-Omni does)."""
BASE_MISMATCH = "lora_base_mismatch"

_HUB_REF = re.compile(r"(?P<repo>[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*)(?:@(?P<revision>[^\s@]*))?")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


class LoraError(ValueError):
    """A refused ``loras`` field: ``code`` (the API's error code) and ``field`` (``loras[i].ref`` ...)."""

    def __init__(self, code: str, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.code = code
        self.field = field


@dataclass(frozen=True)
class LoraTarget:
    """Where one allowed adapter lives: a Hub repo at a commit, or a folder on the worker."""

    repo: str | None = None
    revision: str | None = None
    path: str | None = None

    @property
    def key(self) -> str:
        """Cache key on the worker: ``org/repo@commit`` or the folder."""
        return f"{self.repo}@{self.revision}" if self.repo else str(self.path)


@dataclass(frozen=True)
class LoraPolicy:
    """The operator's allow-list and limits, read once from the settings (``H3BATCH_LORA_ALLOW``,
    ``H3BATCH_MAX_LORAS``)."""

    named: Mapping[str, LoraTarget]
    max_loras: int = DEFAULT_MAX_LORAS

    @property
    def hub_refs(self) -> set[tuple[str, str]]:
        return {(t.repo, t.revision) for t in self.named.values() if t.repo}


def policy_of(entries: Sequence[str], max_loras: int = DEFAULT_MAX_LORAS) -> LoraPolicy:
    """The policy of ``Settings.lora_allow`` (entries already checked by h3batch.settings) and ``max_loras``."""
    named: dict[str, LoraTarget] = {}
    for entry in entries:
        match = LORA_ALLOW_ENTRY_RE.fullmatch(entry)
        if match is None:
            raise ValueError(f"H3BATCH_LORA_ALLOW: bad entry {entry!r}")
        if match["path"]:
            named[match["name"]] = LoraTarget(path=match["path"])
        else:
            target = LoraTarget(repo=match["repo"], revision=match["revision"])
            named[match["name"] or f"{target.repo}@{target.revision}"] = target
    return LoraPolicy(named, max_loras)


def _resolve(ref: str, policy: LoraPolicy, field: str) -> LoraTarget:
    if _URL.match(ref) or "//" in ref:
        raise LoraError("unknown_lora", field, f"a URL is never fetched; name an allow-listed adapter or "
                                               f"org/repo@<40-hex commit>, found {ref[:80]!r}")
    if ref in policy.named:
        return policy.named[ref]
    match = _HUB_REF.fullmatch(ref)
    if match is None:
        raise LoraError("unknown_lora", field, f"no adapter named {ref[:80]!r} on this server's allow-list")
    repo, revision = match["repo"], match["revision"]
    if not revision or not _COMMIT.fullmatch(revision):
        found = f"revision {revision!r}" if revision else "no revision"
        raise LoraError("lora_revision_not_allowed", field,
                        f"a Hub adapter must be pinned to a 40-hex commit (org/repo@<commit>), found {found}")
    if (repo, revision) in policy.hub_refs:
        return LoraTarget(repo=repo, revision=revision)
    if any(t.repo == repo for t in policy.named.values()):
        raise LoraError("lora_revision_not_allowed", field,
                        f"{repo}@{revision} is not on this server's allow-list (other revisions of {repo} are)")
    raise LoraError("unknown_lora", field, f"{repo} is not on this server's allow-list")


def check_loras(items: Sequence[Mapping[str, Any]] | None, policy: LoraPolicy) -> list[dict[str, Any]]:
    """The ``loras`` field of a create request -> the list written on the job record (``ref`` as asked, ``scale``,
    and ``repo``/``revision`` or ``path``). Raises LoraError for the first bad item."""
    if items is None:
        return []
    if not isinstance(items, (list, tuple)):
        raise LoraError("invalid_request", "loras", f"expected a list of {{ref, scale}} objects, found "
                                                    f"{type(items).__name__}")
    if len(items) > policy.max_loras:
        raise LoraError("too_many_loras", "loras",
                        f"expected at most {policy.max_loras} adapters per job (H3BATCH_MAX_LORAS), found {len(items)}")
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        where = f"loras[{i}]"
        if not isinstance(item, Mapping) or set(item) - {"ref", "scale"} or "ref" not in item:
            raise LoraError("invalid_request", where, "expected an object {\"ref\": ..., \"scale\": ...} "
                                                      "(ref required, no other keys)")
        ref = item["ref"]
        if not isinstance(ref, str) or not ref.strip():
            raise LoraError("invalid_request", f"{where}.ref", "expected a non-empty string")
        scale = item.get("scale", 1.0)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) \
                or abs(scale) > MAX_SCALE:
            raise LoraError("lora_scale_out_of_range", f"{where}.scale",
                            f"expected a number in [-{MAX_SCALE:g}, {MAX_SCALE:g}], found {scale!r}")
        target = _resolve(ref.strip(), policy, f"{where}.ref")
        if target.key in seen:
            raise LoraError("invalid_request", f"{where}.ref", f"adapter {ref!r} is named twice; give it once "
                                                               "with the summed scale")
        seen.add(target.key)
        record = {"ref": ref.strip(), "scale": float(scale)}
        record.update({"repo": target.repo, "revision": target.revision} if target.repo else {"path": target.path})
        out.append(record)
    return out


def base_refusal(kinds: Sequence[str]) -> str | None:
    """Why no worker of release kinds ``kinds`` can apply adapters (None when one can)."""
    if any(kind in ADAPTER_RELEASE_KINDS for kind in kinds):
        return None
    served = ", ".join(sorted(set(kinds))) or "none known"
    return (f"per-job LoRAs need the native MiniMax-H3 release; the fleet serves {served} (FastH3 V2 is a full "
            "checkpoint and takes no adapters)")


def adapter_set_key(loras: Sequence[Mapping[str, Any]] | None) -> str:
    """One string per adapter set (targets and scales, order-free): jobs with equal keys share an applied set."""
    if not loras:
        return ""
    parts = sorted(f"{item.get('repo') or item.get('path')}@{item.get('revision') or ''}*{float(item['scale']):g}"
                   for item in loras)
    return "|".join(parts)


def mp4_tag(loras: Sequence[Mapping[str, Any]] | None) -> str | None:
    """The ``h3batch_loras`` MP4 tag: ``org/repo@commit*scale`` or ``/folder*scale``, comma-separated."""
    if not loras:
        return None
    return ",".join(f"{item.get('repo') or item.get('path')}"
                    f"{'@' + item['revision'] if item.get('revision') else ''}*{float(item['scale']):g}"
                    for item in loras)
