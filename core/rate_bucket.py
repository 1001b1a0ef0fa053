"""The per-API-key token bucket in Redis, as one Lua function: spent at the door by api/ratelimit.py (one token per
request) and inside core/batches.py's admission script (one token per batch item), so both read and write the same
bucket by the same arithmetic.

A bucket holds up to `cap` tokens (one minute's quota) and refills `rate` tokens per millisecond, read from Redis's
own clock (TIME), so API hosts with skewed clocks agree. A request of `cost` tokens is allowed when the bucket holds
`need` = min(cost, cap): a batch larger than one minute's quota needs a full bucket and leaves it in debt (negative),
which later creates of that key wait out. Without the debt such a batch could never be admitted; with it the key's
long-run rate stays at its quota. The key expires once it would be full again, debt included.
"""
from __future__ import annotations

TAKE_FUNCTION = """
local function bucket_take(key, cap, rate, cost, need)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local b = redis.call('HMGET', key, 'tokens', 'ts_ms')
  local tokens = tonumber(b[1])
  local ts = tonumber(b[2])
  if tokens == nil or ts == nil then tokens = cap; ts = now end
  tokens = math.min(cap, tokens + math.max(0, now - ts) * rate)
  local allowed = 0
  local wait_ms = 0
  if tokens >= need then
    tokens = tokens - cost
    allowed = 1
  else
    wait_ms = math.ceil((need - tokens) / rate)
  end
  redis.call('HSET', key, 'tokens', tostring(tokens), 'ts_ms', tostring(now))
  redis.call('PEXPIRE', key, math.ceil((cap - tokens) / rate) + 1000)
  return allowed, tokens, wait_ms, math.ceil((cap - tokens) / rate)
end
"""
"""Defines `bucket_take(key, cap, rate, cost, need)` → allowed (0/1), tokens left, ms until `need` tokens are there
(when refused), ms until full. Prepend it to a script that calls it."""
