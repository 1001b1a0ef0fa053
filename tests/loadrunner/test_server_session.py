"""Reference server, one realtime session (`server_session`, spec §3.1, §3.4, §5): ids, epochs, capabilities and
the order and chunking of its output stream, over real WebSockets.
"""
from __future__ import annotations

import asyncio
import json
import re

import numpy as np
import pytest
from websockets.asyncio.client import connect

from h3batch.loadrunner.protocol import session_update
from h3batch.loadrunner.server import DuplexServer
from h3batch.loadrunner.server_config import ServerConfig
from tests.loadrunner.realtime_client import HEX32, QUERY, open_session, recv_until


def test_ids_are_server_allocated_fresh_and_epochs_advance():
    """§3.1: ids are `duplex-<32 hex>`, client ids ignored, epoch starts at 0 and each epoch event mints a response."""
    async def scenario():
        async with DuplexServer(ServerConfig()) as server:
            url = server.url + QUERY + "&session_id=client-chosen"
            a, created_a = await open_session(url, id="client-a", session_id="client-a")
            b, created_b = await open_session(url)
            rids = [created_a["session"]["active_response_id"]]
            for kind in ("response.cancel", "output_audio_buffer.clear", "input.cancel", "barge_in"):
                await a.send(json.dumps({"type": kind}))
                done, _ = await recv_until(a, "response.done")
                created, _ = await recv_until(a, "response.created")
                assert done["response_id"] == rids[-1]
                rids.append(created["response_id"])
            await a.close()
            await b.close()
            return created_a["session"], created_b["session"], rids

    a, b, rids = asyncio.run(scenario())
    assert re.fullmatch(f"duplex-{HEX32}", a["id"]) and re.fullmatch(f"duplex-{HEX32}", b["id"])
    assert a["id"] != b["id"] and a["epoch"] == 0 and a["state"] == "open"
    assert [re.fullmatch(f"resp-{a['id']}-(\\d)-[0-9a-f]{{8}}", r).group(1) for r in rids] == ["0", "1", "2", "3", "4"]
    assert b["active_response_id"].startswith(f"resp-{b['id']}-0-")

@pytest.mark.parametrize("max_sessions, multi", [(1, False), (2, True)])
def test_multi_session_flags_follow_max_sessions(max_sessions, multi):
    """§3.4: both multi-session capability flags are true only when max_sessions > 1."""
    async def scenario():
        async with DuplexServer(ServerConfig(max_sessions=max_sessions)) as server:
            ws, created = await open_session(server.url + QUERY)
            await ws.close()
            return created["session"]["capabilities"]

    caps = asyncio.run(scenario())
    assert caps["supports_multi_session"] is multi and caps["supports_multi_session_same_replica"] is multi
    assert caps["supports_session_resume"] is False and caps["supports_session_lease"] is True

def test_realtime_stream_order_and_sequence():
    """Realtime output: response events before the first 1-frame packet, transcript after each packet, seq from 1."""
    async def scenario():
        async with DuplexServer(ServerConfig()) as server:
            async with connect(server.url + "?duplex=1&model=m&autostart=0") as ws:
                await ws.send(session_update("m", "NATF2.pt", "p"))
                frame = {"type": "input_audio_buffer.append", "format": "pcm_f32le", "sample_rate_hz": 24000}
                import base64
                payload = base64.b64encode(np.full(1920 * 6, 0.25, "<f4").tobytes()).decode()
                await ws.send(json.dumps({**frame, "audio": payload}))
                events = []
                async with asyncio.timeout(3):
                    while sum(e["type"] == "response.output_audio_transcript.delta" for e in events) < 2:
                        events.append(json.loads(await ws.recv()))
                await ws.send(json.dumps({**frame, "audio": payload, "sample_rate_hz": 16000}))
                rate_error, _ = await recv_until(ws, "error")
                return events, rate_error

    events, rate_error = asyncio.run(scenario())
    types = [e["type"] for e in events]
    assert types[:8] == ["session.created", "session.updated", "response.created", "conversation.item.added",
                         "conversation.item.created", "response.output_item.added", "response.content_part.added",
                         "response.speak"]
    packets = [e for e in events if e["type"] == "response.output_audio.delta"]
    assert [len(p["delta"]) for p in packets] == [5120, 5 * 5120]
    assert types[types.index("response.output_audio.delta") + 1] == "response.output_audio_transcript.delta"
    assert packets[0]["metadata"]["vllm_omni"]["runtime_impl"] == "scheduler_data_plane"
    assert [e["server_event_seq"] for e in events[1:]] == list(range(1, len(events)))
    assert rate_error["error"]["code"] == "runtime_append_failed" and rate_error["error"]["type"] == "server_error"
