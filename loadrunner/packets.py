"""Strict per-packet validation of server audio events (spec §5.4, §5.5); pure functions.

A packet is any event of type `response.output_audio.delta` or `response.audio.delta`, judged from its wire fields
only, so a renamed event can never silently count as zero output.
"""
from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from enum import Enum
from typing import Any

AUDIO_DELTA_TYPES = frozenset({"response.output_audio.delta", "response.audio.delta"})
TEXT_DELTA_TYPES = frozenset({"response.text.delta", "response.output_text.delta",
                              "response.output_audio_transcript.delta"})
EXPECTED_RATE_HZ = 24_000


class PacketCode(str, Enum):
    """Per-packet diagnostic codes, in the order the checks run (first failure wins)."""

    MISSING_AUDIO_DELTA = "missing_audio_delta"
    INVALID_AUDIO_BASE64 = "invalid_audio_base64"
    UNALIGNED_PCM16_PACKET = "unaligned_pcm16_packet"
    INVALID_AUDIO_SAMPLE_RATE = "invalid_audio_sample_rate"
    MISSING_AUDIO_RESPONSE_ID = "missing_audio_response_id"


@dataclass(frozen=True)
class PacketResult:
    """Outcome of one packet: `code` is None when valid; `payload` holds the PCM16 bytes of a valid packet."""

    code: PacketCode | None
    payload: bytes = b""

    @property
    def valid_nonempty(self) -> bool:
        return self.code is None and len(self.payload) > 0


def is_audio_event(event: Any) -> bool:
    return isinstance(event, dict) and event.get("type") in AUDIO_DELTA_TYPES


def check_packet(event: dict) -> PacketResult:
    """Run §5.5 on one audio event; an empty decoded payload is valid and skips the later checks."""
    delta = event.get("delta")
    if not isinstance(delta, str):
        return PacketResult(PacketCode.MISSING_AUDIO_DELTA)
    try:
        payload = base64.b64decode(delta, validate=True)
    except (binascii.Error, ValueError):  # ValueError: non-ASCII characters in a str
        return PacketResult(PacketCode.INVALID_AUDIO_BASE64)
    if not payload:
        return PacketResult(None, b"")
    if len(payload) % 2:
        return PacketResult(PacketCode.UNALIGNED_PCM16_PACKET)
    rate = event.get("sample_rate_hz")
    if type(rate) is not int or rate != EXPECTED_RATE_HZ:
        return PacketResult(PacketCode.INVALID_AUDIO_SAMPLE_RATE)
    response_id = event.get("response_id")
    if not isinstance(response_id, str) or not response_id:
        return PacketResult(PacketCode.MISSING_AUDIO_RESPONSE_ID)
    return PacketResult(None, payload)


def error_code(event: dict) -> str:
    """Load-mode error code of an `error` event: `str(error.code)` for an object with `code`, else "unknown"."""
    error = event.get("error")
    if isinstance(error, dict) and "code" in error:
        return str(error["code"])
    return "unknown"


def probe_error_code(event: dict) -> Any:
    """Lifecycle probe reading (§4.2): `error.code` when `error` is an object, else the top-level `code`."""
    error = event.get("error")
    return error.get("code") if isinstance(error, dict) else event.get("code")
