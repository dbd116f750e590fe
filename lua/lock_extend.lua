-- lock_extend: compare-and-pexpire. KEYS: 1 mutex, 2 lock meta. ARGV: 1 token, 2 lease ms,
-- 3 minimum ms the lease must still have (see refresh.lua).
-- Returns 1 extended, -1 not held by this token or too late (nothing is touched).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
if redis.call('PTTL', KEYS[1]) < math.max(1, tonumber(ARGV[3])) then return -1 end
redis.call('HLEN', KEYS[2]) -- a foreign key of another type: WRONGTYPE, before any write
redis.call('PEXPIRE', KEYS[1], ARGV[2])
-- The meta hash records its expiry and lock_acquire.lua trusts that record: lengthen, never
-- shorten (a grant with a longer lease may have recorded a later one).
local keep = tonumber(ARGV[2]) + IDLE
if redis.call('PTTL', KEYS[2]) < keep then redis.call('PEXPIRE', KEYS[2], keep) end
return 1
