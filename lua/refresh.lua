-- refresh: extend a live holder's lease; never re-create or extend an expired or released
-- entry (redis-semaphore and others shipped that bug: a late refresh resurrected a lease).
-- KEYS: 1 meta, 2 the deadline zset (basic: holders; fair/locked: timeouts), 3.. the other
--       keys of the semaphore (to move their expiry along).
-- ARGV: 1 id, 2 lease ms, 3 minimum ms the lease must still have (the client's safety margin:
--       drift + early warning). A refresh that reaches the server later than that (delayed in
--       a socket buffer while the server was stalled, say) arrives after the holder was told
--       its permit is lost, and must not bring the lease back to life.
-- Returns 1 extended, -1 lost.
local now = clock()
local meta, dz, id = KEYS[1], KEYS[2], ARGV[1]
local m = redis.call('HMGET', meta, 't:' .. id, 'exp')
if not m[1] then return -1 end
local d = redis.call('ZSCORE', dz, id)
if not d or tonumber(d) - now < math.max(1, ARGV[3] + 0) then return -1 end
local deadline = now + ARGV[2]
local exp = new_exp(m[2], deadline)
-- the other keys are about to get a new expiry without having been read: basic passes
-- meta, holders, waiters, signal; fair and locked meta, timeouts, owners
if exp then check_types(KEYS, #KEYS == 4 and 'hzzl' or 'hzz') end
-- The first write is PEXPIREAT, which is not DENYOOM: Redis checks maxmemory only before a
-- script's first write, so the ZADD below still runs when the server is out of memory.
-- (numbers go to redis.call as strings: a Lua number is formatted with %.17g)
if exp then expire_at(KEYS, exp) else redis.call('PEXPIREAT', meta, m[2]) end
redis.call('ZADD', dz, 'XX', string.format('%d', deadline), id)
if exp then redis.call('HSET', meta, 'exp', exp) end
return 1
