-- book_guard_release: Redis in Action 6.2, release_lock(), the guard of the locked variant
-- (6.3.4) released after the fair acquire: delete it only if it still holds our identifier
-- (the book does GET and DEL under WATCH/MULTI; as a script it is the compare-and-delete of
-- the Redis "Distributed Locks" page). The guard itself is taken with one command,
-- SET guard identifier NX PX lock_timeout, which needs no script.
-- KEYS: 1 the guard (the book's `lock:` + semname).  ARGV: 1 identifier.
-- Returns 1 released, 0 not ours (expired, or taken by another).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
