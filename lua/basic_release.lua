-- basic_release: remove only the caller's own entry; wake one registered waiter.
-- KEYS: 1 meta, 2 holders, 3 waiters, 4 signal.  ARGV: 1 id.
-- Returns {1} released, {-1} it had expired or was not held (its entry, if any, is removed).
-- Writes here are not DENYOOM (ZREM, HDEL) until the wake-up, so release works even when the
-- server is out of memory (maxmemory with noeviction).
local now = clock()
local meta, holders, waiters, signal = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id = ARGV[1]
local d = redis.call('ZSCORE', holders, id)
if not d then
  redis.call('HDEL', meta, 't:' .. id)
  return {-1}
end
forget(meta, {holders}, {id})
wake_one(waiters, signal)
if tonumber(d) <= now then return {-1} end
return {1}
