-- force_unlock.lua: an operator releases a named hold (owner and token, as status shows them)
-- and the lock goes to the next waiter.
-- ARGV: [3] owner [4] token
-- Returns {'released', next owner or ''} | {'not_held', current owner or '', its token or ''}
-- Network: it names the hold, so a retry (or a late copy) finds that hold gone and does nothing,
-- never releasing the hold it granted next. A stranded lock (free, waiters queued) is repaired.
local owner, token = ARGV[3], ARGV[4]
local bad = foreign_key()
if bad then return redis.error_reply(bad) end
local h = redis.call('HMGET', k.lock, 'owner', 'token')
if h[1] and h[1] == owner and h[2] == token then
  redis.call('DEL', k.lock)
  redis.call('DEL', wake_key(owner))
  return { 'released', grant_next() or '' }
end
if not h[1] and redis.call('EXISTS', k.queue) == 1 then
  grant_next()
end
return { 'not_held', h[1] or '', h[2] or '' }
