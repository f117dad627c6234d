-- leave.lua: a waiter stops waiting (its time ran out, or it failed).
-- ARGV: [3] owner [4] attempt [5] 'claim' (take a grant that reached it meanwhile) or 'pass'
-- Returns {'left'} | {'granted', token, now_ms, pttl} | {'passed', next owner or ''}
-- Network: acts only on the queue entry or hold of this very attempt, so a late leave never
-- drops a newer wait or releases a newer hold of the same thread; a retry finds nothing left
-- (or, for 'claim', the same grant again).
local owner, attempt, mode = ARGV[3], tonumber(ARGV[4]), ARGV[5]
local bad = foreign_key()
if bad then return redis.error_reply(bad) end
local now = now_ms()
local h = redis.call('HMGET', k.lock, 'owner', 'attempt', 'token')
if h[1] == owner and tonumber(h[2]) == attempt then
  redis.call('DEL', wake_key(owner))
  if mode == 'claim' then
    return { 'granted', h[3], now, grant_pttl() }
  end
  redis.call('DEL', k.lock)
  return { 'passed', grant_next() or '' }
end
local mine = waiter_entry(owner)
if mine and mine.attempt == attempt then
  forget_waiter(owner)
end
return { 'left' }
