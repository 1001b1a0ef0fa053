"""What waits in the broker: the ready lists kombu's Redis transport keeps per queue, read without Celery.

Celery has no API that counts waiting messages of the Redis transport, so the reaper (worker/reaper.py), the idle
watchdog (worker/watchdog.py) and the API's metrics (api/metrics.py) read kombu's lists themselves, through this one
module: a queue `q` is the list `q` plus one list per priority step (`q\\x06\\x16p`), each name under the app's
`global_keyprefix` if it sets one (the load runner's app does: loadrunner/celery_app.py `KEY_PREFIX`).
"""
from __future__ import annotations

import redis

from h3batch.core import defaults, routing

KOMBU_PRIORITY_SEP = "\x06\x16"
KOMBU_PRIORITY_STEPS = (3, 6, 9)
"""kombu's Redis transport keeps priority p > 0 messages of queue q in the list `q\\x06\\x16p` (steps 0, 3, 6, 9)."""


def ready_lists(queue: str, prefix: str = "") -> list[str]:
    """The Redis lists holding `queue`'s waiting messages, every priority, under the app's key prefix."""
    return [f"{prefix}{queue}"] + [f"{prefix}{queue}{KOMBU_PRIORITY_SEP}{p}" for p in KOMBU_PRIORITY_STEPS]


def ready_depth(r: redis.Redis, queue: str, prefix: str = "") -> int:
    """Messages waiting in the broker for `queue` (all priorities): the work an idle consumer should be taking."""
    with r.pipeline(transaction=False) as pipe:
        for name in ready_lists(queue, prefix):
            pipe.llen(name)
        return sum(int(n) for n in pipe.execute())


def render_depth(r: redis.Redis) -> int:
    """Render messages waiting in every capability queue (core/routing.all_queues) plus the plain `render` queue
    (messages sent before routing, or without a queue): the figure `h3batch_queue_depth{queue="render"}` shows."""
    with r.pipeline(transaction=False) as pipe:
        for queue in [defaults.RENDER_QUEUE, *routing.all_queues()]:
            for name in ready_lists(queue):
                pipe.llen(name)
        return sum(int(n) for n in pipe.execute())
