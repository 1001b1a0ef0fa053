"""Paced multi-session load mode (spec §8): admission barrier, shared epoch, pacing, drain, validation, cleanup.

Async code here only moves bytes and timestamps; the rules live in `pacing`, `acceptance`, `metrics` and `report`.
Each session yields exactly one row; failures become rows, cancellation still closes every admitted session.
"""
from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from websockets.exceptions import WebSocketException

from h3batch.loadrunner.acceptance import AcceptanceError, validate_session_audio
from h3batch.loadrunner.audio import append_message, input_identity, load_input_samples, split_frames
from h3batch.loadrunner.config import DriverConfig
from h3batch.loadrunner.connection import DuplexConnection, open_connection
from h3batch.loadrunner.lifecycle import await_session_created
from h3batch.loadrunner.metrics import Send, ceiling_error, session_metrics
from h3batch.loadrunner.pacing import pace_frames
from h3batch.loadrunner.packets import error_code
from h3batch.loadrunner.protocol import (
    LOAD_CAPABILITIES,
    SESSION_CLOSE,
    capabilities_match,
    created_capabilities,
    created_session_id,
    realtime_url,
)
from h3batch.loadrunner.report import RESULT_NAME, build_report, dumps_report, write_exclusive

logger = logging.getLogger("h3batch.loadrunner.load")

# Exceptions a session turns into a row; anything else (a bug) propagates, and cancellation always does.
ROW_ERRORS = (OSError, TimeoutError, ValueError, RuntimeError, AssertionError, WebSocketException)
CLEANUP_ERRORS = (OSError, TimeoutError, ValueError, RuntimeError, WebSocketException)

# (url, close_timeout, open_timeout) -> awaitable ClientConnection; tests inject one that raises InvalidHandshake.
Connector = Callable[[str, float, float], Awaitable]


def connection_check(conn: DuplexConnection) -> None:
    """§8.3: fail on any server error event, else on a finished reader (re-raising what it held)."""
    if conn.log.count("error"):
        raise RuntimeError("server emitted a Realtime error (see the session error count)")
    if conn.reader_done:
        if conn.reader_error is not None:
            raise conn.reader_error
        raise RuntimeError("connection closed before session completion")


class LoadSession:
    """One paced session: phases admission → stream → drain, then cleanup; `run()` returns its row."""

    def __init__(self, index: int, config: DriverConfig, url: str, messages: list[bytes],
                 start: asyncio.Future, ready: asyncio.Future, connector: Connector, log: logging.Logger):
        self.index, self.config, self.url, self.messages = index, config, url, messages
        self.start, self.ready, self.connector, self.logger = start, ready, connector, log
        self.conn: DuplexConnection | None = None
        self.sends: list[Send] = []
        self.session_id: str | None = None
        self.phase = "admission"

    async def _admit(self) -> None:
        cfg = self.config
        websocket = await self.connector(self.url, cfg.cleanup_timeout_s, cfg.timeout_s)
        self.conn = DuplexConnection(websocket, self.logger)
        event = await await_session_created(self.conn, cfg, cfg.persona, check=lambda: connection_check(self.conn))
        self.session_id = created_session_id(event)
        caps = created_capabilities(event)
        if caps is None:
            raise AssertionError(f"session.created omitted capabilities: {event}")
        if not capabilities_match(caps, LOAD_CAPABILITIES):
            raise AssertionError("server did not advertise PersonaPlex multi-session capabilities")

    async def _stream(self) -> None:
        epoch = await asyncio.shield(self.start)
        conn, timeout = self.conn, self.config.timeout_s
        await pace_frames(len(self.messages), epoch, clock=time.monotonic, sleep=asyncio.sleep,
                          send=lambda seq: conn.send(self.messages[seq], timeout),
                          check=lambda: connection_check(conn), sends=self.sends)

    async def _drain(self) -> dict:
        await asyncio.sleep(self.config.drain_s)
        connection_check(self.conn)
        return validate_session_audio(self.conn.log.events, len(self.sends), self.config.minimum_audio_chunks,
                                      self.config.acceptance)

    async def _cleanup(self) -> str | None:
        """Close the session (one cleanup budget for close + ack), then the socket; returns `cleanup: <Type>`."""
        conn, budget = self.conn, self.config.cleanup_timeout_s
        if conn is None:
            return None
        failure = None
        if conn.log.count("session.created") and not conn.log.count("session.closed"):
            try:
                async with asyncio.timeout(budget):
                    await conn.websocket.send(SESSION_CLOSE)

                    def closed() -> bool:
                        if conn.log.count("session.closed"):
                            return True
                        if conn.reader_done:
                            raise RuntimeError("connection ended before session.closed")
                        return False

                    await conn.wait_for(closed, budget, "session.closed")
            except CLEANUP_ERRORS as exc:
                failure = f"cleanup: {type(exc).__name__}"
        await conn.close(budget)
        return failure

    async def run(self) -> dict:
        error = acceptance_check = None
        stats: dict = {}
        metrics: dict | None = None
        try:
            await self._admit()
            if not self.ready.done():
                self.ready.set_result(None)
            self.phase = "stream"
            await self._stream()
            self.phase = "drain"
            stats = await self._drain()
        except AcceptanceError as exc:
            error, acceptance_check, stats = f"{self.phase}: AssertionError: {exc.message}", exc.code.value, exc.stats
        except ROW_ERRORS as exc:
            error = f"{self.phase}: {type(exc).__name__}"
            self.logger.info("session %d %s", self.index, error)
        finally:
            if not self.ready.done():
                self.ready.set_result(None)
            # Snapshot before closing: audio that arrives during cleanup cannot rescue a late session.
            log = self.conn.log if self.conn else None
            metrics = session_metrics(list(log.events) if log else [], list(log.times) if log else [], self.sends)
            cleanup_failure = await self._cleanup()
        return self._row(error, acceptance_check, stats, metrics, cleanup_failure)

    def _row(self, error, acceptance_check, stats, metrics, cleanup_failure) -> dict:
        errors = self.conn.log.errors() if self.conn else []
        if cleanup_failure:
            error = f"{error}; {cleanup_failure}" if error else cleanup_failure
        if error is None and errors:
            error = "server emitted a Realtime error"
        if error is None and metrics["invalid_audio_packets"]:
            error = "invalid audio packets"
        first_audio = metrics["client_first_audio_after_stream_start_ms"]
        if error is None and first_audio is not None and first_audio < 0:
            error = "audio arrived before the first input frame"
        if error is None:
            error = ceiling_error(metrics, self.config.max_client_rtf, self.config.max_stream_rtf,
                                  self.config.max_lag_drift_ms)
        return {
            "index": self.index,
            "session_id": self.session_id or f"personaplex-load-{self.index}",
            "ok": error is None,
            "error": error,
            "acceptance_check": acceptance_check,
            "server_error_count": len(errors),
            "server_error_codes": [error_code(e) for e in errors],
            **metrics,
            **stats,
        }


async def run_load(config: DriverConfig, *, connector: Connector | None = None,
                   log: logging.Logger | None = None) -> dict:
    """Run load mode end to end and return the report (also written to `<output_dir>/load-result.json`)."""
    log = log or logger
    identity = input_identity(config.input_wav, config.expected_input_sha256)
    samples = load_input_samples(config.input_wav, config.tail_s)
    # Identical input for every session: encode each append once, as UTF-8 bytes sent as text frames.
    messages = [append_message(seq, frame).encode() for seq, frame in
                enumerate(split_frames(samples, config.load_frames))]
    out_dir = Path(config.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    result_path = out_dir / RESULT_NAME
    if result_path.exists():
        raise FileExistsError(f"{result_path} already exists; refusing to overwrite a previous measurement")

    url = realtime_url(config.url, config.model)
    # A full collection scans every long-lived object (imported modules, numpy, ...) and stalled the shared grid by
    # ~20 ms in the driver-capacity bench; collect once before admission and park those objects outside the
    # collector for the run (unfrozen afterwards, so a long-lived Celery worker keeps collecting them).
    gc.collect()
    gc.freeze()
    try:
        rows = await _run_sessions(config, url, messages, connector or open_connection, log)
    finally:
        gc.unfreeze()
    report = build_report(config, identity, rows)
    text = dumps_report(report)  # serialise first: a NaN leaves no partial file
    write_exclusive(result_path, text)
    return report


async def _run_sessions(config: DriverConfig, url: str, messages: list[bytes], connector: Connector,
                        log: logging.Logger) -> list[dict]:
    """Launch N sessions, release the shared epoch once all finished admission, and collect one row each."""
    loop = asyncio.get_running_loop()
    start = loop.create_future()
    readies = [loop.create_future() for _ in range(config.sessions)]
    sessions = [LoadSession(i, config, url, messages, start, readies[i], connector, log)
                for i in range(config.sessions)]
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(s.run(), name=f"duplex-session-{s.index}") for s in sessions]
            await asyncio.wait(readies)  # wait, not gather: cancelling the run must not cancel the futures
            start.set_result(time.monotonic())
    finally:
        if not start.done():
            start.cancel()
    return [task.result() for task in tasks]
