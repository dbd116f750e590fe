-- basic_release: remove only the caller's own entry; wake one registered waiter.
-- KEYS: 1 meta, 2 holders, 3 waiters, 4 signal.  ARGV: 1 id.
-- Returns {1} removed, {-1} not there (expired and cleaned up, released, or never held).
-- Whether the lease had run out is judged by the client on its validity clock, which ends
-- before the server's deadline: no TIME and no ZSCORE here.
-- The writes before the wake-up (ZREM, HDEL) are not DENYOOM, so release works even when the
-- server is out of memory (maxmemory with noeviction).
local id = ARGV[1]
if redis.call('ZREM', KEYS[2], id) == 0 then return {-1} end
redis.call('HDEL', KEYS[1], 't:' .. id)
wake_one(KEYS[3], KEYS[4])
return {1}
