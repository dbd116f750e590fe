-- guard_acquire: take the locked strategy's guard lock, SET guard token NX PX lease (Redis in
-- Action 6.3.4, the short-lived lock around the fair acquire).
-- KEYS: 1 guard.  ARGV: 1 token, 2 lease ms.
-- Returns 1 taken, 0 held by someone else. A foreign key of another type at the guard's
-- name fails with WRONGTYPE (SET NX alone would just report it busy, forever) in the same
-- round trip.
-- The guard already held under the caller's own token is the caller's: the reply to an
-- earlier guard_acquire of the same attempt was lost (a killed connection, a restart) after
-- the server had applied it. It is taken again, with a fresh lease; "busy" would leave the
-- caller waiting for its own guard to expire, and a waiter leaving the queue after a lost
-- connection could not leave (its entry then withheld a handed-over permit until its wait
-- lease ended). The token is the holder id, which only one acquire uses at a time.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
