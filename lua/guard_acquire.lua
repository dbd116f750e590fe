-- guard_acquire: take the locked strategy's guard lock, SET guard token NX PX lease (Redis in
-- Action 6.3.4, the short-lived lock around the fair acquire).
-- KEYS: 1 guard.  ARGV: 1 token, 2 lease ms.
-- Returns 1 taken, 0 held by someone else. A foreign key of another type at the guard's
-- name fails with WRONGTYPE (SET NX alone would just report it busy, forever) in the same
-- round trip.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
redis.call('GET', KEYS[1])
return 0
