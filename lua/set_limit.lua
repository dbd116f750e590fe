-- set_limit: change the recorded limit; basic: wake as many waiters as there are new
-- permits; fair and locked: hand the new permits to the head of the queue (grant_heads).
-- KEYS: basic: 1 meta, 2 holders, 3 waiters, 4 signal;
--       fair/locked: 1 meta, 2 owners, 3 timeouts, 4 wake-up list prefix (not a key: unused
--       since 0.4.7), 5 and 6 (optional, one server only: a client with waiters) the caller's
--       client's id list and its bell (a waiter of the same client is woken at once,
--       grant_heads).
-- ARGV: 1 strategy, 2 new limit.  Returns {old limit}; fair/locked, waiters granted:
-- {'wake', {old limit}, wake-ups...}, which the caller pushes (prelude.lua's grant_heads).
local now, now_us, now_us_str = clock()
local meta, strategy, limit = KEYS[1], ARGV[1], tonumber(ARGV[2])
local m = redis.call('HMGET', meta, 'strategy', 'limit', 'exp', 'used', 'fence')
if m[1] and m[1] ~= strategy then return conflict(meta, m, strategy) end
-- the keys read or written after the first write: basic the waiters set and the wake-up
-- list, fair/locked owners and timeouts (grant_heads)
if strategy == 'basic' then check_types({KEYS[3], KEYS[4]}, 'zl')
else check_types({KEYS[2], KEYS[3]}, 'zz') end
-- the meta hash gone while permits or waiters remain (keys partly evicted): recording a
-- fresh one would let the next acquire forget them (prelude.lua's partly_missing)
if not m[5] then
  local e = partly_missing(meta, strategy == 'basic' and KEYS[2] or KEYS[3], now)
  if e then return e end
end
local old = tonumber(m[2]) or limit
if m[1] then
  redis.call('HSET', meta, 'limit', limit)
else
  local exp = now + IDLE
  redis.call('HSET', meta, 'strategy', strategy, 'limit', limit, 'exp', exp)
  redis.call('PEXPIREAT', meta, exp)
end
if limit > old then
  if strategy == 'basic' then
    local n = math.min(limit - old, redis.call('ZCOUNT', KEYS[3], '(' .. now, '+inf'))
    for _ = 1, n do redis.call('LPUSH', KEYS[4], '1') end
    if n > 0 then redis.call('PEXPIRE', KEYS[4], IDLE_STR) end
  else
    local st = {used = tonumber(m[4]) or 0, fence = m[5], now_us = now_us,
      now_us_str = now_us_str}
    grant_heads(meta, KEYS[2], KEYS[3], limit, st, nil, 1, KEYS[5], KEYS[6])
    if st.wakes then return {'wake', {old}, unpack(st.wakes)} end
  end
end
return {old}
