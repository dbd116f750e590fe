-- fair_acquire: Redis in Action 6.3.2-6.3.3 (fair semaphore), also the body of the locked
-- strategy (6.3.4), plus queued waiters.
-- KEYS: 1 meta (hash: strategy, limit, fence, exp, t:<id> -> token of each holder)
--       2 owners (zset id -> ticket), 3 timeouts (zset id -> deadline, ms; same members)
--       4 wake-up list prefix (a waiter blocks on KEYS[4] .. id), 5 guard (locked only)
-- ARGV: 1 id, 2 limit (used if new), 3 lease ms, 4 mode (0 try, 1 wait, 2 again, 3 last),
--       5 wait lease ms, 6 strategy ('fair' or 'locked'), 7 guard token (locked),
--       8 not after (server us; 0: none)
-- A request is granted iff fewer than `limit` requests rank ahead of it by ticket. Instead
-- of the book's ZINTERSTORE over the whole set on every call, expired members are removed
-- by score (at most 256 per call) and only when they are in the way.
-- Returns {1, token, limit, now us} granted; {0, ms until the earliest deadline (-1 none),
-- limit, now us} not granted; {-2} the locked strategy's guard is not held by the caller;
-- {-3, now us} the request came after its not-after time.
-- locked: the guard is checked first and deleted at once (the compare-and-delete that the
-- book runs after the acquire): the script is atomic, so nothing can run between the
-- deletion and the rest of the script, and the caller gets the grant one round trip sooner.
local strategy = ARGV[6]
if strategy == 'locked' then
  if redis.call('GET', KEYS[5]) ~= ARGV[7] then return {-2} end
  redis.call('DEL', KEYS[5])
end
local now, now_us, now_us_str = clock()
if too_late(ARGV[8], now_us) then return {-3, now_us} end
local meta, owners, timeouts, sigp = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id, lease, mode = ARGV[1], tonumber(ARGV[3]), tonumber(ARGV[4])
local tkey = 't:' .. id
local m = redis.call('HMGET', meta, 'strategy', 'limit', 'fence', 'exp', tkey)
if m[1] and m[1] ~= strategy then return conflict(meta, m, strategy) end
local limit = tonumber(m[2]) or tonumber(ARGV[2])
local wait_lease = tonumber(ARGV[5])
local deadline = now + lease
local deadline_str = string.format('%d', deadline)
local exp = new_exp(m[4], now + math.max(lease, wait_lease))
local e = exp or tonumber(m[4])
local all = {meta, owners, timeouts}
if exp then check_types(all, 'hzz') end

local function save_meta(fields)
  if not m[1] then
    table.insert(fields, 'strategy'); table.insert(fields, strategy)
    table.insert(fields, 'limit'); table.insert(fields, limit)
  end
  if exp then
    table.insert(fields, 'exp'); table.insert(fields, exp)
  end
  redis.call('HSET', meta, unpack(fields))
  if exp then expire_at(all, exp) end
end

-- The same identifier holding a live permit gets it back, renewed (idempotent retry).
if m[5] then
  local d = redis.call('ZSCORE', timeouts, id)
  if d and tonumber(d) > now then
    redis.call('ZADD', timeouts, deadline_str, id)
    if exp then save_meta({}) end
    return {1, tonumber(m[5]), limit, now_us}
  end
end

-- Remove expired requests (holders and waiters alike); wake the waiters that moved into
-- the first `limit` ranks. Returns how many were removed.
local function cleanup()
  local gone = redis.call('ZRANGEBYSCORE', timeouts, '-inf', now, 'LIMIT', 0, 256)
  if #gone == 0 then return 0 end
  local entitled = 0
  for _, g in ipairs(gone) do
    local r = redis.call('ZRANK', owners, g)
    if r and r < limit then entitled = entitled + 1 end
  end
  forget(meta, {owners, timeouts}, gone)
  wake_waiters(meta, owners, sigp, limit - entitled, limit - 1, id)
  return #gone
end

-- ZRANK of a missing member is false in Lua, not nil. A waiter whose entry is gone (its wait
-- lease ran out before it could renew it, and a cleanup removed it) queues again as new.
local rank = nil
if mode >= 2 then rank = redis.call('ZRANK', owners, id) or nil end
local fresh = rank == nil
if fresh then rank = redis.call('ZCARD', owners) end
if rank >= limit and cleanup() > 0 then
  if not fresh then
    rank = redis.call('ZRANK', owners, id) or nil
    fresh = rank == nil
  end
  if fresh then rank = redis.call('ZCARD', owners) end
end

local tok, tok_str = next_token(m[3], now_us, now_us_str)
if rank < limit then
  -- A new request's ticket doubles as its token; a waiter's token is drawn now, at its
  -- grant, so tokens increase in grant order even when waiters claim out of order.
  if fresh then redis.call('ZADD', owners, 'NX', tok_str, id) end
  redis.call('ZADD', timeouts, deadline_str, id)
  if rank == 0 and not exp then
    redis.call('PEXPIREAT', owners, m[4])
    redis.call('PEXPIREAT', timeouts, m[4])
  end
  save_meta({'fence', tok_str, tkey, tok_str})
  return {1, tok, limit, now_us}
end

local first = redis.call('ZRANGE', timeouts, 0, 0, 'WITHSCORES')
local next_ms = -1
if first[2] then next_ms = math.max(0, tonumber(first[2]) - now) end
if mode == 0 then return {0, next_ms, limit, now_us} end
if mode == 3 then
  if not fresh then forget(meta, {owners, timeouts}, {id}) end
  return {0, next_ms, limit, now_us}
end
-- Queue (or stay queued) under the wait lease; a new waiter's ticket is taken now.
if fresh then
  redis.call('ZADD', owners, 'NX', tok_str, id)
  redis.call('ZADD', timeouts, now + wait_lease, id)
  save_meta({'fence', tok_str})
else
  redis.call('ZADD', timeouts, now + wait_lease, id)
  if exp then save_meta({}) end
end
return {0, next_ms, limit, now_us}
