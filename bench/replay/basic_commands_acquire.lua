-- The nine commands of an uncontended basic pair with no Lua logic (bench/script-replay.sh):
-- this half is the acquire's six, with constant arguments of the real ones' sizes.
-- KEYS and ARGV as basic_acquire.lua's.
redis.call('TIME')
redis.call('HMGET', KEYS[1], 'strategy', 'limit', 'fence', 'exp', 't:' .. ARGV[1], 'extra')
redis.call('ZCARD', KEYS[2])
redis.call('ZADD', KEYS[2], '1895632239919', ARGV[1])
redis.call('PEXPIREAT', KEYS[2], '1895632239919')
redis.call('HSET', KEYS[1], 'fence', '1895632239919101', 't:' .. ARGV[1], '1895632239919101')
return '1 1895632239919101 1 1895632239919101'
