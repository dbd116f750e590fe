-- rate: every operation of a rate limit, "at most N grants in any window of W ms" on the
-- server's clock: a sliding-window log (a sorted set of grant times, server us) and the fair
-- strategy's FIFO queue of waiters (a ticket per waiter, a wait lease per waiter).
-- KEYS: 1 meta (hash: strategy 'rate', limit N, window W ms, fence, exp, t:<id> -> token of
--       each grant still in the log), 2 grants (zset id -> grant time, server us),
--       3 queue (zset id -> ticket), 4 timeouts (zset id -> wait deadline, ms; same members),
--       5 wake-up list prefix (not a key: a waiter BLPOPs on KEYS[5] .. id, which the
--       caller forms and pushes to)
-- ARGV: 1 id, 2 N, 3 W ms (N = 0: whatever is recorded, status only), 4 mode (0 try, 1 wait,
--       2 again, 3 last, 4 status, 5 open), 5 wait lease ms, 6 not after (server us; 0: none)
-- Returns: granted {1, token, N, now us, grant us}; not granted {0, ms until this request's
-- turn, N, now us, rank in the queue}; {-3, now us} the request came after its not-after
-- time; status {exists 0/1, N, W, grants in the window, waiters, ms until a new request's
-- turn, fence, now us}; open {N}. A call that made waiters entitled to a slot returns its
-- reply as {'wake', reply, 's', id, '1', ...} (as prelude.lua's grant_heads has them returned): the caller
-- pushes '1' to each waiter's list, KEYS[5] .. id, with wake_push.lua (naming it in KEYS).
-- A grant at time t is admitted iff fewer than N grants have times in (t - W, t] and fewer
-- than N - that many waiters rank ahead of it; so any two grants N apart in time order are at
-- least W apart, and no half-open interval of length W holds more than N grants. Each call is
-- O(log n): counts and positions by score and rank, at most 64 stale entries removed per
-- call (each grant and waiter is removed once), no scan.
local now, now_us, now_us_str = clock()
local mode = tonumber(ARGV[4])
if mode <= 3 and too_late(ARGV[6], now_us) then return {-3, now_us} end
local meta, grants, queue, timeouts = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id = ARGV[1]
local tkey = 't:' .. id
local m = redis.call('HMGET', meta, 'strategy', 'limit', 'window', 'fence', 'exp', tkey)
local n, w = tonumber(ARGV[2]), tonumber(ARGV[3])
if m[1] then
  if m[1] ~= 'rate' or (n > 0 and (tonumber(m[2]) ~= n or tonumber(m[3]) ~= w)) then
    return redis.error_reply('CONFLICT ' .. meta .. ' records ' .. tostring(m[1]) .. ' ' ..
      tostring(m[2]) .. ' per ' .. tostring(m[3]) .. ' ms; this handle wants rate ' .. n ..
      ' per ' .. w .. ' ms')
  end
  n, w = tonumber(m[2]), tonumber(m[3])
elseif n == 0 then
  return {0, 0, 0, 0, 0, -1, 0, now_us}
end
local wait_lease = tonumber(ARGV[5])
local exp = new_exp(m[5], now + math.max(w, wait_lease))
local e = exp or tonumber(m[5])

local function save(fields)
  if not m[1] then
    for _, v in ipairs({'strategy', 'rate', 'limit', n, 'window', w}) do table.insert(fields, v) end
  end
  if exp then table.insert(fields, 'exp'); table.insert(fields, exp) end
  if #fields > 0 then redis.call('HSET', meta, unpack(fields)) end
  expire_at({meta, grants, queue, timeouts}, e)
end

if mode == 5 then
  if not m[1] then save({}) end
  return {n}
end

-- Reads (any WRONGTYPE fails here, before the first write).
local wus = w * 1000
local edge = string.format('%d', now_us - wus) -- grants at or before edge have lapsed
local card = redis.call('ZCARD', grants)
local live = redis.call('ZCOUNT', grants, '(' .. edge, '+inf')
local rank = redis.call('ZRANK', queue, id) or nil
local nq = redis.call('ZCARD', queue)
local dead = redis.call('ZRANGEBYSCORE', timeouts, '-inf', now, 'LIMIT', 0, 64)

-- ms from `now` until a request at queue rank r is granted: 0 if now. The free slots come
-- first, then the live grants' lapses in time order, then the same again W later for each
-- further N ranks: exact while the waiters ahead claim their turns as they come, a lower
-- bound otherwise. Rounded up to the ms, so that waiting that long is never early.
local function turn_ms(r)
  local free = math.max(0, n - live)
  if r < free then return 0 end
  local round, i = math.floor(r / n), r % n
  local at
  if i < free then
    at = now_us + round * wus
  else
    local k = card - live + i - free -- rank of the (i - free + 1)-th oldest live grant
    at = tonumber(redis.call('ZRANGE', grants, k, k, 'WITHSCORES')[2]) + (round + 1) * wus
  end
  return math.ceil(at / 1000) - now
end

if mode == 4 then
  local waiting = redis.call('ZCOUNT', timeouts, '(' .. now, '+inf')
  local exists = 0
  if m[1] then exists = 1 end
  return {exists, n, w, live, waiting, turn_ms(waiting), tonumber(m[4]) or 0, now_us}
end

-- The same identifier with a grant in the window gets it back (idempotent retry).
if m[6] then
  local g = redis.call('ZSCORE', grants, id)
  if g and tonumber(g) > now_us - wus then
    if rank then
      redis.call('ZREM', queue, id)
      redis.call('ZREM', timeouts, id)
    end
    return {1, tonumber(m[6]), n, now_us, tonumber(g)}
  end
end

-- Wake the waiters that k removals ahead of them made entitled to a slot (ranks
-- n - live - k .. n - live - 1 now), except `id` itself: their wake-ups are returned (out),
-- for the caller to push to their lists.
local wakes = nil
local function wake_entitled(k)
  local last = n - live - 1
  if k == 0 or last < 0 then return end
  for _, v in ipairs(redis.call('ZRANGE', queue, math.max(0, last - k + 1), last)) do
    if v ~= id then
      wakes = wakes or {}
      wakes[#wakes + 1] = 's'; wakes[#wakes + 1] = v; wakes[#wakes + 1] = '1'
    end
  end
end
local function out(r)
  if not wakes then return r end
  return {'wake', r, unpack(wakes)}
end

-- Bounded cleanup: lapsed grants (and their tokens), waiters whose wait lease ran out.
local gone = redis.call('ZRANGEBYSCORE', grants, '-inf', edge, 'LIMIT', 0, 64)
if #gone > 0 then
  forget(meta, {grants}, gone)
  card = card - #gone
end
if #dead > 0 then
  redis.call('ZREM', queue, unpack(dead))
  redis.call('ZREM', timeouts, unpack(dead))
  wake_entitled(#dead)
  rank = redis.call('ZRANK', queue, id) or nil
  nq = redis.call('ZCARD', queue)
end

local fresh = rank == nil
local r = rank or nq
if live + r < n then
  local tok, tok_str = next_token(m[4], now_us, now_us_str)
  redis.call('ZADD', grants, now_us_str, id)
  if not fresh then
    redis.call('ZREM', queue, id)
    redis.call('ZREM', timeouts, id)
  end
  save({'fence', tok_str, tkey, tok_str})
  return out({1, tok, n, now_us, now_us})
end

local t = turn_ms(r)
if mode == 0 then return out({0, t, n, now_us, r}) end
if mode == 3 then
  if not fresh then
    redis.call('ZREM', queue, id)
    redis.call('ZREM', timeouts, id)
    wake_entitled(1)
  end
  return out({0, t, n, now_us, r})
end
-- Queue (or stay queued) under the wait lease; a new waiter's ticket is taken now.
local fields = {}
if fresh then
  local _, tick_str = next_token(m[4], now_us, now_us_str)
  redis.call('ZADD', queue, 'NX', tick_str, id)
  fields = {'fence', tick_str}
end
redis.call('ZADD', timeouts, string.format('%d', now + wait_lease), id)
save(fields)
return out({0, t, n, now_us, r})
