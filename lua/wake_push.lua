-- wake_push: push the wake-ups another script returned ({'wake', reply, kind, target,
-- element, ...}: prelude.lua's grant_heads, rate.lua's wake_entitled) to the
-- waiters' lists, which that script could not name in its KEYS (src/wake.c,
-- redsem__wake_push, forms and checks the names).
-- KEYS: for wake-up i: 2i-1 its list, 2i the list's bell (kind 'i'; kind 's': the list
--       again).
-- ARGV: for wake-up i: 2i-1 its kind: 'i' the element goes to a client's id list (RPUSH:
--       oldest first) and, when that push made the list non-empty, to its bell, which the
--       client's BLPOP watches; 's' '1' goes to a waiter's own list (LPUSH); 2i the element.
-- Each push is a redis.pcall: a foreign key of another type there, or an ACL that refuses
-- one list, loses that wake-up only (its waiter finds its grant by its poll), not the
-- others. Returns the number of wake-ups pushed.
local pushed = 0
for i = 1, #ARGV / 2 do
  local list, bell = KEYS[2 * i - 1], KEYS[2 * i]
  local e = ARGV[2 * i]
  if ARGV[2 * i - 1] == 'i' then
    local n = redis.pcall('RPUSH', list, e)
    if type(n) == 'number' then
      pushed = pushed + 1
      if n == 1 then
        redis.call('PEXPIRE', list, IDLE_STR)
        if redis.pcall('RPUSH', bell, e) == 1 then redis.call('PEXPIRE', bell, IDLE_STR) end
      end
    end
  elseif type(redis.pcall('LPUSH', list, '1')) == 'number' then
    pushed = pushed + 1
    redis.call('PEXPIRE', list, IDLE_STR)
  end
end
return pushed
