-- The release's three commands of an uncontended basic pair, no Lua logic (see
-- basic_commands_acquire.lua). KEYS and ARGV as basic_release.lua's.
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[1], 't:' .. ARGV[1], 'w:' .. ARGV[1])
redis.call('ZCARD', KEYS[3])
return 1
