-- status: read-only view of a semaphore.
-- KEYS: 1 meta, 2 holders, 3 waiters (basic), 4 owners, 5 timeouts (fair/locked).
-- ARGV: 1 'basic', 'fair', or 'auto' (use the strategy recorded in meta), 2 max entries.
-- Returns {strategy|'', limit, holder count, waiter count, {id, token, ms left, ...},
--          {id, ticket, ms left, ...}, 0 (hold count), exists 0/1, permits in use,
--          {weight of each listed holder}, leases that ran out without a release (meta 'xp',
--          counted by the acquire scripts' clean-up)}
-- Cost O(listed + expired entries not yet cleaned up), never O(holders): a status must not
-- block the server for long when 100,000 permits are held. fair/locked list their holders
-- from the deadline set, which holds the waiters too, reading at most 4 x max + 1024 of it.
local now = clock()
local meta, max = KEYS[1], tonumber(ARGV[2])
local m = redis.call('HMGET', meta, 'strategy', 'limit', 'extra', 'used', 'xp')
local hl, wl, hw = {}, {}, {}
local nh, nw, inuse = 0, 0, 0
local kind = ARGV[1]
if kind == 'auto' then
  if m[1] == 'basic' then kind = 'basic' elseif m[1] then kind = 'fair' else kind = 'none' end
end

local function add(list, id, num, left)
  table.insert(list, id); table.insert(list, num); table.insert(list, left)
end

local function add_holder(id, left)
  local f = redis.call('HMGET', meta, 't:' .. id, 'w:' .. id)
  add(hl, id, tonumber(f[1]) or 0, left)
  table.insert(hw, tonumber(f[2]) or 1)
end

-- The expired entries not cleaned up yet: {id, ...} with their tokens and weights.
local function expired(z)
  local gone = redis.call('ZRANGEBYSCORE', z, '-inf', now)
  local out = {}
  for _, g in ipairs(gone) do
    local f = redis.call('HMGET', meta, 't:' .. g, 'w:' .. g)
    table.insert(out, {held = f[1] ~= false, w = tonumber(f[2]) or 1})
  end
  return out
end

if kind == 'basic' then
  local holders, waiters = KEYS[2], KEYS[3]
  nh = redis.call('ZCOUNT', holders, '(' .. now, '+inf')
  nw = redis.call('ZCOUNT', waiters, '(' .. now, '+inf')
  inuse = nh + (tonumber(m[3]) or 0)
  for _, g in ipairs(expired(holders)) do inuse = inuse - (g.w - 1) end
  if max > 0 then
    local h = redis.call('ZRANGEBYSCORE', holders, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, max)
    for i = 1, #h, 2 do add_holder(h[i], tonumber(h[i + 1]) - now) end
    local w = redis.call('ZRANGEBYSCORE', waiters, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, max)
    for i = 1, #w, 2 do add(wl, w[i], 0, tonumber(w[i + 1]) - now) end
  end
elseif kind == 'fair' then
  local owners, timeouts = KEYS[4], KEYS[5]
  -- timeouts holds holders and waiters, owners (the queue) the waiters only.
  local nq = redis.call('ZCARD', owners)
  nh = redis.call('ZCARD', timeouts) - nq
  nw = nq
  inuse = tonumber(m[4]) or 0
  for _, g in ipairs(expired(timeouts)) do
    if g.held then nh = nh - 1; inuse = inuse - g.w else nw = nw - 1 end
  end
  if max > 0 then
    -- holders by deadline: walk the deadline set by rank past the expired entries, reading
    -- at most 4 x max + 1024 entries (waiters share the set: with very many of them, fewer
    -- holders than max may be listed; the counts stay exact)
    local r = redis.call('ZCOUNT', timeouts, '-inf', now)
    local budget = r + 4 * max + 1024
    while #hw < math.min(max, nh) and r < budget do
      local chunk = redis.call('ZRANGE', timeouts, r, r + 255, 'WITHSCORES')
      if #chunk == 0 then break end
      for i = 1, #chunk, 2 do
        if #hw < max and redis.call('HEXISTS', meta, 't:' .. chunk[i]) == 1 then
          add_holder(chunk[i], tonumber(chunk[i + 1]) - now)
        end
      end
      r = r + 256
    end
    -- waiters in queue order, with their end position in the weighted queue
    local pos = 0
    while #wl / 3 < math.min(max, nw) do
      local chunk = redis.call('ZRANGE', owners, pos, pos + 255, 'WITHSCORES')
      if #chunk == 0 then break end
      for i = 1, #chunk, 2 do
        local d = tonumber(redis.call('ZSCORE', timeouts, chunk[i]))
        if d and d > now and #wl / 3 < max then add(wl, chunk[i], tonumber(chunk[i + 1]), d - now) end
      end
      pos = pos + 256
    end
  end
end
local exists = 0
if m[1] then exists = 1 end
return {m[1] or '', tonumber(m[2]) or 0, nh, nw, hl, wl, 0, exists, math.max(0, inuse), hw,
  tonumber(m[5]) or 0}
