-- wake_drain: take the fair wake-ups queued on a client's id list (wake.c's leader, after
-- popping the list's bell, after a drain that came back full, and after a BLPOP on the bell
-- whose connection was dropped).
-- KEYS: 1 the client's id list ({prefix}wake:<tag>:ids; grant_heads RPUSHes "<id> <meta>"
-- to it, and the same to its bell when it was empty).
-- ARGV: 1 at most this many.
-- Returns the elements, oldest first (none: an empty array). Read and trimmed in one script,
-- so that a push in between cannot be lost.
local v = redis.call('LRANGE', KEYS[1], '0', string.format('%d', ARGV[1] - 1))
if #v > 0 then redis.call('LTRIM', KEYS[1], string.format('%d', #v), '-1') end
return v
