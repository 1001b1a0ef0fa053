"""Acceptance checks (§6) and per-packet validation (§5.5): order, codes, messages and kept numbers."""
from __future__ import annotations

import base64

import numpy as np
import pytest

from h3batch.loadrunner.acceptance import AcceptanceConfig, AcceptanceError, frame_stats, validate_session_audio
from h3batch.loadrunner.packets import check_packet
from tests.loadrunner.vectors import pkt

LENIENT = AcceptanceConfig(max_frame_deficit=0, min_voiced_frames=1, minimum_audio_chunks=1)


def fail(events, f_in, minimum_chunks=1, config=LENIENT) -> AcceptanceError:
    with pytest.raises(AcceptanceError) as info:
        validate_session_audio(events, f_in, minimum_chunks, config)
    return info.value


def test_vector_8_acceptance_keeps_numbers():
    """Vector 14.8: a frame-deficit failure still carries the frame stats, with an int deficit."""
    err = fail([pkt(1)], 2)
    assert err.code.value == "frame_deficit"
    assert err.stats["frame_deficit"] == 1 and type(err.stats["frame_deficit"]) is int
    assert err.stats["output_frames"] == err.stats["voiced_frames"] == 1
    assert err.stats["frame_coverage_ratio"] == 0.5
    assert err.message.startswith("invalid synchronous frame accounting: input=2, maximum_deficit=0, stats={")


@pytest.mark.parametrize("name", ["response.output_audio.delta", "response.audio.delta"])
def test_vector_9_both_names_pass(name):
    """Vector 14.9: one 1-frame packet under either event name passes with min voiced 1."""
    stats = validate_session_audio([pkt(1, name)], 1, 1, LENIENT)
    assert stats["audio_samples"] * 2 == 3840 and stats["response_ids"] == ["r"] and stats["frame_deficit"] == 0


def test_vector_9_default_voiced_minimum_fails():
    """Vector 14.9: the default min_voiced_frames 5 fails the same packet at `voiced_frames`."""
    err = fail([pkt(1)], 1, config=AcceptanceConfig(max_frame_deficit=0, minimum_audio_chunks=1))
    assert err.code.value == "voiced_frames"
    assert err.message.startswith("output contained insufficient audible speech: minimum_voiced_frames=5, stats={")


def test_vector_12_frame_stats():
    """Vector 14.12: a zero frame and a constant-1000 frame at threshold 1e-4 against 3 input frames."""
    pcm = np.concatenate([np.zeros(1920, dtype="<i2"), np.full(1920, 1000, dtype="<i2")])
    s = frame_stats(pcm, 3, 1e-4)
    assert (s["output_frames"], s["voiced_frames"], s["silent_frames"], s["frame_deficit"]) == (2, 1, 1, 1)
    assert s["frame_coverage_ratio"] == pytest.approx(2 / 3)


def test_voiced_threshold_is_inclusive():
    """A frame whose RMS equals the threshold counts as voiced."""
    assert frame_stats(np.full(1920, 2000, dtype="<i2"), 1, 2000 / 32768)["voiced_frames"] == 1


@pytest.mark.parametrize("events,f_in,code,message", [
    ([], 1, "pcm16_output", "invalid PCM16 output: chunks=0, bytes=0"),
    ([{**pkt(1), "delta": base64.b64encode(bytes(3840)).decode()}], 1, "audio_rms",
     "output audio is non-finite or silent: samples=1920, rms=0.0"),
    ([pkt(1), {**pkt(1), "delta": "", "sample_rate_hz": 16000}], 1, "sample_rate",
     "unexpected output sample rates: [16000, 24000]"),
    ([pkt(1)], 0, "input_frames", "audio received without input frames: input=0"),
    ([{**pkt(1), "delta": base64.b64encode(np.full(100, 2000, "<i2").tobytes()).decode()}], 1,
     "whole_codec_frames", "PersonaPlex output must contain whole 80 ms codec frames: samples=100, "
                           "samples_per_frame=1920"),
    ([{**pkt(1), "metadata": {"vllm_omni": {"private": "remote-detail"}}}], 1, "scheduler_data_plane",
     "audio events did not prove the scheduler data plane"),
    ([pkt(1), {**pkt(1), "response_id": "other"}], 2, "response_identity",
     "continuous stream requires one response: count=2"),
])
def test_acceptance_codes_in_order(events, f_in, code, message):
    """Each check raises its own code with a local-numbers-only message."""
    err = fail(events, f_in)
    assert (err.code.value, err.message) == (code, message)


def test_audio_chunks_minimum():
    """Fewer valid packets than the minimum fails `audio_chunks` after frame stats were merged."""
    err = fail([pkt(1)], 1, minimum_chunks=2)
    assert err.code.value == "audio_chunks" and err.message == "insufficient audio chunks: chunks=1, minimum=2"
    assert err.stats["output_frames"] == 1


def test_min_voiced_frames_must_be_positive():
    """min_voiced_frames < 1 is a configuration error, raised as ValueError."""
    with pytest.raises(ValueError, match="min_voiced_frames must be positive, got 0"):
        validate_session_audio([pkt(1)], 1, 1, AcceptanceConfig(max_frame_deficit=0, min_voiced_frames=0))


def test_invalid_packet_aborts_with_its_code():
    """Session validation raises ValueError(<code>) on the first invalid packet."""
    with pytest.raises(ValueError, match="^missing_audio_response_id$"):
        validate_session_audio([pkt(1), {**pkt(1), "response_id": ""}], 2, 1, LENIENT)


@pytest.mark.parametrize("event,code", [
    ({**pkt(1), "delta": None}, "missing_audio_delta"),
    ({**pkt(1), "delta": "abc"}, "invalid_audio_base64"),
    ({**pkt(1), "delta": "é" * 4}, "invalid_audio_base64"),
    ({**pkt(1), "delta": base64.b64encode(b"\x00\x01\x02").decode()}, "unaligned_pcm16_packet"),
    ({k: v for k, v in pkt(1).items() if k != "sample_rate_hz"}, "invalid_audio_sample_rate"),
    ({**pkt(1), "sample_rate_hz": "24000"}, "invalid_audio_sample_rate"),
    ({**pkt(1), "sample_rate_hz": 24000.0}, "invalid_audio_sample_rate"),
    ({**pkt(1), "response_id": 7}, "missing_audio_response_id"),
    ({**pkt(1), "delta": "AA==", "sample_rate_hz": "bad", "response_id": None}, "unaligned_pcm16_packet"),
])
def test_packet_codes_first_failure_wins(event, code):
    """§5.5 steps run in order and the first failure names the packet."""
    assert check_packet(event).code.value == code


def test_empty_packet_is_valid_and_skips_later_checks():
    """An empty payload is valid even without rate or response id."""
    result = check_packet({"type": "response.output_audio.delta", "delta": ""})
    assert result.code is None and not result.valid_nonempty
