-- basic_acquire: Redis in Action 6.3.1, with server time, a cardinality check and tokens.
-- KEYS: 1 meta (hash), 2 holders (zset id -> lease deadline, ms), 3 waiters (zset id -> wait
--       deadline), 4 signal (list the waiters BLPOP on)
-- ARGV: 1 id, 2 limit (used if the semaphore is new), 3 lease ms, 4 mode (0 try, 1 wait,
--       2 again, 3 last), 5 wait lease ms, 6 not after (server us; 0: none)
-- Returns {1, token, limit, now us} granted, {0, ms until the earliest lease deadline (-1
-- none), limit, now us}, or {-3, now us}: the request came after its not-after time.
local now, now_us, now_us_str = clock()
if too_late(ARGV[6], now_us) then return {-3, now_us} end
local meta, holders, waiters, signal = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id, lease, mode = ARGV[1], tonumber(ARGV[3]), tonumber(ARGV[4])
local tkey = 't:' .. id
local m = redis.call('HMGET', meta, 'strategy', 'limit', 'fence', 'exp', tkey)
if m[1] and m[1] ~= 'basic' then return conflict(meta, m, 'basic') end
local limit = tonumber(m[2]) or tonumber(ARGV[2])
local deadline = now + lease
local deadline_str = string.format('%d', deadline)
local exp = new_exp(m[4], deadline)
local e = exp or tonumber(m[4])
local all = {meta, holders, waiters, signal}
if exp then check_types(all, 'hzzl') end

-- The same identifier holding a live permit gets it back, renewed (idempotent retry).
if m[5] then
  local d = redis.call('ZSCORE', holders, id)
  if d and tonumber(d) > now then
    redis.call('ZADD', holders, deadline_str, id)
    if mode >= 2 then redis.call('ZREM', waiters, id) end
    if exp then
      expire_at(all, exp)
      redis.call('HSET', meta, 'exp', exp)
    end
    return {1, tonumber(m[5]), limit, now_us}
  end
end

-- Admit iff fewer than `limit` holders remain: a cardinality check, so a new request never
-- displaces a holder. Expired holders are removed only when they are in the way, at most
-- 256 per call, so the cost does not grow with the number of holders.
local card = redis.call('ZCARD', holders)
if card >= limit then
  local gone = redis.call('ZRANGEBYSCORE', holders, '-inf', now, 'LIMIT', 0, 256)
  if #gone > 0 then
    forget(meta, {holders}, gone)
    card = card - #gone
  end
end

if card < limit then
  local tok, tok_str = next_token(m[3], now_us, now_us_str)
  redis.call('ZADD', holders, deadline_str, id)
  if card == 0 and not exp then redis.call('PEXPIREAT', holders, m[4]) end
  if not m[1] then
    redis.call('HSET', meta, 'strategy', 'basic', 'limit', limit, 'fence', tok_str,
      tkey, tok_str, 'exp', exp)
  elseif exp then
    redis.call('HSET', meta, 'fence', tok_str, tkey, tok_str, 'exp', exp)
  else
    redis.call('HSET', meta, 'fence', tok_str, tkey, tok_str)
  end
  if exp then expire_at(all, exp) end
  if mode >= 2 then redis.call('ZREM', waiters, id) end
  return {1, tok, limit, now_us}
end

local first = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
local next_ms = -1
if first[2] then next_ms = math.max(0, tonumber(first[2]) - now) end
if mode == 1 or mode == 2 then
  -- A read first: a foreign key of another type at the wake-up list fails with WRONGTYPE
  -- before any write (and the first write stays ZADD, refused when out of memory).
  redis.call('LLEN', signal)
  local wd = now + tonumber(ARGV[5])
  redis.call('ZADD', waiters, wd, id)
  redis.call('ZREMRANGEBYSCORE', waiters, '-inf', now)
  redis.call('PEXPIREAT', waiters, math.max(e or 0, wd + IDLE))
  -- Every permit is taken right now, so a wake-up still pending is stale.
  redis.call('DEL', signal)
elseif mode == 3 then
  redis.call('ZREM', waiters, id)
end
return {0, next_ms, limit, now_us}
