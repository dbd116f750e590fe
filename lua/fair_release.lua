-- fair_release: remove the caller's own request from both sorted sets; if it was within the
-- first `limit` ranks, wake the waiter that takes its place.
-- KEYS: 1 meta, 2 owners, 3 timeouts, 4 wake-up list prefix.  ARGV: 1 id.
-- Returns {1} released, {-1} expired or not held (its entries, if any, are removed).
-- First writes are ZREM/HDEL (not DENYOOM): release works when the server is out of memory.
local now = clock()
local meta, owners, timeouts, sigp = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id = ARGV[1]
local rank = redis.call('ZRANK', owners, id)
local d = redis.call('ZSCORE', timeouts, id)
local mm = redis.call('HMGET', meta, 't:' .. id, 'limit')
local held, limit = mm[1], tonumber(mm[2])
forget(meta, {owners, timeouts}, {id})
if rank and limit and rank < limit then
  wake_waiters(meta, owners, sigp, limit - 1, limit - 1, id)
end
if not (rank and held and d and tonumber(d) > now) then return {-1} end
return {1}
