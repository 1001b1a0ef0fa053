"""Priority lanes: `interactive` jobs start first, `batch` jobs fill idle capacity, and neither lane starves.

A job's lane is its record field `priority`. The lanes are built on the batch feeder (core/batches.py), not on a
dispatcher of their own:

- `interactive` (what POST /jobs and /v1/videos create unless asked otherwise): the render message is sent at once,
  as single jobs always were.
- `batch` (every batch item, and a single job that asks for it): the job is *held* (queued, but out of `h3b:queue`
  and without a message) until the feeder releases it into idle capacity. A held single job waits in
  `h3b:lanes:batch` (score = creation sequence), which takes its turn in the feeder's round-robin as one more batch
  (the member `LANE_MEMBER` of `h3b:batches:active`), so a stream of batch-lane singles shares the idle workers
  with the batches instead of overtaking them.

So interactive work never queues behind held batch work. The other way round, a steady interactive stream keeps
every worker busy and the feeder finds no idle capacity, ever. Anti-starvation: each claim counts interactive
starts in a row while batch work is held (`h3b:lanes:streak`; a batch start, or any start with nothing held, sets
it back to 0). Once it reaches H3BATCH_INTERACTIVE_STREAK, the worker's next feed releases one held job whatever
the capacity, stamps it `promoted_at` and sends it at broker priority `OVERDUE_PRIORITY`: kombu's Redis transport
pops priority 0 before 3 on every queue a worker consumes, so it is the next job a worker of its queue takes. Every
other render message goes at `MESSAGE_PRIORITY`, first come first served, so a released batch job is never
overtaken by interactive messages sent after it.
"""
from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import redis

from h3batch.core import keys


class Priority(str, enum.Enum):
    INTERACTIVE = "interactive"  # sent at once; default of POST /jobs and /v1/videos
    BATCH = "batch"  # held until idle capacity (or the anti-starvation rule) releases it; every batch item


MESSAGE_PRIORITY = 3
"""Broker priority of every render message but an overdue one (kombu's Redis steps are 0, 3, 6, 9; 0 goes first)."""
OVERDUE_PRIORITY = 0
"""Broker priority of a batch job the anti-starvation rule released: ahead of everything waiting."""
LANE_MEMBER = "jobs"
"""The rotation entry (`h3b:batches:active`) of the held single jobs; batch ids start with `batch_`, never this."""


def lane_of(record: Mapping[str, Any]) -> Priority:
    """A record's lane; a record written before lanes existed is a batch item's (`batch_id`) or interactive."""
    value = record.get("priority")
    if value:
        return Priority(value)
    return Priority.BATCH if record.get("batch_id") else Priority.INTERACTIVE


def message_priority(promoted: bool) -> int:
    return OVERDUE_PRIORITY if promoted else MESSAGE_PRIORITY


# Count one start. KEYS: streak, active batches. ARGV: the lane. Returns the streak after it.
_COUNT_START = """
if ARGV[1] ~= 'interactive' or redis.call('llen', KEYS[2]) == 0 then
  redis.call('set', KEYS[1], 0)
  return 0
end
return redis.call('incr', KEYS[1])
"""


def count_start(r: redis.Redis, lane: Priority) -> int:
    """A job was claimed: an interactive start while batch work is held lengthens the streak, anything else ends
    it. Returns the streak (the feeder reads it: core/batches.feed)."""
    return int(r.eval(_COUNT_START, 2, keys.LANE_STREAK, keys.BATCHES_ACTIVE, lane.value))
