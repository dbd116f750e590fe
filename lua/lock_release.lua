-- lock_release: compare-and-delete (Redis "Distributed Locks"); a reentrant hold is
-- decremented and the key deleted at zero. Wakes one registered waiter when freed.
-- KEYS: 1 mutex, 2 lock meta, 3 waiters, 4 signal.  ARGV: 1 token, 2 reentrant ('1'/'0').
-- Returns 1 (released, or one reentrant hold of it) or -1 (not held by this token: nothing is
-- touched).
local mutex, lmeta = KEYS[1], KEYS[2]
if redis.call('GET', mutex) ~= ARGV[1] then return -1 end
if ARGV[2] == '1' then
  local n = tonumber(redis.call('HGET', lmeta, 'n')) or 1
  if n > 1 then
    redis.call('HDEL', lmeta, 'none') -- a first write that is not DENYOOM (see refresh.lua)
    redis.call('HINCRBY', lmeta, 'n', -1)
    return 1
  end
end
-- The hold count 'n' is left in place: it is read only while the mutex is held, and the next
-- grant sets it to 1 (one write less per release).
redis.call('DEL', mutex)
-- Nobody registered as a waiter (the uncontended case): nothing more to do.
local nw = redis.call('ZCARD', KEYS[3])
if nw > 0 then wake_one(KEYS[3], KEYS[4], 1, nw) end
return 1
