"""End-to-end matrix of §13: the load driver over real localhost WebSockets against the reference fixture server."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from websockets.exceptions import InvalidHandshake

from h3batch.loadrunner.config import parse_config
from h3batch.loadrunner.load import run_load
from h3batch.loadrunner.server import DuplexServer, ServerConfig
from tests.loadrunner.harness import HANG_GUARD_S, common_args, run_against_server, wait_closed

PRIVATE_MARKERS = ("must-not-be-exported", "remote-detail-must-not-be-exported",
                   "credentials-in-remote-handshake-detail")


def run(mode: str, wav: Path, out: Path, sessions: int, *extra: str):
    return asyncio.run(run_against_server(mode, wav, out, sessions, list(extra)))


def saved(out: Path) -> dict:
    return json.loads((out / "load-result.json").read_text(encoding="utf-8"))


def assert_all_closed(server: DuplexServer, close_requested: bool = True) -> None:
    """C: every server connection closed (and, by default, asked to close its session)."""
    assert server.connections and all(c.closed for c in server.connections)
    if close_requested:
        assert all(c.close_requested for c in server.connections)


def assert_private(out: Path, report: dict) -> None:
    text = (out / "load-result.json").read_text(encoding="utf-8") + json.dumps(report)
    for marker in PRIVATE_MARKERS:
        assert marker not in text


@pytest.mark.parametrize("sessions", [1, 2, 4])
def test_success(fixture_wav, tmp_path, sessions):
    """`success`: every session passes with exact frame accounting, one shared epoch, nothing private saved."""
    out = tmp_path / "out"
    report, server, _ = run("success", fixture_wav, out, sessions)
    assert report["ok"] is True and report["passed_sessions"] == sessions == report["requested_sessions"]
    for row in report["sessions"]:
        assert row["frame_deficit"] == 0 and type(row["frame_deficit"]) is int
        assert row["output_frames"] == row["voiced_frames"] == row["audio_chunks"] == 2
        assert row["silent_frames"] == 0 and row["frame_coverage_ratio"] == 1.0
        assert row["audio_rms"] == pytest.approx(2000 / 32768)
        assert row["acceptance_check"] is None and isinstance(row["audio_continuity_ok"], bool)
    assert len({row["input_timeline"][0]["planned_at_s"] for row in report["sessions"]}) == 1
    assert_all_closed(server)
    assert saved(out) == json.loads(json.dumps(report))
    assert_private(out, report)
    assert report["schema_version"] == 1 and report["mode"] == "paced_multi_session"
    assert list(report["sessions"][0])[:7] == ["index", "session_id", "ok", "error", "acceptance_check",
                                               "server_error_count", "server_error_codes"]


def test_legacy_audio_event(fixture_wav, tmp_path):
    """`legacy_audio_event`: `response.audio.delta` packets count; no shared ids."""
    report, server, _ = run("legacy_audio_event", fixture_wav, tmp_path / "out", 2)
    assert report["ok"] is True and report["passed_sessions"] == 2 and report["shared_response_ids"] == []
    assert_all_closed(server)


def test_reject_second(fixture_wav, tmp_path):
    """`reject_second`: the refused session is a failed row with no frames, null RTF and the error code."""
    report, _, _ = run("reject_second", fixture_wav, tmp_path / "out", 2)
    assert report["passed_sessions"] == 1
    rejected = report["sessions"][1]
    assert rejected["input_frames"] == 0 and rejected["client_stream_rtf"] is None
    assert rejected["server_error_codes"] == ["resource_exhausted"]
    assert rejected["error"] == "admission: RuntimeError"


def test_silent(fixture_wav, tmp_path):
    """`silent`: acceptance fails at pcm16_output and every admitted session still got session.close."""
    report, server, _ = run("silent", fixture_wav, tmp_path / "out", 2)
    assert [row["acceptance_check"] for row in report["sessions"]] == ["pcm16_output"] * 2
    assert_all_closed(server)


def test_disconnect(fixture_wav, tmp_path):
    """`disconnect`: a stream failure plus a cleanup failure on each row."""
    report, _, _ = run("disconnect", fixture_wav, tmp_path / "out", 2)
    for row in report["sessions"]:
        assert row["error"].startswith("stream: ") and "; cleanup: " in row["error"]


def test_no_close_ack(fixture_wav, tmp_path):
    """`no_close_ack`: cleanup times out within its own budget."""
    report, _, _ = run("no_close_ack", fixture_wav, tmp_path / "out", 2)
    assert all(row["error"] == "cleanup: TimeoutError" for row in report["sessions"])


def test_shared_response(fixture_wav, tmp_path):
    """`shared_response`: an id seen in two rows fails both rows."""
    report, _, _ = run("shared_response", fixture_wav, tmp_path / "out", 2)
    assert report["passed_sessions"] == 0 and report["shared_response_ids"] == ["shared"]
    assert all(row["error"] == "concurrent sessions shared a response id" for row in report["sessions"])


def test_late_on_close(fixture_wav, tmp_path):
    """`late_on_close`: audio sent only during cleanup is excluded from the snapshot."""
    report, _, _ = run("late_on_close", fixture_wav, tmp_path / "out", 2)
    assert all(row["output_samples"] == 0 for row in report["sessions"])


def test_error_on_close(fixture_wav, tmp_path):
    """`error_on_close`: an error event during cleanup still fails the row as a server error."""
    report, _, _ = run("error_on_close", fixture_wav, tmp_path / "out", 2)
    for row in report["sessions"]:
        assert row["error"] == "server emitted a Realtime error" and row["server_error_codes"] == ["cleanup_failed"]


def test_bad_json(fixture_wav, tmp_path):
    """`bad_json`: the reader's JSON failure is re-raised in the session phase."""
    report, _, _ = run("bad_json", fixture_wav, tmp_path / "out", 2)
    assert all("JSONDecodeError" in row["error"] for row in report["sessions"])


def test_missing_capabilities(fixture_wav, tmp_path):
    """`missing_capabilities`: admission fails with the omitted-capabilities assertion."""
    report, _, _ = run("missing_capabilities", fixture_wav, tmp_path / "out", 2)
    assert all(row["error"] == "admission: AssertionError" for row in report["sessions"])


@pytest.mark.parametrize("mode", ["reject_second", "silent", "disconnect", "no_close_ack", "shared_response",
                                  "late_on_close", "error_on_close", "bad_json", "missing_capabilities"])
def test_failure_modes_are_bounded(fixture_wav, tmp_path, mode):
    """Each failure mode: not ok, two rows, all server connections closed, within 4 s, nothing private saved."""
    out = tmp_path / "out"
    report, server, elapsed = run(mode, fixture_wav, out, 2)
    assert report["ok"] is False and report["requested_sessions"] == 2 and len(report["sessions"]) == 2
    assert all(c.closed for c in server.connections) and len(server.connections) == 2
    assert elapsed < HANG_GUARD_S
    assert_private(out, report)


def test_short_audio(fixture_wav, tmp_path):
    """`short_audio`: the frame-deficit check fails but keeps its numbers."""
    out = tmp_path / "out"
    report, server, _ = run("short_audio", fixture_wav, out, 1)
    row = report["sessions"][0]
    assert row["acceptance_check"] == "frame_deficit"
    assert row["frame_deficit"] == 1 and type(row["frame_deficit"]) is int
    assert row["output_frames"] == row["voiced_frames"] == row["audio_chunks"] == 1
    assert row["frame_coverage_ratio"] == 0.5 and row["audio_rms"] == pytest.approx(0.061, abs=1e-3)
    assert "input=2" in row["error"] and "maximum_deficit=0" in row["error"]
    assert_all_closed(server)
    assert saved(out) == json.loads(json.dumps(report))


def test_private_metadata(fixture_wav, tmp_path):
    """`private_metadata`: fails scheduler_data_plane without exporting the planted metadata."""
    out = tmp_path / "out"
    report, _, _ = run("private_metadata", fixture_wav, out, 1)
    assert report["sessions"][0]["acceptance_check"] == "scheduler_data_plane"
    assert_private(out, report)


@pytest.mark.parametrize("sessions", [1, 2])
@pytest.mark.parametrize("mode,code", [("missing_packet_rate", "invalid_audio_sample_rate"),
                                       ("string_packet_rate", "invalid_audio_sample_rate"),
                                       ("invalid_base64", "invalid_audio_base64"),
                                       ("orphan_audio", "missing_audio_response_id"),
                                       ("odd_packet", "unaligned_pcm16_packet")])
def test_invalid_packets(fixture_wav, tmp_path, mode, code, sessions):
    """Invalid packets: every row fails with exactly one invalid code and timelines count only valid samples."""
    out = tmp_path / "out"
    report, server, elapsed = run(mode, fixture_wav, out, sessions)
    assert report["ok"] is False and report["passed_sessions"] == 0
    for row in report["sessions"]:
        assert row["error"] and {p["code"] for p in row["invalid_audio_packets"]} == {code}
        assert sum(p["samples"] for p in row["audio_packet_timeline"]) == row["output_samples"]
    assert_all_closed(server)
    assert saved(out) == json.loads(json.dumps(report))
    assert elapsed < HANG_GUARD_S


def test_existing_result_is_never_overwritten(fixture_wav, tmp_path):
    """An existing load-result.json raises FileExistsError before connecting and stays unchanged."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "load-result.json").write_text("previous measurement")

    async def scenario():
        async with DuplexServer(ServerConfig(mode="success")) as server:
            with pytest.raises(FileExistsError):
                await run_load(parse_config(common_args(fixture_wav, out, server.url)))
            return server.connections

    assert asyncio.run(scenario()) == []
    assert (out / "load-result.json").read_text() == "previous measurement"


@pytest.mark.parametrize("mode", ["success", "no_close_ack"])
def test_cancellation_closes_every_session(fixture_wav, tmp_path, mode):
    """Cancelling after each connection sent a frame ends within 3 s, writes no report, closes all connections."""
    out = tmp_path / "out"

    async def scenario():
        async with DuplexServer(ServerConfig(mode=mode)) as server:
            config = parse_config(common_args(fixture_wav, out, server.url) + [
                "--drain-s", "10", "--timeout-s", "30", "--load-frames", "2"])
            task = asyncio.create_task(run_load(config))
            while len(server.connections) < 2 or any(c.frames < 1 for c in server.connections):
                await asyncio.sleep(0.005)
            loop = asyncio.get_running_loop()
            began = loop.time()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            elapsed = loop.time() - began
            await wait_closed(server)
            return server, elapsed

    server, elapsed = asyncio.run(scenario())
    assert elapsed < HANG_GUARD_S
    assert all(c.closed for c in server.connections)
    assert not (out / "load-result.json").exists()


def test_max_client_rtf_ceiling(fixture_wav, tmp_path):
    """--max-client-rtf 0.001 fails every row with the ceiling message."""
    report, _, _ = run("success", fixture_wav, tmp_path / "out", 2, "--max-client-rtf", "0.001")
    assert report["passed_sessions"] == 0
    assert all("client_stream_rtf exceeds 0.001" in row["error"] for row in report["sessions"])


def test_handshake_failure_is_reported_by_type_only(fixture_wav, tmp_path):
    """A connect that raises InvalidHandshake yields `admission: InvalidHandshake` rows without its detail."""
    out = tmp_path / "out"

    async def refusing_connector(url, close_timeout, open_timeout):
        raise InvalidHandshake("credentials-in-remote-handshake-detail")

    async def scenario():
        config = parse_config(common_args(fixture_wav, out, "ws://127.0.0.1:9/v1/realtime"))
        loop = asyncio.get_running_loop()
        began = loop.time()
        report = await run_load(config, connector=refusing_connector)
        return report, loop.time() - began

    report, elapsed = asyncio.run(scenario())
    assert report["ok"] is False and elapsed < HANG_GUARD_S
    assert [row["error"] for row in report["sessions"]] == ["admission: InvalidHandshake"] * 2
    assert_private(out, report)


def test_lifecycle_parse_without_sessions():
    """Without --sessions the driver is in lifecycle mode."""
    assert parse_config(["--model", "unused", "--input-wav", "unused.wav"]).sessions is None
