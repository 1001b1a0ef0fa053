"""Client side of the duplex Realtime protocol (spec §2, §4.1, §4.3): URL, messages, capability checks. No I/O."""
from __future__ import annotations

import json
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

MAX_MESSAGE_BYTES = 64 * 2**20  # the driver accepts server messages up to 64 MiB

# Capability keys the lifecycle mode checks (load mode checks only the two marked in `LOAD_CAPABILITIES`).
LIFECYCLE_CAPABILITIES = {
    "implementation_level": "model_native_duplex",
    "chunk_period_ms": 80,
    "supports_multi_session": True,
    "supports_multi_session_same_replica": True,
    "supports_barge_in": False,
}
LOAD_CAPABILITIES = {"chunk_period_ms": 80, "supports_multi_session_same_replica": True}


def realtime_url(base_url: str, model: str) -> str:
    """Keep scheme/netloc/path/fragment; set duplex=1, model, autostart=0 in the query (existing keys keep position)."""
    parts = urlsplit(base_url)
    query: dict[str, str] = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        query[key] = value  # a repeated key keeps its last value and its first position
    query.update({"duplex": "1", "model": model, "autostart": "0"})
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), parts.fragment))


def session_update(model: str, voice: str, persona: str) -> str:
    """The driver's opening `session.update` (auto-response on, no turn detection)."""
    return json.dumps({
        "type": "session.update",
        "session": {
            "model": model,
            "modalities": ["audio", "text"],
            "input_audio_format": "pcm_f32le",
            "output_audio_format": "pcm16",
            "voice": voice,
            "instructions": persona,
            "turn_detection": None,
            "extra_body": {"auto_response": True},
        },
    })


SESSION_CLOSE = json.dumps({"type": "session.close"})


def created_session_id(event: dict) -> str | None:
    """Server-allocated id: `session.id`, else `session.session_id`, else top-level `session_id` (non-empty str)."""
    session = event.get("session")
    candidates = [session.get("id"), session.get("session_id")] if isinstance(session, dict) else []
    for value in [*candidates, event.get("session_id")]:
        if isinstance(value, str) and value:
            return value
    return None


def created_capabilities(event: dict) -> dict | None:
    session = event.get("session")
    caps = session.get("capabilities") if isinstance(session, dict) else None
    return caps if isinstance(caps, dict) else None


def capabilities_match(caps: dict, required: dict) -> bool:
    """Each required key present with the required value: booleans identical, numbers equal (and not booleans)."""
    def same(actual, expected) -> bool:
        if isinstance(expected, bool):
            return actual is expected
        return not isinstance(actual, bool) and actual == expected

    return all(key in caps and same(caps[key], value) for key, value in required.items())
