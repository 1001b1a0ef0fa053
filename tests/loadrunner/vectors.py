"""Builders for the §14 conformance vectors: pkt(k) events and send triples."""
from __future__ import annotations

import base64

import numpy as np

from h3batch.loadrunner.metrics import Send

DATA_PLANE = {"vllm_omni": {"runtime_impl": "scheduler_data_plane", "uses_model_runner_scheduler": True,
                            "runner_kv_backed": True}}


def pkt(k: int, event_type: str = "response.output_audio.delta", **extra) -> dict:
    """The §13 normal packet with k*1920 int16 samples of 2000."""
    payload = np.full(k * 1920, 2000, dtype="<i2").tobytes()
    return {"type": event_type, "response_id": "r", "delta": base64.b64encode(payload).decode(),
            "sample_rate_hz": 24000, "metadata": DATA_PLANE, **extra}


def sends(*triples: tuple[float, float, float]) -> list[Send]:
    return [Send(*t) for t in triples]


def slow_sends(count: int) -> list[Send]:
    """Vectors 3-4: (100 + 0.08k, same, +0.001)."""
    return [Send(100 + 0.08 * k, 100 + 0.08 * k, 100 + 0.08 * k + 0.001) for k in range(count)]
