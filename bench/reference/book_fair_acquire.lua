-- book_fair_acquire: Redis in Action 6.3.2, acquire_fair_semaphore(), step by step, in one
-- script (the book sends the same commands in two MULTI/EXEC pipelines; here they are atomic,
-- as redsem's scripts are, so the comparison is of the algorithm, not of its round trips).
-- KEYS: 1 the timeout set (the book's `semname`: identifier -> the client's time when it
--         acquired), 2 the owner set (`semname:owner`: identifier -> ticket),
--         3 the ticket counter (`semname:counter`).
-- ARGV: 1 identifier (a fresh one per acquire, the book's uuid4), 2 limit,
--       3 now (the CLIENT's clock, seconds, the book's time.time()), 4 timeout (seconds, the
--       book's default 10).
-- Returns the ticket (> 0) if granted, 0 if not (then nothing of this attempt remains).
local id, limit, now, timeout = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
-- drop the holders whose timeout passed
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - timeout)
-- keep in the owner set only the identifiers still in the timeout set: O(holders), on every
-- acquire, and the server does nothing else meanwhile
redis.call('ZINTERSTORE', KEYS[2], 2, KEYS[2], KEYS[1], 'WEIGHTS', 1, 0)
-- draw a ticket, join both sets
local counter = redis.call('INCR', KEYS[3])
redis.call('ZADD', KEYS[1], now, id)
redis.call('ZADD', KEYS[2], counter, id)
-- granted iff fewer than limit owners hold a smaller ticket
if redis.call('ZRANK', KEYS[2], id) < limit then
  return counter
end
-- not granted: leave both sets
redis.call('ZREM', KEYS[1], id)
redis.call('ZREM', KEYS[2], id)
return 0
