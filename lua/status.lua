-- status: read-only view of a semaphore.
-- KEYS: 1 meta, 2 holders, 3 waiters (basic), 4 owners, 5 timeouts (fair/locked).
-- ARGV: 1 'basic', 'fair', or 'auto' (use the strategy recorded in meta), 2 max entries.
-- Returns {strategy|'', limit, holder count, waiter count, {id, token, ms left, ...},
--          {id, ticket, ms left, ...}, 0 (hold count), exists 0/1}
-- Cost O(listed + expired entries not yet cleaned up), never O(holders): a status must not
-- block the server for long when 100,000 permits are held.
local now = clock()
local meta, max = KEYS[1], tonumber(ARGV[2])
local m = redis.call('HMGET', meta, 'strategy', 'limit', 'fence', 'exp')
local hl, wl = {}, {}
local nh, nw = 0, 0
local kind = ARGV[1]
if kind == 'auto' then
  if m[1] == 'basic' then kind = 'basic' elseif m[1] then kind = 'fair' else kind = 'none' end
end

local function add(list, id, num, left)
  table.insert(list, id); table.insert(list, num); table.insert(list, left)
end

if kind == 'basic' then
  local holders, waiters = KEYS[2], KEYS[3]
  nh = redis.call('ZCOUNT', holders, '(' .. now, '+inf')
  nw = redis.call('ZCOUNT', waiters, '(' .. now, '+inf')
  if max > 0 then
    local h = redis.call('ZRANGEBYSCORE', holders, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, max)
    for i = 1, #h, 2 do
      local tok = redis.call('HGET', meta, 't:' .. h[i])
      add(hl, h[i], tonumber(tok) or 0, tonumber(h[i + 1]) - now)
    end
    local w = redis.call('ZRANGEBYSCORE', waiters, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, max)
    for i = 1, #w, 2 do add(wl, w[i], 0, tonumber(w[i + 1]) - now) end
  end
elseif kind == 'fair' then
  local owners, timeouts = KEYS[4], KEYS[5]
  -- The holders are the members with a token t:<id> in meta: count the t: fields (HLEN minus
  -- the fixed fields present) and subtract the expired ones still waiting for a cleanup.
  local fixed = 0
  for i = 1, 4 do if m[i] then fixed = fixed + 1 end end
  nh = redis.call('HLEN', meta) - fixed
  for _, e in ipairs(redis.call('ZRANGEBYSCORE', timeouts, '-inf', now)) do
    if redis.call('HEXISTS', meta, 't:' .. e) == 1 then nh = nh - 1 end
  end
  nw = redis.call('ZCOUNT', timeouts, '(' .. now, '+inf') - nh
  local want_h, want_w = math.min(max, nh), math.min(max, nw)
  local function done(holders)
    if holders then return #hl / 3 >= want_h end
    return #wl / 3 >= want_w
  end
  -- Walk ranks [from, to) in queue order until the holders (phase 1) or the waiters (phase 2)
  -- are listed. The first `limit` ranks hold the holders (and the waiters already entitled
  -- to a permit, about to claim it); after them every live member is a waiter.
  local function walk(from, to, holders)
    local pos = from
    while pos < to and not done(holders) do
      local last = math.min(pos + 255, to - 1)
      local chunk = redis.call('ZRANGE', owners, pos, last, 'WITHSCORES')
      if #chunk == 0 then break end
      for i = 1, #chunk, 2 do
        local oid = chunk[i]
        local d = tonumber(redis.call('ZSCORE', timeouts, oid))
        if d and d > now then
          local tok = redis.call('HGET', meta, 't:' .. oid)
          if tok and not done(true) then
            add(hl, oid, tonumber(tok), d - now)
          elseif not tok and not done(false) then
            add(wl, oid, tonumber(chunk[i + 1]), d - now)
          end
        end
      end
      pos = last + 1
    end
    return pos
  end
  if max > 0 then
    local limit = tonumber(m[2]) or 0
    local pos = walk(0, limit, true)
    walk(math.max(pos, limit), math.huge, false)
  end
end
local exists = 0
if m[1] then exists = 1 end
return {m[1] or '', tonumber(m[2]) or 0, nh, nw, hl, wl, 0, exists}
