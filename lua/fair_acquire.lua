-- fair_acquire: Redis in Action 6.3.2-6.3.3 (fair semaphore), also the body of the locked
-- strategy (6.3.4), plus queued waiters, weights (several permits per request) and direct
-- hand-off to the head of the queue.
-- KEYS: 1 meta (hash: strategy, limit, fence, exp, used, q, t:<id> -> token of each holder,
--       w:<id> -> weight of a holder or waiter of more than one permit)
--       2 owners (zset: the queue, waiter id -> arrival number), 3 timeouts (zset id ->
--       deadline, ms, of holders and waiters), 4 wake-up list prefix (not a key: unused
--       since 0.4.7, kept in its place), 5 guard (locked only)
-- ARGV: 1 id, 2 limit (used if new), 3 lease ms, 4 mode (0 try, 1 wait, 2 again, 3 last),
--       5 wait lease ms, 6 strategy ('fair' or 'locked'), 7 guard token (locked),
--       8 not after (server us; 0: none), 9 weight n (permits wanted, >= 1; absent: 1),
--       10 the client's id list (absent or '': none): a waiter records it as c:<id>, and is
--       then woken by "<id> <KEYS[1]>" pushed there (grant_heads), not on its own list,
--       11 '1': with ARGV[10], the waiter also records its lease (ARGV[3]) as L:<id>, and
--       grant_heads gives it the permit with that lease (a direct grant: the element is then
--       "<id> <KEYS[1]> <token> <server us> <lease>"); absent: it does not (a client that waits for
--       replicas after each grant)
-- meta 'used' is the weight held. A new request is granted iff nobody is queued and
-- used + n <= limit; otherwise it queues at the tail (mode 1) with the next arrival number
-- (meta 'q'). Queued waiters are granted only at the head of the queue, by grant_heads():
-- every script that frees weight or moves the head (release, the cleanup of expired
-- entries, a waiter leaving, set_limit) hands permits to the head while it fits and wakes
-- the waiters it granted (returned with the reply: the caller pushes them). A
-- waiter's attempt finds the permit handed to it (t:<id>) and
-- takes it with the lease of its own handle. Every step is O(log N) per grant.
-- Expired requests are removed by deadline (at most 256 per call) on the paths that wait.
-- Returns '1 token limit now-us' granted; '0 ms-until-the-earliest-deadline (-1 none) limit
-- now-us fence' not granted (one string: cheaper for Redis than a table, see
-- basic_acquire.lua; fence: the last token drawn, '0' none: a direct grant to this waiter
-- later has a greater token, which tells it from an element of an earlier wait);
-- {-2} the locked strategy's guard is not held by the caller;
-- {-3, now us} the request came after its not-after time; {-4, weight, now us} the id holds
-- or waits for another weight; {-5, limit, now us} n exceeds the limit (a queued waiter
-- then leaves the queue). -3, -4 and -5 write nothing else. Where this call granted other
-- waiters (a cleanup, a waiter leaving), the reply comes as {'wake', reply, wake-ups...}
-- (the wake-ups of prelude.lua's grant_heads, which the caller pushes). An error 'PARTIAL
-- ...' when the meta hash has no fence (gone, or re-created by sem_open) while timeouts has
-- live entries (prelude.lua's partly_missing), before anything is written (locked: after
-- the guard's deletion).
-- locked: the guard is checked first and deleted at once (the compare-and-delete that the
-- book runs after the acquire): the script is atomic, so nothing can run between the
-- deletion and the rest of the script, and the caller gets the grant one round trip sooner.
local strategy = ARGV[6]
if strategy == 'locked' then
  if redis.call('GET', KEYS[5]) ~= ARGV[7] then return {-2} end
  redis.call('DEL', KEYS[5])
end
local now, now_us, now_us_str = clock()
if too_late(ARGV[8], now_us, now_us_str) then return {-3, now_us} end
local meta, owners, timeouts = KEYS[1], KEYS[2], KEYS[3]
-- Cheap conversions on the hot path, as in basic_acquire.lua: mode compared as a string,
-- the client's numbers converted by arithmetic, numbers passed to redis.call as strings.
local id, mode = ARGV[1], ARGV[4]
local again = mode == '2' or mode == '3' -- a queued waiter's attempt
local lease, wait_lease = ARGV[3] + 0, ARGV[5] + 0
local n = 1
if ARGV[9] and ARGV[9] ~= '1' then n = tonumber(ARGV[9]) or 1 end
local tkey = 't:' .. id
local list = ARGV[10] ~= '' and ARGV[10] or nil -- the client's id list (nil: none)
local direct = list ~= nil and ARGV[11] == '1'
-- m[9]: this id's L: field (a direct grant's lease), which is only ever left behind by a
-- redsem <= 0.4.4 script (whose grants and cleanups do not know it): removed below where
-- this id is granted, or queued without a direct grant
local m = redis.call('HMGET', meta, 'strategy', 'limit', 'fence', 'exp', tkey, 'used', 'q',
  'w:' .. id, 'L:' .. id)
if m[1] and m[1] ~= strategy then return conflict(meta, m, strategy) end
local limit_str = m[2] or ARGV[2]
local limit = tonumber(limit_str)
local st = {used = tonumber(m[6]) or 0, fence = m[3], now_us = now_us, now_us_str = now_us_str}
local deadline = now + lease
local deadline_str = string.format('%d', deadline)
local exp = new_exp(m[4], now + math.max(lease, wait_lease))
local all = exp and {meta, owners, timeouts} -- only when their expiry moves
if exp then check_types(all, 'hzz') end

-- A semaphore kept by redsem 0.2 (owners ranked holders and waiters by ticket; no 'used' or
-- 'q' in meta) must not be mixed with this layout: refuse until its entries are gone. (Its
-- meta hash holds more than the configuration: its holders' tokens. One that holds only
-- the configuration was re-created by sem_open or set_limit after the keys were partly
-- lost: partly_missing below.)
if m[1] and not m[6] and not m[7] and
    redis.call('ZCARD', owners) + redis.call('ZCARD', timeouts) > 0 and
    redis.call('HLEN', meta) > (m[2] and 2 or 1) + (m[4] and 1 or 0) then
  return redis.error_reply('CONFLICT ' .. meta .. ' is in use by redsem 0.2 clients (fair ' ..
    'queue without weights); let its permits and waiters end first')
end
if not m[3] then
  local e = partly_missing(meta, timeouts, now)
  if e then return e end
end

-- Whether this request is queued (ZSCORE of a missing member is false in Lua). A first
-- attempt looks too when a weight above 1 is asked for or recorded: one that retries a
-- request whose reply was lost must not change the weight its id waits for (-4 below).
local queued = (again or m[8] or n > 1) and redis.call('ZSCORE', owners, id)
local held = 1
if m[8] then held = tonumber(m[8]) or 1 end

local function save_meta(fields)
  if not m[1] then
    table.insert(fields, 'strategy'); table.insert(fields, strategy)
    table.insert(fields, 'limit'); table.insert(fields, limit)
  end
  if exp then
    table.insert(fields, 'exp'); table.insert(fields, exp)
  end
  if #fields > 0 then redis.call('HSET', meta, unpack(fields)) end
  if exp then expire_at(all, exp) end
end

-- grant_heads(), then the keys' expiry as it left it: a direct grant may have moved it
-- (st.exp), past what this request would set (exp) or not
local function grant(self_id, selfw)
  local got = grant_heads(meta, owners, timeouts, limit, st, self_id, selfw)
  if st.exp then
    m[4] = st.exp
    if exp and exp <= st.exp then exp = nil end
  end
  return got
end

-- Leave the queue; if this waiter was its head, the next ones may fit now.
local function leave()
  local head = redis.call('ZRANGE', owners, '0', '0')[1]
  forget(meta, {owners, timeouts}, {id})
  if head == id then grant(nil, 1) end
end

if n > limit then
  if queued then leave() end
  if st.wakes then return {'wake', {-5, limit, now_us}, unpack(st.wakes)} end
  return {-5, limit, now_us}
end
if queued and held ~= n then return {-4, held, now_us} end

-- A holder: the same identifier holding a live permit gets it back, renewed (idempotent
-- retry), and so does a waiter that was handed its permit; a permit of another weight is
-- refused (one id is one permit object). This id's own expired permit, not cleaned up yet,
-- gives its weight back first.
if m[5] then
  local d = redis.call('ZSCORE', timeouts, id)
  if d and tonumber(d) > now then
    if held ~= n then return {-4, held, now_us} end
    redis.call('ZADD', timeouts, deadline_str, id)
    if m[9] then redis.call('HDEL', meta, 'L:' .. id) end
    save_meta({})
    return '1 ' .. m[5] .. ' ' .. limit_str .. ' ' .. now_us_str
  end
  st.used = math.max(0, st.used - held)
  forget(meta, {timeouts}, {id})
  redis.call('HSET', meta, 'used', string.format('%d', st.used))
  redis.call('HINCRBY', meta, 'xp', '1') -- a lease that ran out without a release (metrics)
  grant(nil, 1)
end

-- Remove expired requests: holders give their weight back, waiters leave the queue; then
-- hand what is free to the head. Returns the token if this request got a permit. The
-- earliest deadline is read first: when it is still ahead (the usual case) nothing expired,
-- and it is kept (first_dl) for the reply's ms-until-the-earliest-deadline below, as
-- nothing writes the timeouts between the two: one command instead of two.
local cleaned_up = 0
local first_dl = nil
local function cleanup()
  first_dl = redis.call('ZRANGE', timeouts, '0', '0', 'WITHSCORES')
  if not first_dl[2] or tonumber(first_dl[2]) > now then return nil end
  first_dl = nil
  local gone = redis.call('ZRANGEBYSCORE', timeouts, '-inf', string.format('%d', now), 'LIMIT',
    '0', '256')
  cleaned_up = #gone
  if #gone == 0 then return nil end
  local f = {}
  for i, g in ipairs(gone) do f[2 * i - 1] = 't:' .. g; f[2 * i] = 'w:' .. g end
  local tw = redis.call('HMGET', meta, unpack(f))
  local holders = 0
  for i = 1, #gone do
    if tw[2 * i - 1] then
      st.used = st.used - (tonumber(tw[2 * i]) or 1)
      holders = holders + 1
    end
  end
  if st.used < 0 then st.used = 0 end
  forget(meta, {owners, timeouts}, gone)
  redis.call('HSET', meta, 'used', string.format('%d', st.used))
  -- leases that ran out without a release (metrics; expired waiters are not counted)
  if holders > 0 then redis.call('HINCRBY', meta, 'xp', holders) end
  return grant(id, n)
end

local function granted(tok, tok_str)
  redis.call('ZADD', timeouts, deadline_str, id)
  -- timeouts had no entry (nothing held, nobody queued) and so no expiry: give it one
  if not exp and st.used == n then redis.call('PEXPIREAT', timeouts, m[4]) end
  if tok_str and n == 1 and m[1] and not exp then
    -- the common case: one HSET, no table
    redis.call('HSET', meta, 'fence', tok_str, tkey, tok_str, 'used', string.format('%d', st.used))
  else
    local f = {}
    if tok_str then
      f = {'fence', tok_str, tkey, tok_str, 'used', string.format('%d', st.used)}
      if n > 1 then table.insert(f, 'w:' .. id); table.insert(f, n) end
    end
    save_meta(f)
  end
  if n == 1 and m[8] and not queued then redis.call('HDEL', meta, 'w:' .. id) end
  -- (a grant by grant_heads, tok_str nil, removed it already)
  if m[9] and tok_str then redis.call('HDEL', meta, 'L:' .. id) end
  local r = '1 ' .. (tok_str or string.format('%d', tok)) .. ' ' .. limit_str .. ' ' .. now_us_str
  if st.wakes then return {'wake', r, unpack(st.wakes)} end
  return r
end

local head = false -- whether anybody is queued, as fits_now() last saw
local function fits_now()
  head = redis.call('ZCARD', owners) > 0
  return not head and st.used + n <= limit
end

-- A queued waiter not handed a permit yet: expired entries ahead may be in its way. A
-- waiter whose own entry the cleanup removed (its wait lease ran out before it renewed it)
-- goes on as a new request.
local cleaned = false
if queued then
  local tok = cleanup()
  if tok then return granted(tok, nil) end
  cleaned = true
  queued = redis.call('ZSCORE', owners, id)
end
-- A new request: granted iff nobody waits and its weight fits.
if not queued then
  local ok = fits_now()
  if not ok and not cleaned then
    -- this id may be queued all the same (a wait-mode retry of a request whose reply was
    -- lost): the cleanup may then hand it its permit at the head; take it, do not queue again
    local tok = cleanup()
    if tok then return granted(tok, nil) end
    if cleaned_up > 0 then ok = fits_now() end
  end
  if ok then
    local tok, tok_str = next_token(st.fence, now_us, now_us_str)
    st.used = st.used + n
    return granted(tok, tok_str)
  end
end

local first = first_dl or redis.call('ZRANGE', timeouts, '0', '0', 'WITHSCORES')
local next_ms = -1
if first[2] then next_ms = math.max(0, tonumber(first[2]) - now) end
local function busy()
  local r = '0 ' .. next_ms .. ' ' .. limit_str .. ' ' .. now_us_str .. ' ' .. (st.fence or '0')
  if st.wakes then return {'wake', r, unpack(st.wakes)} end
  return r
end
if mode == '0' then return busy() end
if mode == '3' then
  if queued then leave() end
  return busy()
end
-- Queue (or stay queued) under the wait lease; a new waiter takes the next arrival number.
if not queued then
  local q = string.format('%d', (tonumber(m[7]) or 0) + 1)
  redis.call('ZADD', owners, 'NX', q, id)
  redis.call('ZADD', timeouts, string.format('%d', now + wait_lease), id)
  if not exp and not head then
    -- the first waiter created owners (and timeouts if nobody holds): give them the expiry
    redis.call('PEXPIREAT', owners, m[4])
    if st.used == 0 then redis.call('PEXPIREAT', timeouts, m[4]) end
  end
  local f = {'q', q}
  if n > 1 then table.insert(f, 'w:' .. id); table.insert(f, n) end
  if list then
    table.insert(f, 'c:' .. id); table.insert(f, list)
    if direct then table.insert(f, 'L:' .. id); table.insert(f, ARGV[3]) end
  end
  save_meta(f)
  if n == 1 and m[8] then redis.call('HDEL', meta, 'w:' .. id) end
  if m[9] and not direct then redis.call('HDEL', meta, 'L:' .. id) end
else
  redis.call('ZADD', timeouts, string.format('%d', now + wait_lease), id)
  -- a waiter taken over by another client (the same id: acquire_as) is woken there, with
  -- that client's lease or none (read here, on a queued waiter's renewal, not on every
  -- acquire; its L: field is m[9], read above: a waiter not granted keeps it)
  if list then
    local cur = redis.call('HGET', meta, 'c:' .. id)
    local want = direct and ARGV[3] or false -- as HMGET gives a missing field
    if cur ~= list or m[9] ~= want then
      if not want and m[9] then redis.call('HDEL', meta, 'L:' .. id) end
      local f = {'c:' .. id, list}
      if want then table.insert(f, 'L:' .. id); table.insert(f, want) end
      save_meta(f)
    else
      save_meta({})
    end
  else
    save_meta({})
  end
end
return busy()
