-- holder: is `id` a live holder? (read-only; used to adopt a permit by its identifier)
-- KEYS: 1 meta (semaphore meta, or the lock's mutex key), 2 deadline zset (unused for a
--       lock), 3 lock meta (lock only).
-- ARGV: 1 id, 2 'sem' or 'lock'.
-- Returns {1, token, ms left, weight (permits; 1 for a lock)} or {-1}.
local now = clock()
local id = ARGV[1]
if ARGV[2] == 'lock' then
  if redis.call('GET', KEYS[1]) ~= id then return {-1} end
  local cur = redis.call('HGET', KEYS[3], 'cur')
  return {1, tonumber(cur) or 0, redis.call('PTTL', KEYS[1])}
end
local tok = redis.call('HGET', KEYS[1], 't:' .. id)
local d = redis.call('ZSCORE', KEYS[2], id)
if not tok or not d or tonumber(d) <= now then return {-1} end
local w = tonumber(redis.call('HGET', KEYS[1], 'w:' .. id)) or 1
return {1, tonumber(tok), tonumber(d) - now, w}
