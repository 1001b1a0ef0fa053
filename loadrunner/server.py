"""`h3batch duplex-server`: reference full-duplex server — the §13 fixture modes and a paced `realtime` mode.

`DuplexServer` accepts connections and owns the session lifecycle (§3): admission slots, close/expiry terminals, the
disconnect grace, the idle TTL, the cleanup reaper and shutdown. The rest sits beside it: `server_config` (settings,
flags, validation), `server_connection` (one realtime WebSocket's frames), `server_session` (one session's output and
cleanup), `server_protocol` and `fault_modes` (what to say, without I/O). Tests inspect per-connection state
(`index`, `closed`, `frames`, `close_requested`) in `connections`.

Session lifecycle (realtime mode):
* open: a slot is reserved before validation and the optional `warmup_frames` preparation, so concurrent opens cannot
  over-admit; the id is allocated only after warm-up and must never have been issued before (`session_exists`).
* `session.close` (aliases, default reason `client_close`): state `closing`, work aborted, cleanup attempted, then
  `session.closed` and close 1000 with the reason. A failed cleanup (fault knob `cleanup_failures`) keeps the slot
  counted until the reaper, every `reaper_interval_s`, succeeds.
* transport drop without close: the session turns `closing`, its output stops, and it keeps its slot (a lease) for
  `disconnect_grace_s`; then it ends with `session.expired` `disconnect_grace_expired` (recorded in
  `DuplexServer.terminals`, there is no transport to send it on) and is cleaned up. Resume is unsupported, so nothing
  can re-attach during the grace; `disconnect_grace_s` 0 ends it at once as `session.closed` `disconnect`.
* idle: no activity (client message or output packet) for `idle_ttl_s`, or no client message for the transport's
  `idle_timeout_s` (a session may lower it with `session.idle_timeout_s`) ends the session with `session.expired`
  `idle_ttl_expired` and close 1000 `timeout`.
* server shutdown ends every attached session with `session.closed` `shutdown`.
"""
from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
from collections.abc import Callable
from urllib.parse import parse_qsl, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from h3batch.loadrunner.fault_modes import ConnectionState, FixtureMode, fixture_replies
from h3batch.loadrunner.server_config import REALTIME, ServerConfig, parse_config
from h3batch.loadrunner.server_connection import RealtimeConnection
from h3batch.loadrunner.server_protocol import Admission, SessionState
from h3batch.loadrunner.server_session import RealtimeSession, SerialWorker, new_session_id

logger = logging.getLogger("h3batch.loadrunner.server")


class DuplexServer:
    """Serves one mode on host:port; `connections` holds every accepted connection's state, in accept order.

    Realtime sessions live in `sessions` (id -> session, open or closing) until their cleanup succeeded; `terminals`
    records how each ended ({session_id, type, reason}) in order. `new_session_id` is injectable for tests.
    """

    def __init__(self, config: ServerConfig, log: logging.Logger | None = None,
                 new_session_id: Callable[[], str] = new_session_id):
        self.config = config
        self.logger = log or logger
        self.connections: list[ConnectionState] = []
        self.admission = Admission(config.max_sessions)
        self.worker = SerialWorker(config)
        self.new_session_id = new_session_id
        self.sessions: dict[str, RealtimeSession] = {}
        self.terminals: list[dict] = []
        self.sessions_opened = 0
        self._reaping: dict[str, RealtimeSession] = {}
        self._timers: dict[str, asyncio.Task] = {}
        self._reaper: asyncio.Task | None = None
        self._server: Server | None = None
        self.fixture = None if config.mode == REALTIME else FixtureMode(config.mode)

    # -- session lifecycle (§3) -------------------------------------------------------------------------------
    def register(self, session: RealtimeSession) -> None:
        self.sessions[session.id] = session
        self.sessions_opened += 1

    async def warm_up(self) -> None:
        """Open preparation: `warmup_frames` silent frames occupy the shared worker while the slot is held."""
        loop = asyncio.get_running_loop()
        ready = loop.time()
        for _ in range(self.config.warmup_frames):
            ready = self.worker.ready_at(loop.time())
        if ready > loop.time():
            await asyncio.sleep(ready - loop.time())

    async def end(self, session: RealtimeSession, terminal: str, reason: str) -> None:
        """Terminal `terminal` (`session.closed` / `session.expired`) with `reason`: state `closing`, work aborted,
        one cleanup attempt; the slot is released only when cleanup succeeded, else the reaper retries. A session
        ends once: later calls are no-ops."""
        if session.state is not SessionState.OPEN and session.detached_at is None:
            return
        timer = self._timers.pop(session.id, None)
        if timer is not None and timer is not asyncio.current_task():
            timer.cancel()
        session.state, session.detached_at = SessionState.CLOSING, None
        self.terminals.append({"session_id": session.id, "type": terminal, "reason": reason})
        self.logger.info("%s %s %s", session.id, terminal, reason)
        await self._clean(session)

    async def _clean(self, session: RealtimeSession) -> None:
        if await session.cleanup():
            session.state = SessionState.CLOSED
            self._reaping.pop(session.id, None)
            self.sessions.pop(session.id, None)
            self.admission.release(session.id)
        else:
            self._reaping[session.id] = session

    async def transport_lost(self, session: RealtimeSession) -> None:
        """The connection handler exited; an open session keeps its slot for the disconnect grace."""
        session.conn = None
        if session.state is not SessionState.OPEN:
            return
        grace = self.config.disconnect_grace_s
        if grace <= 0:
            await self.end(session, "session.closed", "disconnect")
            return
        session.state = SessionState.CLOSING
        session.detached_at = asyncio.get_running_loop().time()
        await session.abort()
        self._timers[session.id] = asyncio.create_task(self._lease_timer(session), name=f"lease-{session.id}")

    async def _lease_timer(self, session: RealtimeSession) -> None:
        """A detached session ends at the grace deadline or its idle TTL, whichever comes first."""
        grace_at = session.detached_at + self.config.disconnect_grace_s
        ttl = self.config.idle_ttl_s
        ttl_at = session.last_activity + ttl if ttl > 0 else float("inf")
        await asyncio.sleep(max(0.0, min(grace_at, ttl_at) - asyncio.get_running_loop().time()))
        reason = "idle_ttl_expired" if ttl_at < grace_at else "disconnect_grace_expired"
        await self.end(session, "session.expired", reason)

    async def _reap(self) -> None:
        """Every `reaper_interval_s`, retry the cleanup of sessions whose cleanup failed."""
        while True:
            await asyncio.sleep(self.config.reaper_interval_s)
            for session in list(self._reaping.values()):
                try:
                    await self._clean(session)
                except Exception:
                    self.logger.exception("reaper: cleanup of %s failed", session.id)

    async def _shut_down_sessions(self) -> None:
        """Server shutdown: attached sessions end with `session.closed` `shutdown`; every slot is freed."""
        for session in list(self.sessions.values()):
            conn = session.conn
            try:
                if conn is not None and session.state is SessionState.OPEN:
                    async with asyncio.timeout(1.0):
                        await conn.close_session("shutdown")
                elif session.state is SessionState.OPEN or session.detached_at is not None:
                    await self.end(session, "session.closed", "shutdown")
            except (ConnectionClosed, TimeoutError):
                pass
        tasks = [*self._timers.values(), *([self._reaper] if self._reaper else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._timers.clear()
        for session in list(self.sessions.values()):  # cleanup still failing: the process is going away anyway
            await session.abort()
            session.state = SessionState.CLOSED
            self.admission.release(session.id)
        self.sessions.clear()
        self._reaping.clear()

    @property
    def port(self) -> int:
        return self._server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"ws://{self.config.host}:{self.port}/v1/realtime"

    async def start(self) -> DuplexServer:
        self._server = await serve(self._handle, self.config.host, self.config.port, max_size=64 * 2**20,
                                   compression=None, process_request=self._check_path, logger=self.logger)
        if self.fixture is None:
            self._reaper = asyncio.create_task(self._reap(), name="session-reaper")
        return self

    async def close(self) -> None:
        if self._server is not None:
            await self._shut_down_sessions()
            self._server.close()
            await self._server.wait_closed()

    async def __aenter__(self) -> DuplexServer:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def _check_path(self, connection: ServerConnection, request):
        """Realtime mode serves /v1/realtime (duplex=1) and /v1/duplex; fixtures accept any path."""
        if self.fixture is not None:
            return None
        parts = urlsplit(request.path)
        duplex = dict(parse_qsl(parts.query, keep_blank_values=True)).get("duplex", "1").lower()
        if parts.path == "/v1/duplex" or (parts.path == "/v1/realtime" and duplex in ("1", "true", "on")):
            return None
        return connection.respond(404, "only /v1/realtime?duplex=1 and /v1/duplex are served here\n")

    async def _handle(self, websocket: ServerConnection) -> None:
        state = ConnectionState(index=len(self.connections))
        self.connections.append(state)
        try:
            if self.fixture is None:
                await RealtimeConnection(self, websocket, state).run()
            else:
                await self._fixture(websocket, state)
        finally:
            state.closed = True

    async def _fixture(self, websocket: ServerConnection, state: ConnectionState) -> None:
        try:
            async for raw in websocket:
                try:
                    message = json.loads(raw)
                except ValueError:
                    continue
                if not isinstance(message, dict):
                    continue
                for reply in fixture_replies(self.fixture, state, message, self.config.fault_connection_index):
                    if reply.close:
                        await websocket.close()
                        return
                    await websocket.send(reply.text)
        except ConnectionClosed:
            return


async def serve_forever(config: ServerConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with DuplexServer(config) as server:
        print(f"duplex-server listening on {server.url} mode={config.mode} max_sessions={config.max_sessions}",
              flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    config = parse_config(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    try:
        asyncio.run(serve_forever(config))
    except OSError as exc:
        print(f"h3batch duplex-server: cannot listen on {config.host}:{config.port}: {exc.strerror}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
