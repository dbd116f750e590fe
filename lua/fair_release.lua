-- fair_release: remove the caller's own permit, give its weight back, and hand the permits
-- that frees to the head of the queue (grant_heads), waking the waiters granted.
-- KEYS: 1 meta, 2 owners, 3 timeouts, 4 wake-up list prefix (not a key: unused since 0.4.7),
--       5 and 6 (optional, one server only: a client with waiters) the caller's client's id
--       list and its bell (a waiter of the same client is woken at once, grant_heads).
-- ARGV: 1 id (2 the weight, unused: the server's record decides).
-- Returns 1 removed, -1 not there (whether the lease had run out is judged by the
-- client on its validity clock, see basic_release.lua); {'wake', 1, wake-ups...} removed
-- and waiters granted, whose wake-ups the caller pushes (prelude.lua's grant_heads).
-- First writes are ZREM/HDEL (not DENYOOM): release works when the server is out of memory;
-- Redis checks maxmemory only before a script's first write, so the HINCRBY or HSET of
-- `used` after them runs.
-- One HMGET reads the permit and what grant_heads needs (limit, fence, used); grant_heads
-- runs only if a waiter is queued (ZCARD, read before the first write: cheaper than its
-- ZRANGE and the call when nobody waits). With nobody queued 'used' is decremented by
-- HINCRBY; with waiters it is computed here and written once, by grant_heads' HSET of the
-- grant (or here if nobody fits): one command less per hand-off.
local meta, owners, timeouts = KEYS[1], KEYS[2], KEYS[3]
local id = ARGV[1]
local tkey, wkey = 't:' .. id, 'w:' .. id
local m = redis.call('HMGET', meta, tkey, wkey, 'limit', 'fence', 'used')
if not m[1] then
  -- the meta hash lost (evicted; no fence: gone, or re-created by sem_open): this permit's
  -- record is lost, and its entry would keep the semaphore refused (prelude.lua's
  -- partly_missing) until its lease ends
  if not m[4] then redis.call('ZREM', timeouts, id) end
  return -1
end
-- read before the first write: a foreign key at owners fails the release before it changes
-- anything (the scripts' convention, prelude.lua)
local waiting = redis.call('ZCARD', owners) > 0
redis.call('ZREM', timeouts, id)
redis.call('HDEL', meta, tkey, wkey, 'L:' .. id) -- L:, left by a redsem <= 0.4.4 grant
local w = m[2] and (tonumber(m[2]) or 1) or 1
if waiting then
  local used = (tonumber(m[5]) or 0) - w
  if used < 0 then used = 0 end
  -- the server's clock is read only if a waiter is granted (grant_heads)
  local st = {used = used, fence = m[4]}
  grant_heads(meta, owners, timeouts, tonumber(m[3]) or 0, st, nil, 1, KEYS[5], KEYS[6])
  -- a grant wrote 'used' (its HSET); nobody fit: written here
  if st.used == used then redis.call('HSET', meta, 'used', string.format('%d', used)) end
  if st.wakes then return {'wake', 1, unpack(st.wakes)} end
  return 1
end
local dec = w == 1 and '-1' or string.format('%d', -w)
if redis.call('HINCRBY', meta, 'used', dec) < 0 then redis.call('HSET', meta, 'used', '0') end
return 1
