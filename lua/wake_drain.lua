-- wake_drain: take the fair wake-ups queued on a client's id list (wake.c's leader, after a
-- round that popped one: the grants of a busy server come faster than one BLPOP each).
-- KEYS: 1 the client's id list ({prefix}wake:<tag>:ids; grant_heads RPUSHes to it).
-- ARGV: 1 at most this many.
-- Returns the ids, oldest first (none: an empty array). Read and trimmed in one script, so
-- that a push in between cannot be lost.
local v = redis.call('LRANGE', KEYS[1], '0', string.format('%d', ARGV[1] - 1))
if #v > 0 then redis.call('LTRIM', KEYS[1], string.format('%d', #v), '-1') end
return v
