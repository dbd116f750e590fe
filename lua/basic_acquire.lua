-- basic_acquire: Redis in Action 6.3.1, with server time, a cardinality check and tokens.
-- KEYS: 1 meta (hash), 2 holders (zset id -> lease deadline, ms), 3 waiters (zset id -> wait
--       deadline), 4 signal (list the waiters BLPOP on)
-- ARGV: 1 id, 2 limit (used if the semaphore is new), 3 lease ms, 4 mode (0 try, 1 wait,
--       2 again, 3 last), 5 wait lease ms, 6 not after (server us; 0: none), 7 weight n
--       (permits wanted, >= 1; absent: 1)
-- Returns '1 token limit now-us' granted, '0 ms-until-the-earliest-lease-deadline (-1 none)
-- limit now-us' (one string: Redis 7.0 turns a table into a reply at ~7x the cost; see
-- docs/design.md, "What a script costs"), {-3, now us}: the request came after its not-after time,
-- {-4, weight held, now us}: the id holds a permit of another weight, or {-5, limit, now
-- us}: n exceeds the limit. Nothing is written for -3, -4, -5 (but a registered waiter
-- that finds n above a lowered limit leaves the waiters set). An error 'PARTIAL ...' when
-- the meta hash has no fence (gone, or re-created by sem_open) while holders has live
-- entries (prelude.lua's partly_missing).
-- Weights: meta 'extra' = sum over holders of (weight - 1), and 'w:<id>' = the weight of a
-- holder of more than one permit; so the permits held are ZCARD(holders) + extra, read in
-- the same HMGET as before: a weight-1 acquire costs what it did.
-- On the hot path every conversion counts (docs/design.md, "What a script costs"): the mode
-- is compared as a one-digit string, the client's numbers are converted by arithmetic, and
-- numbers go to redis.call as strings.
local now, now_us, now_us_str = clock()
if ARGV[6] ~= '0' and too_late(ARGV[6], now_us, now_us_str) then return {-3, now_us} end
local meta, holders, waiters, signal = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id, mode = ARGV[1], ARGV[4]
local again = mode == '2' or mode == '3' -- a registered waiter's attempt
local n = 1
if ARGV[7] and ARGV[7] ~= '1' then n = tonumber(ARGV[7]) or 1 end
local tkey = 't:' .. id
local m = redis.call('HMGET', meta, 'strategy', 'limit', 'fence', 'exp', tkey, 'extra')
if m[1] and m[1] ~= 'basic' then return conflict(meta, m, 'basic') end
if not m[3] then
  local e = partly_missing(meta, holders, now)
  if e then return e end
end
local limit_str = m[2] or ARGV[2]
local limit = tonumber(limit_str)
if n > limit then
  if again then redis.call('ZREM', waiters, id) end
  return {-5, limit, now_us}
end
local deadline = now + ARGV[3]
local deadline_str = string.format('%d', deadline)
local exp = new_exp(m[4], deadline)
-- KEYS is {meta, holders, waiters, signal}: every key of the semaphore
if exp then check_types(KEYS, 'hzzl') end

-- The same identifier holding a live permit gets it back, renewed (idempotent retry).
-- A permit of another weight is refused: one id is one permit object. This id's own expired
-- permit, not cleaned up yet, gives its weight back first.
local extra = 0
if m[6] then extra = tonumber(m[6]) or 0 end
if m[5] then
  local d = redis.call('ZSCORE', holders, id)
  local held = tonumber(redis.call('HGET', meta, 'w:' .. id)) or 1
  if d and tonumber(d) > now then
    if held ~= n then return {-4, held, now_us} end
    redis.call('ZADD', holders, deadline_str, id)
    if again then redis.call('ZREM', waiters, id) end
    if exp then
      expire_at(KEYS, exp)
      redis.call('HSET', meta, 'exp', exp)
    end
    return '1 ' .. m[5] .. ' ' .. limit_str .. ' ' .. now_us_str
  end
  redis.call('ZREM', holders, id)
  redis.call('HDEL', meta, tkey, 'w:' .. id)
  if held > 1 then
    extra = extra - (held - 1)
    redis.call('HSET', meta, 'extra', extra)
  end
  redis.call('HINCRBY', meta, 'xp', '1') -- a lease that ran out without a release (metrics)
end

-- Admit iff the permits held + n <= limit: a count check, so a new request never
-- displaces a holder. Expired holders (and their weights) are removed only when they are in
-- the way, at most 256 per call, so the cost does not grow with the number of holders.
local card = redis.call('ZCARD', holders)
if card + extra + n > limit then
  local gone = redis.call('ZRANGEBYSCORE', holders, '-inf', string.format('%d', now), 'LIMIT',
    '0', '256')
  if #gone > 0 then
    for _, w in ipairs(weights_of(meta, gone)) do extra = extra - (w - 1) end
    forget(meta, {holders}, gone)
    card = card - #gone
    redis.call('HSET', meta, 'extra', string.format('%d', extra))
    redis.call('HINCRBY', meta, 'xp', #gone) -- leases that ran out without a release (metrics)
  end
end
local used = card + extra

if used + n <= limit then
  local _, tok_str = next_token(m[3], now_us, now_us_str)
  redis.call('ZADD', holders, deadline_str, id)
  if card == 0 and not exp then redis.call('PEXPIREAT', holders, m[4]) end
  if n == 1 and m[1] and not exp then
    redis.call('HSET', meta, 'fence', tok_str, tkey, tok_str) -- the common case: no table
  else
    local f = {'fence', tok_str, tkey, tok_str}
    if n > 1 then
      table.insert(f, 'w:' .. id); table.insert(f, n)
      table.insert(f, 'extra'); table.insert(f, extra + n - 1)
    end
    if not m[1] then
      table.insert(f, 'strategy'); table.insert(f, 'basic')
      table.insert(f, 'limit'); table.insert(f, limit)
    end
    if exp then table.insert(f, 'exp'); table.insert(f, exp) end
    redis.call('HSET', meta, unpack(f))
    if exp then expire_at(KEYS, exp) end
  end
  if again then redis.call('ZREM', waiters, id) end
  return '1 ' .. tok_str .. ' ' .. limit_str .. ' ' .. now_us_str
end

local first = redis.call('ZRANGE', holders, '0', '0', 'WITHSCORES')
local next_ms = -1
if first[2] then next_ms = math.max(0, tonumber(first[2]) - now) end
if mode == '1' or mode == '2' then
  -- A read first: a foreign key of another type at the wake-up list fails with WRONGTYPE
  -- before any write (and the first write stays ZADD, refused when out of memory).
  redis.call('LLEN', signal)
  local wd = now + tonumber(ARGV[5])
  redis.call('ZADD', waiters, wd, id)
  redis.call('ZREMRANGEBYSCORE', waiters, '-inf', now)
  redis.call('PEXPIREAT', waiters, math.max(exp or tonumber(m[4]) or 0, wd + IDLE))
  -- Every permit is taken right now, so a wake-up still pending is stale. (With weights, a
  -- wake-up left while some permits are free may be for a smaller request: keep it.)
  if used >= limit then redis.call('DEL', signal) end
elseif mode == '3' then
  redis.call('ZREM', waiters, id)
end
return '0 ' .. next_ms .. ' ' .. limit_str .. ' ' .. now_us_str
