-- lock_status: read-only. KEYS: 1 mutex, 2 lock meta, 3 waiters. ARGV: 1 max entries.
-- Returns the status shape of status.lua with strategy '' and limit 1.
local now = clock()
local owner = redis.call('GET', KEYS[1])
local m = redis.call('HMGET', KEYS[2], 'cur', 'n')
local hl, wl = {}, {}
local nh, holds = 0, 0
if owner then
  nh = 1
  holds = tonumber(m[2]) or 1
  if tonumber(ARGV[1]) > 0 then
    hl = {owner, tonumber(m[1]) or 0, redis.call('PTTL', KEYS[1])}
  end
end
local nw = redis.call('ZCOUNT', KEYS[3], '(' .. now, '+inf')
if tonumber(ARGV[1]) > 0 then
  local w = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0,
    tonumber(ARGV[1]))
  for i = 1, #w, 2 do
    table.insert(wl, w[i]); table.insert(wl, 0); table.insert(wl, tonumber(w[i + 1]) - now)
  end
end
local exists = 1
if not owner and not m[1] then exists = 0 end
return {'', 1, nh, nw, hl, wl, holds, exists}
