"""Provenance of a render: resolved parameters, release and contract hash, the commits the release and its base
model resolved to, device, library versions.

The worker computes this once per job (`for_job`), stores it on the job record (`metadata`, shown by the API) and
writes it into the MP4 as `h3batch_*` container tags (`mp4_tags`), so a downloaded clip says how it was made without
the service. Per-stage timings are on the record (`timings`); the MP4 carries the stages that ran before muxing.
"""
from __future__ import annotations

import functools
import json
from importlib import metadata as importlib_metadata
from typing import Any

from h3batch.core import loras, request_rules
from h3batch.core.geometry import FPS, RequestGeometry

LIBRARIES = ("torch", "diffusers", "transformers", "h3batch", "av")
"""Packages whose versions every job records."""


def _version(dist: str) -> str | None:
    try:
        return importlib_metadata.version(dist)
    except importlib_metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=8)
def runtime_info(device: str | None) -> dict[str, Any]:
    """`{"gpu": <CUDA device name or "cpu">, "device": ..., "versions": {...}}` for a torch device string (None:
    cuda when present, else cpu)."""
    import torch  # noqa: PLC0415  (worker processes only)

    device = (device or "").split("×")[0]  # a rank group names itself "cuda×4"
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    gpu = "cpu"
    if dev.type == "cuda" and torch.cuda.is_available():
        gpu = torch.cuda.get_device_name(dev.index if dev.index is not None else torch.cuda.current_device())
    return {"gpu": gpu, "device": str(dev), "versions": {name: _version(name) for name in LIBRARIES}}


def resolved_parameters(record: dict[str, Any]) -> dict[str, Any]:
    """Every value the render used, defaults included: what a client needs to reproduce the clip."""
    geometry = RequestGeometry(record["width"], record["height"], record["seconds"])
    return {"width": geometry.width, "height": geometry.height, "seconds": record["seconds"],
            "num_frames": geometry.num_frames, "fps": FPS, "seed": record["seed"],
            "num_inference_steps": request_rules.REQUIRED_STEPS, "flow_shift": request_rules.VIDEO_FLOW_SHIFT,
            "audio_flow_shift": request_rules.AUDIO_FLOW_SHIFT, "guidance_scale": request_rules.GUIDANCE_SCALE}


def for_job(record: dict[str, Any], *, release_id: str, contract_hash: str, device: str | None,
            ranks: int = 1, provenance: dict[str, Any] | None = None) -> dict[str, Any]:
    """The `metadata` field of a job record. `provenance` is the pipeline's (`Pipeline.provenance`: release
    reference and commit, base repo, revision and resolved commit), kept whole under `provenance`."""
    runtime = runtime_info(device)
    return {"job_id": record["id"], "seed": record["seed"], "parameters": resolved_parameters(record),
            "release_id": release_id, "contract_hash": contract_hash, "provenance": dict(provenance or {}),
            "gpu": runtime["gpu"], "device": runtime["device"], "ranks": ranks, "versions": dict(runtime["versions"]),
            **({"loras": list(record["loras"])} if record.get("loras") else {})}


def mp4_tags(meta: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """MP4 container tags (str → str) of a job's metadata, for `RenderRequest.metadata`."""
    versions = meta["versions"]
    provenance = meta.get("provenance") or {}
    commits = tuple((f"h3batch_{name}", provenance[name]) for name in ("base_commit", "release_commit")
                    if provenance.get(name))
    adapters = loras.mp4_tag(meta.get("loras"))  # each per-job LoRA with its commit (or folder) and scale
    commits += ((("h3batch_loras", adapters),) if adapters else ())
    return (("h3batch_job_id", meta["job_id"]),
            ("h3batch_parameters", json.dumps(meta["parameters"], separators=(",", ":"), sort_keys=True)),
            ("h3batch_gpu", meta["gpu"]),
            ("h3batch_versions", ",".join(f"{k}={v}" for k, v in versions.items() if v)), *commits)
