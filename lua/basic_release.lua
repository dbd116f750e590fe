-- basic_release: remove only the caller's own entry; wake registered waiters.
-- KEYS: 1 meta, 2 holders, 3 waiters, 4 signal.
-- ARGV: 1 id, 2 the permit's weight as the client knows it (absent or not 1: read from the
--       server's record).
-- Returns 1 removed, -1 not there (expired and cleaned up, released, or never held).
-- Whether the lease had run out is judged by the client on its validity clock, which ends
-- before the server's deadline: no TIME and no ZSCORE here.
-- The writes before the wake-up (ZREM, HDEL) are not DENYOOM, so release works even when the
-- server is out of memory (maxmemory with noeviction).
-- Weighted: a holder of w > 1 permits gives back its 'w:' field and w - 1 of meta's 'extra',
-- and wakes up to w waiters. A permit of weight 1 has no 'w:' field (an id holds one weight
-- only: basic_acquire refuses another), so its release reads nothing more: one HDEL (which
-- finds a 'w:' field only when a stale object's id was taken again with another weight).
local id = ARGV[1]
if redis.call('ZREM', KEYS[2], id) == 0 then return -1 end
local w = 1
if ARGV[2] == '1' then
  -- One HDEL. It removes a 'w:' field only if this id was taken again with another weight
  -- after this permit object's lease ran out (a stale object): that weight is gone with it,
  -- so 'extra' is summed again over the holders (O(holders), on this rare path only).
  if redis.call('HDEL', KEYS[1], 't:' .. id, 'w:' .. id) == 2 then
    local extra, from, hs = 0, 0, nil
    repeat
      hs = redis.call('ZRANGE', KEYS[2], string.format('%d', from), string.format('%d', from + 999))
      if #hs > 0 then
        for _, x in ipairs(weights_of(KEYS[1], hs)) do extra = extra + x - 1 end
      end
      from = from + 1000
    until #hs < 1000
    w = 1 + (tonumber(redis.call('HGET', KEYS[1], 'extra')) or 0) - extra
    redis.call('HSET', KEYS[1], 'extra', string.format('%d', extra))
  end
else
  w = tonumber(redis.call('HGET', KEYS[1], 'w:' .. id)) or 1
  redis.call('HDEL', KEYS[1], 't:' .. id, 'w:' .. id)
  if w > 1 then redis.call('HINCRBY', KEYS[1], 'extra', string.format('%d', 1 - w)) end
end
-- Nobody registered as a waiter (the uncontended case): nothing more to do.
local nw = redis.call('ZCARD', KEYS[3])
if nw > 0 then wake_one(KEYS[3], KEYS[4], w, nw) end
return 1
