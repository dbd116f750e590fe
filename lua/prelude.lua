-- redsem prelude: prepended to every script by tools/embed-lua.c at build time.
-- Conventions of all scripts:
--   * time comes only from the server: clock() reads TIME (allowed in scripts since Redis 5,
--     which replicate effects, not scripts);
--   * every key a script reads or writes is passed in KEYS, and no key name is formed here
--     (tests/check-lua-keys.c checks it): the wake-ups of waiters whose lists a script cannot
--     know in advance (a fair waiter's own list, a client's id list and its bell) are
--     returned to the caller, which pushes them with wake_push.lua, naming those lists in
--     KEYS (see grant_heads);
--   * numbers passed to redis.call are formatted by Redis with %.17g, exactly but slowly:
--     on hot paths pass strings (string.format('%d', n) takes the integer path, or the
--     digits of TIME itself);
--   * reads that can fail (WRONGTYPE) come before the first write of each path, so an error
--     leaves nothing half-done;
--   * the keys of a semaphore share an absolute expiry `exp` (server ms, recorded in the meta
--     hash) kept at least IDLE/2 beyond the latest deadline, so an abandoned semaphore
--     disappears by itself.
local IDLE = 60000
local IDLE_STR = '60000' -- as redis.call arguments: a Lua number is formatted with %.17g

-- Each helper below starts with a line "-- @fn NAME"; tools/embed-lua.c copies a helper
-- into a script only if the script (or a helper it uses) calls it, so that no script pays
-- for creating closures it never calls.

-- @fn clock
-- Server time: ms (number), us (number), and us as a string taken from TIME's own digits.
-- Each of TIME's two strings is converted once, by arithmetic (a global tonumber() call costs
-- a table look-up and a function call on top of the conversion).
local function clock()
  local t = redis.call('TIME')
  local s, u = t[1], t[2]
  local un = u + 0
  local ms = s * 1000 + (un - un % 1000) / 1000
  if #u < 6 then u = string.rep('0', 6 - #u) .. u end
  return ms, ms * 1000 + un % 1000, s .. u
end

-- @fn too_late
-- An acquire carries the latest server time (us) at which it may still run: the client's
-- command timeout, translated to the server's clock. A request that a stalled server only
-- executes later (the client gave up on it and reported an unknown outcome) must not grant.
-- Digits of the same length compare as numbers: no tonumber (glibc's strtod costs about as
-- much as a redis.call) when now_us_str is given.
local function too_late(not_after, now_us, now_us_str)
  if not_after == '0' then return false end
  if now_us_str and #not_after == #now_us_str then return now_us_str > not_after end
  local na = tonumber(not_after) or 0
  return na > 0 and now_us > na
end

-- @fn next_token
-- Fencing tokens and tickets: max(last + 1, server clock in microseconds). Strictly
-- increasing per semaphore, and still increasing after the counter's key expired or the
-- server restarted without persistence (unless the server clock stepped back). Exact in a
-- Lua double until the year 2255. Returned as a number and as a decimal string (usually
-- the clock's own digits: formatting numbers costs more than the Redis call around them).
local function next_token(last, now_us, now_us_str)
  -- Usually the clock is ahead: same-length digits compare as numbers, without tonumber.
  if not last or (#last == #now_us_str and last < now_us_str) then
    return now_us, now_us_str
  end
  local n = (tonumber(last) or 0) + 1
  if n < now_us then return now_us, now_us_str end
  return n, string.format('%d', n)
end

-- @fn conflict
local function conflict(meta_key, m, want)
  return redis.error_reply('CONFLICT ' .. meta_key .. ' records strategy ' .. tostring(m[1]) ..
    ' with limit ' .. tostring(m[2]) .. '; this handle wants ' .. want)
end

-- @fn partly_missing
-- The meta hash has no fence (it is gone, or was re-created by sem_open or set_limit, which
-- record only the strategy and limit: every grant records a fence) while the deadline set `z`
-- (basic: holders; fair, locked: timeouts) still has live entries: the keys were partly lost
-- (a maxmemory policy other than noeviction evicts keys one at a time; a user deleted one).
-- Starting afresh would forget the permits the meta hash counted (used, extra) and grant
-- past the limit: an error instead, which the client reports as it is, until those entries
-- end (their leases or wait leases). nil when the keys are whole. Called only when the fence
-- is missing (a semaphore's first grant), so the usual path pays nothing.
local function partly_missing(meta, z, now)
  local live = redis.call('ZCOUNT', z, '(' .. string.format('%d', now), '+inf')
  if live == 0 then return nil end
  return redis.error_reply('PARTIAL semaphore keys partly missing (evicted?): ' .. meta ..
    ' was lost while ' .. z .. ' has ' .. live .. ' live entries; redsem needs ' ..
    'maxmemory-policy noeviction. Refused until they end')
end

-- @fn new_exp
-- New expiry for a semaphore's keys if `need` (an absolute deadline) is not covered yet.
local function new_exp(exp, need)
  exp = tonumber(exp) or 0
  if exp < need + IDLE / 2 then return need + IDLE end
  return nil
end

-- @fn check_types
-- Before writing keys that this path has not read: one O(1) read of each (HLEN, ZCARD or
-- LLEN, as `kinds` says with one letter h, z or l per key) makes a foreign key of another
-- type fail the script with Redis' WRONGTYPE before anything is written; never PEXPIREAT a
-- key that is not ours. A key that does not exist passes.
local function check_types(keys, kinds)
  for i, k in ipairs(keys) do
    local t = string.sub(kinds, i, i)
    if t == 'h' then redis.call('HLEN', k)
    elseif t == 'z' then redis.call('ZCARD', k)
    elseif t == 'l' then redis.call('LLEN', k) end
  end
end

-- @fn expire_at
local function expire_at(keys, exp)
  for _, k in ipairs(keys) do redis.call('PEXPIREAT', k, exp) end
end

-- @fn forget
-- Remove ids from sorted sets and their tokens (t:), weights (w:) and fair waiters' wake
-- id lists and leases (c:, L:, see grant_heads) from the meta hash.
local function forget(meta, zsets, ids)
  for _, z in ipairs(zsets) do redis.call('ZREM', z, unpack(ids)) end
  local f = {}
  for _, g in ipairs(ids) do
    table.insert(f, 't:' .. g); table.insert(f, 'w:' .. g); table.insert(f, 'c:' .. g)
    table.insert(f, 'L:' .. g)
  end
  redis.call('HDEL', meta, unpack(f))
end

-- @fn weights_of
-- Weighted acquire: the number of permits each of `ids` holds or waits for. A weight above
-- 1 is kept in the meta hash as w:<id>; an id without one has weight 1. One HMGET.
local function weights_of(meta, ids)
  local f = {}
  for i, g in ipairs(ids) do f[i] = 'w:' .. g end
  local w = redis.call('HMGET', meta, unpack(f))
  for i = 1, #ids do w[i] = tonumber(w[i]) or 1 end
  return w
end

-- @fn grant_heads
-- Fair and locked: hand permits to the head of the queue (owners: waiter id -> arrival
-- number) while its weight fits: used + its weight <= limit. Strict FIFO with weights: only
-- the head is ever considered, so a large request at the head is never overtaken, and a
-- permit is granted (its token drawn) the moment it becomes free, in queue order. st: {used,
-- fence, now_us, now_us_str}, updated (now_us may be nil: the server's clock is then read
-- here, only if a permit is granted). `self`, `selfw`: the caller's own id and weight (not
-- woken; its token is returned). `timeouts`: the deadline zset. Cost per grant O(log N):
-- ZRANGE of the head, HMGET of its weight, wake-up list, lease and the keys' expiry, ZREM,
-- HSET, then ZSCORE, ZADD (+ HSET and 3 PEXPIREAT when the expiry moves) for a direct grant,
-- HDEL of its c: and L: fields.
-- The wake-up goes to a list named by data (the waiter's id, or the id list its client
-- recorded), and a script may only touch the keys it was given: pushed here only when it is
-- the caller's own id list, `own` (a declared key, with its bell `own_bell`: the caller's
-- client; nil in a cluster), as wake_push.lua pushes; otherwise appended to st.wakes, which
-- the script returns to its caller with its reply as {'wake', reply, kind, target, element,
-- ...} (inline in each script: a helper would be a closure made on every run), and the
-- caller pushes it with wake_push.lua, naming the list in KEYS
-- (src/wake.c, redsem__wake_push; docs/design.md section 2). Two kinds:
-- 'i' target = the client's id list recorded by the waiter (c:<id>, fair_acquire.lua's
--   ARGV[10]; redsem >= 0.4.3 on one server, not a cluster): "<id> <meta key>" is pushed
--   there (RPUSH: oldest first), one list per client for all its fair waiters, which the
--   client drains (wake.c, wake_drain.lua), and to the list's bell when the push made the
--   list non-empty; the caller checks the name is an id list of its own prefix;
-- 's' target = the waiter's id: any other waiter (a cluster client's, or redsem <= 0.4.2's)
--   is woken on its own list, KEYS[4] .. id, which carries the semaphore's hash tag.
-- The element, and the lease (a direct grant, since 0.4.5): a waiter that also recorded its
-- lease (L:<id>, fair_acquire.lua's ARGV[11]: a client that waits for no replicas) is given
-- the permit with that lease here, its deadline in timeouts set to now + lease, and its
-- element is "<id> <meta key> <token> <server us now> <lease>": the client takes the permit
-- from it without another attempt (wake.c, acquire.c); its validity counts from the grant's
-- server time, so a wake-up pushed a round trip later shortens nothing. The keys' expiry is
-- moved if it does not cover the new deadline by IDLE/2 (st.exp: the expiry set here). Only
-- while the waiter's wait lease still runs (a waiter whose entry expired, not yet cleaned up,
-- gets no fresh lease), and only for a lease of 1..2592000000 ms in digits (L: is data: a
-- field planted by another user must not make a write fail after others); otherwise, and
-- for a waiter without L:, the permit keeps the deadline the wait lease gave it, the element
-- is "<id> <meta key>" (the meta key tells apart one id's waits on two semaphores), and the
-- waiter's next attempt takes it with its lease: the same path as an idempotent retry.
local function grant_heads(meta, owners, timeouts, limit, st, self, selfw, own, own_bell)
  local got = nil
  while st.used < limit do
    local h = redis.call('ZRANGE', owners, '0', '0')[1]
    if not h then break end
    local hw, list, lease, exp = selfw, nil, nil, nil
    if h ~= self then
      local f = redis.call('HMGET', meta, 'w:' .. h, 'c:' .. h, 'L:' .. h, 'exp')
      hw, list, lease, exp = tonumber(f[1]) or 1, f[2], f[3], f[4]
    end
    if st.used + hw > limit then break end
    if not st.now_us then
      local _, us, us_str = clock()
      st.now_us, st.now_us_str = us, us_str
    end
    local tok, tok_str = next_token(st.fence, st.now_us, st.now_us_str)
    st.fence = tok_str
    st.used = st.used + hw
    redis.call('ZREM', owners, h)
    redis.call('HSET', meta, 't:' .. h, tok_str, 'fence', tok_str, 'used',
      string.format('%d', st.used))
    local direct = false
    local lease_ms = lease and #lease >= 1 and #lease <= 10 and not string.find(lease, '%D') and lease + 0
    if list and lease_ms and lease_ms >= 1 and lease_ms <= 2592000000 then
      local now_ms = (st.now_us - st.now_us % 1000) / 1000
      local until_ms = now_ms + lease_ms
      local d = tonumber(redis.call('ZSCORE', timeouts, h))
      if d and d > now_ms then
        redis.call('ZADD', timeouts, string.format('%d', until_ms), h)
        direct = true
        -- the keys' expiry covers every deadline by IDLE/2 (their types were read above)
        local e = new_exp(st.exp or exp, until_ms)
        if e then
          st.exp = e
          redis.call('HSET', meta, 'exp', string.format('%d', e))
          expire_at({meta, owners, timeouts}, e)
        end
      end
    end
    -- a waiter's id list is forgotten when it is granted (so that a release, every pair's
    -- cost, need not); the caller's own: it may have one
    if lease or h == self then
      redis.call('HDEL', meta, 'c:' .. h, 'L:' .. h)
    elseif list then
      redis.call('HDEL', meta, 'c:' .. h)
    end
    if h == self then
      got = tok
    else
      local e = '1'
      if list then
        e = h .. ' ' .. meta
        if direct then e = e .. ' ' .. tok_str .. ' ' .. st.now_us_str .. ' ' .. lease end
      end
      if list and list == own then
        -- pcall: a foreign key of another type there, or an ACL that does not cover it,
        -- loses this wake-up only (its waiter's poll finds the grant)
        if redis.pcall('RPUSH', own, e) == 1 then
          redis.call('PEXPIRE', own, IDLE_STR)
          if redis.pcall('RPUSH', own_bell, e) == 1 then
            redis.call('PEXPIRE', own_bell, IDLE_STR)
          end
        end
      else
        local w = st.wakes or {}
        st.wakes = w
        w[#w + 1] = list and 'i' or 's'; w[#w + 1] = list or h; w[#w + 1] = e
      end
    end
  end
  return got
end

-- @fn wake_one
-- Basic and lock: wake `k` (default 1) registered waiters, keeping at most one pending
-- wake-up per registered waiter. `nw`: the ZCARD of waiters if the caller read it already.
local function wake_one(waiters, signal, k, nw)
  nw = nw or redis.call('ZCARD', waiters)
  if nw == 0 then return end
  local push = math.min(k or 1, nw - redis.call('LLEN', signal))
  for _ = 1, push do redis.call('LPUSH', signal, '1') end
  if push > 0 then redis.call('PEXPIRE', signal, IDLE_STR) end
end
