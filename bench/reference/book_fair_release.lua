-- book_fair_release: Redis in Action 6.3.2, release_fair_semaphore(): remove the identifier
-- from both sets (the book's MULTI/EXEC pipeline, as one script).
-- KEYS: 1 the timeout set, 2 the owner set.  ARGV: 1 identifier.
-- Returns 1 if it was still in the timeout set (the permit was held), 0 if it had expired.
local held = redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return held
