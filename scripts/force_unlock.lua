-- force_unlock.lua: release the lock whoever holds it (operators, stuck jobs); wakes the next waiter.
-- Returns {previous owner or '', next waiter flag or ''}
local bad = foreign_key()
if bad then return redis.error_reply(bad) end
local now = now_ms()
local owner = redis.call('HGET', k.lock, 'owner')
if not owner then
  -- a free lock with waiters (stranded) is repaired too
  if redis.call('EXISTS', k.queue) == 1 then return { '', grant_next(now) or '' } end
  return { '', '' }
end
redis.call('DEL', k.lock)
redis.call('DEL', wake_key(owner))
redis.call('HDEL', k.waiters, owner)
return { owner, grant_next(now) or '' }
