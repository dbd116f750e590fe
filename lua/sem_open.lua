-- sem_open: record a new semaphore's strategy and limit, or compare with the recorded ones.
-- KEYS: 1 meta.  ARGV: 1 strategy, 2 limit.
-- Returns {limit}; a CONFLICT error if the server has another strategy or limit.
local now = clock()
local meta = KEYS[1]
local m = redis.call('HMGET', meta, 'strategy', 'limit')
if m[1] then
  if m[1] ~= ARGV[1] or tonumber(m[2]) ~= tonumber(ARGV[2]) then
    return conflict(meta, m, ARGV[1] .. ' with limit ' .. ARGV[2])
  end
  return {tonumber(m[2])}
end
local exp = now + IDLE
redis.call('HSET', meta, 'strategy', ARGV[1], 'limit', ARGV[2], 'exp', exp)
redis.call('PEXPIREAT', meta, exp)
return {tonumber(ARGV[2])}
