"""Compose healthcheck of a GPU worker: healthy while its heartbeat key exists (TTL 15 s) in a live state.

Never `celery inspect ping`: the solo pool answers control commands only between jobs (spec §3 pitfall 4).
"""
import json
import os
import sys

import redis

name = os.environ["H3BATCH_WORKER_NAME"]
beat = redis.Redis.from_url(os.environ["H3BATCH_REDIS_URL"], socket_timeout=3).get(f"h3b:worker:{name}")
sys.exit(0 if beat and json.loads(beat).get("state") in ("READY", "BUSY") else 1)
