"""Job provenance: resolved parameters, seed, release + contract hash, device and library versions, on the record
and inside the downloaded MP4."""
from __future__ import annotations

import json
import re
from importlib import metadata

import requests
import torch

from h3batch.worker.h3.mp4 import probe_mp4
from tests.api.conftest import auth, wait_job


def test_record_and_mp4_carry_provenance(stack, tmp_path):
    """A completed job shows metadata (params, seed, release, contract hash, commits, gpu, versions); the MP4 too."""
    reply = requests.post(f"{stack.base}/jobs", json={"prompt": "a kettle whistling", "seed": 4242},
                          headers=auth(), timeout=60)
    assert reply.status_code == 202, reply.text
    job = wait_job(stack.base, reply.json()["id"])
    assert job["status"] == "completed", job
    meta = job["metadata"]
    assert meta["seed"] == 4242 and meta["job_id"] == job["id"]
    assert meta["parameters"] == {"width": 256, "height": 128, "seconds": 4.0, "num_frames": 107, "fps": 24,
                                  "seed": 4242, "num_inference_steps": 8, "flow_shift": 10.0,
                                  "audio_flow_shift": 3.0, "guidance_scale": 1.0}
    assert meta["release_id"] == job["release_id"] and re.fullmatch(r"[0-9a-f]{64}", meta["contract_hash"])
    assert meta["gpu"] == "cpu" and meta["device"] == "cpu"
    provenance = meta["provenance"]  # a release directory: no release commit; the base revision's resolved commit
    assert provenance["release_commit"] is None and provenance["base_repo"] == "MiniMaxAI/MiniMax-H3"
    assert re.fullmatch(r"[0-9a-f]{40}", provenance["base_commit"])
    assert meta["versions"]["torch"] == torch.__version__
    assert meta["versions"]["diffusers"] == metadata.version("diffusers")
    assert meta["versions"]["transformers"] == metadata.version("transformers")
    assert meta["versions"]["h3batch"] == metadata.version("h3batch")
    assert set(job["timings"]) >= {"text_encode", "denoise", "decode", "mux", "finalize"}

    path = tmp_path / "clip.mp4"
    path.write_bytes(requests.get(f"{stack.base}/jobs/{job['id']}/content", headers=auth(), timeout=30).content)
    tags = probe_mp4(path)["metadata"]
    assert tags["h3batch_seed"] == "4242" and tags["h3batch_job_id"] == job["id"]
    assert tags["h3batch_release"] == meta["release_id"]
    assert tags["h3batch_contract_sha256"] == meta["contract_hash"]
    assert json.loads(tags["h3batch_parameters"]) == meta["parameters"]
    assert tags["h3batch_gpu"] == "cpu"
    assert tags["h3batch_base_commit"] == provenance["base_commit"] and "h3batch_release_commit" not in tags
    assert f"torch={torch.__version__}" in tags["h3batch_versions"].split(",")
    assert {"text_encode", "denoise", "decode"} <= {kv.split("=")[0] for kv in tags["h3batch_stage_seconds"].split(",")}
