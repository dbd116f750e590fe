-- lock_acquire: SET key token NX PX lease (Redis "Distributed Locks", single instance), plus
-- a fencing token drawn on success, reentrancy for the same owner, and waiter registration.
-- KEYS: 1 mutex (string: owner token), 2 lock meta (hash: fence, cur = token of the current
--       grant, n = reentrant hold count), 3 waiters (zset token -> wait deadline), 4 signal
-- ARGV: 1 token, 2 lease ms, 3 mode (0 try, 1 wait, 2 again, 3 last), 4 wait lease ms,
--       5 reentrant ('1' or '0'), 6 not after (server us; 0: none)
-- Returns '1 fencing-token hold-count now-us' granted, '0 ms-the-current-lease-has-left 1
-- now-us' (one string: Redis turns a table into a reply at several times the cost), or
-- {-3, now us}: the request came after its not-after time.
local now, now_us, now_us_str = clock()
if ARGV[6] ~= '0' and too_late(ARGV[6], now_us, now_us_str) then return {-3, now_us} end
local mutex, lmeta, waiters, signal = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
-- The lease goes to redis.call as the client's own digits and the mode is compared as a
-- string: a Lua number is formatted with %.17g, and tonumber() is a global call.
local token, lease, mode = ARGV[1], ARGV[2], ARGV[3]
local again = mode == '2' or mode == '3' -- a registered waiter's attempt
local m = redis.call('HMGET', lmeta, 'fence', 'cur', 'n', 'exp')
-- The meta hash outlives every lease by IDLE/2 at least: it records its own expiry (exp) and
-- is given a new one only when that runs short, not on every grant.
local exp = new_exp(m[4], now + lease)
if redis.call('SET', mutex, token, 'NX', 'PX', lease) then
  local f, f_str = next_token(m[1], now_us, now_us_str)
  if exp then
    redis.call('HSET', lmeta, 'fence', f_str, 'cur', f_str, 'n', '1', 'exp', exp)
    redis.call('PEXPIREAT', lmeta, exp)
  else
    redis.call('HSET', lmeta, 'fence', f_str, 'cur', f_str, 'n', '1')
  end
  if again then redis.call('ZREM', waiters, token) end
  return '1 ' .. f_str .. ' 1 ' .. now_us_str
end
if redis.call('GET', mutex) == token then
  -- the same owner: reentrant acquire, or an idempotent retry of a lost reply
  local n = tonumber(m[3]) or 1
  redis.call('PEXPIRE', mutex, lease)
  if exp then
    redis.call('HSET', lmeta, 'exp', exp)
    redis.call('PEXPIREAT', lmeta, exp)
  end
  if ARGV[5] == '1' then n = redis.call('HINCRBY', lmeta, 'n', 1) end
  if again then redis.call('ZREM', waiters, token) end
  return '1 ' .. (m[2] or '0') .. ' ' .. n .. ' ' .. now_us_str
end
-- PTTL counts from the current ms; the key is gone only once the clock passes its expiry
-- ms, up to 1 ms later: report the time until then, like the semaphores' deadlines.
local left = redis.call('PTTL', mutex)
if left >= 0 then left = left + 1 end
if mode == '1' or mode == '2' then
  -- A read first: a foreign key of another type at the wake-up list fails with WRONGTYPE
  -- before any write (and the first write stays ZADD, refused when out of memory).
  redis.call('LLEN', signal)
  local wd = now + ARGV[4]
  redis.call('ZADD', waiters, string.format('%d', wd), token)
  redis.call('ZREMRANGEBYSCORE', waiters, '-inf', now)
  redis.call('PEXPIREAT', waiters, wd + IDLE)
  redis.call('DEL', signal) -- a pending wake-up is stale: the lock is held
elseif mode == '3' then
  redis.call('ZREM', waiters, token)
end
return '0 ' .. left .. ' 1 ' .. now_us_str
