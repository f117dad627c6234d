-- leave.lua: a waiter stops waiting (its time ran out, or it failed).
-- ARGV: [1] flag [2] 'claim' (take a grant that reached us meanwhile) or 'pass' (hand it on)
-- Returns {'left'} | {'granted', token, now_ms, pttl} | {'passed', next flag or ''}
local flag, mode = ARGV[1], ARGV[2]
local bad = foreign_key()
if bad then return redis.error_reply(bad) end
local now = now_ms()
redis.call('ZREM', k.queue, flag)
redis.call('HDEL', k.waiters, flag)
redis.call('DEL', wake_key(flag))
if redis.call('HGET', k.lock, 'owner') == flag then
  if mode == 'claim' then
    redis.call('HSET', k.lock, 'count', 1)
    return { 'granted', tonumber(redis.call('HGET', k.lock, 'token')), now, lock_pttl() }
  end
  redis.call('DEL', k.lock)
  return { 'passed', grant_next(now) or '' }
end
return { 'left' }
