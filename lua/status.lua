-- status: read-only view of a semaphore.
-- KEYS: 1 meta, 2 holders, 3 waiters (basic), 4 owners, 5 timeouts (fair/locked).
-- ARGV: 1 'basic', 'fair', or 'auto' (use the strategy recorded in meta), 2 max entries.
-- Returns {strategy|'', limit, holder count, waiter count, {id, token, ms left, ...},
--          {id, ticket, ms left, ...}, 0 (hold count), exists 0/1}
local now = clock()
local meta, max = KEYS[1], tonumber(ARGV[2])
local m = redis.call('HMGET', meta, 'strategy', 'limit')
local hl, wl = {}, {}
local nh, nw = 0, 0
local kind = ARGV[1]
if kind == 'auto' then
  if m[1] == 'basic' then kind = 'basic' elseif m[1] then kind = 'fair' else kind = 'none' end
end
if kind == 'none' then
  -- nothing recorded: report an empty, non-existent semaphore
elseif kind == 'basic' then
  local holders, waiters = KEYS[2], KEYS[3]
  nh = redis.call('ZCOUNT', holders, '(' .. now, '+inf')
  nw = redis.call('ZCOUNT', waiters, '(' .. now, '+inf')
  if max > 0 then
    local h = redis.call('ZRANGEBYSCORE', holders, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, max)
    for i = 1, #h, 2 do
      local tok = redis.call('HGET', meta, 't:' .. h[i])
      table.insert(hl, h[i]); table.insert(hl, tonumber(tok) or 0)
      table.insert(hl, tonumber(h[i + 1]) - now)
    end
    local w = redis.call('ZRANGEBYSCORE', waiters, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, max)
    for i = 1, #w, 2 do
      table.insert(wl, w[i]); table.insert(wl, 0); table.insert(wl, tonumber(w[i + 1]) - now)
    end
  end
else
  local owners, timeouts = KEYS[4], KEYS[5]
  -- holders are the members with a token; every other live member is a queued waiter
  local all = redis.call('HGETALL', meta)
  local tokens = {}
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 2) == 't:' then
      local hid = string.sub(all[i], 3)
      local d = redis.call('ZSCORE', timeouts, hid)
      if d and tonumber(d) > now then
        tokens[hid] = tonumber(all[i + 1])
        nh = nh + 1
      end
    end
  end
  nw = redis.call('ZCOUNT', timeouts, '(' .. now, '+inf') - nh
  local start = 0
  while max > 0 and (#hl / 3 < math.min(max, nh) or #wl / 3 < math.min(max, nw)) do
    local chunk = redis.call('ZRANGE', owners, start, start + 255, 'WITHSCORES')
    if #chunk == 0 then break end
    for i = 1, #chunk, 2 do
      local oid = chunk[i]
      local d = tonumber(redis.call('ZSCORE', timeouts, oid))
      if d and d > now then
        if tokens[oid] then
          if #hl / 3 < max then
            table.insert(hl, oid); table.insert(hl, tokens[oid]); table.insert(hl, d - now)
          end
        elseif #wl / 3 < max then
          table.insert(wl, oid); table.insert(wl, tonumber(chunk[i + 1])); table.insert(wl, d - now)
        end
      end
    end
    start = start + 256
  end
end
local exists = 0
if m[1] then exists = 1 end
return {m[1] or '', tonumber(m[2]) or 0, nh, nw, hl, wl, 0, exists}
