-- fair_release: remove the caller's own request from both sorted sets; if it was within the
-- first `limit` ranks, wake the waiter that takes its place.
-- KEYS: 1 meta, 2 owners, 3 timeouts, 4 wake-up list prefix.  ARGV: 1 id.
-- Returns {1} removed, {-1} not there (whether the lease had run out is judged by the
-- client on its validity clock, see basic_release.lua).
-- First writes are ZREM/HDEL (not DENYOOM): release works when the server is out of memory.
local meta, owners, timeouts = KEYS[1], KEYS[2], KEYS[3]
local id = ARGV[1]
local rank = redis.call('ZRANK', owners, id)
if not rank then return {-1} end
redis.call('ZREM', owners, id)
redis.call('ZREM', timeouts, id)
local held = redis.call('HDEL', meta, 't:' .. id)
local limit = tonumber(redis.call('HGET', meta, 'limit'))
if limit and rank < limit then
  wake_waiters(meta, owners, KEYS[4], limit - 1, limit - 1, id)
end
if held == 0 then return {-1} end
return {1}
