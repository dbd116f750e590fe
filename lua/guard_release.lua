-- guard_release: the classic compare-and-delete of the locked strategy's guard lock.
-- KEYS: 1 guard.  ARGV: 1 token.  Returns 1 deleted, 0 not ours.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
