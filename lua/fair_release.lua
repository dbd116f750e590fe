-- fair_release: remove the caller's own permit, give its weight back, and hand the permits
-- that frees to the head of the queue (grant_heads), waking the waiters granted.
-- KEYS: 1 meta, 2 owners, 3 timeouts, 4 wake-up list prefix.  ARGV: 1 id (2 the weight,
-- unused: the server's record decides).
-- Returns 1 removed, -1 not there (whether the lease had run out is judged by the
-- client on its validity clock, see basic_release.lua).
-- First writes are ZREM/HDEL (not DENYOOM): release works when the server is out of memory.
local meta, owners, timeouts = KEYS[1], KEYS[2], KEYS[3]
local id = ARGV[1]
local m = redis.call('HMGET', meta, 't:' .. id, 'w:' .. id, 'used', 'limit', 'fence')
if not m[1] then return -1 end
local w = tonumber(m[2]) or 1
redis.call('ZREM', timeouts, id)
redis.call('HDEL', meta, 't:' .. id, 'w:' .. id)
-- the server's clock is read only if a waiter is granted (grant_heads)
local st = {used = math.max(0, (tonumber(m[3]) or w) - w), fence = m[5]}
redis.call('HSET', meta, 'used', st.used)
grant_heads(meta, owners, KEYS[4], tonumber(m[4]) or 0, st, nil, 1)
return 1
