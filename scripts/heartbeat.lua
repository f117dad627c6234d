-- heartbeat.lua: a client's janitor keeps its waiters' places and repairs what others left.
-- ARGV: [3..] pairs: owner, attempt (this client's waiting attempts on this lock)
-- Returns {holder pttl, owners told to retry...}
-- 1. For each attempt: a queued one gets a new deadline; one whose hand-off waits unpopped keeps
--    it alive; any other (its entry was purged during a pause, its grant lapsed unseen, its
--    queue key was lost) is told "retry" through its wake list and queues again.
-- 2. A hand-off whose grantee stopped refreshing it and never popped it is revoked.
-- 3. Dead waiters at the head of the queue are purged; a stranded lock (free, waiters queued:
--    the holder died) goes to the live head.
-- Cost: O(this client's waiters + dead heads), never a scan of all waiters.
-- Network: a retry refreshes again; a late heartbeat for an attempt that has moved on does
-- nothing (a newer attempt's entry) or pushes a "retry" for that old attempt, which its thread
-- ignores.
local bad = foreign_key()
if bad then return redis.error_reply(bad) end
local h = redis.call('HMGET', k.lock, 'owner', 'attempt', 'token', 'wdl')
local own_handoff = false
local told = {}
for i = 3, #ARGV, 2 do
  local owner, attempt = ARGV[i], tonumber(ARGV[i + 1])
  if h[1] == owner and tonumber(h[2]) == attempt then
    own_handoff = true
    if h[4] then
      redis.call('HSET', k.lock, 'wdl', fmt(lock_now() + WAITER_TTL))
    end
  else
    local w = waiter_entry(owner)
    if w and w.attempt == attempt and redis.call('ZSCORE', k.queue, owner) then
      write_waiter(owner, attempt, waiters_now() + WAITER_TTL, w.lease, w.meta)
    elseif not (w and w.attempt > attempt) then
      if w then forget_waiter(owner) end
      local wk = wake_key(owner)
      redis.call('RPUSH', wk, 'r|' .. fmt(attempt))
      redis.call('PEXPIRE', wk, WAITER_TTL)
      told[#told + 1] = owner
    end
  end
end

if h[1] and h[4] and not own_handoff and tonumber(h[4]) < lock_now()
    and handoff_pending(h[1], tonumber(h[2]), tonumber(h[3])) then
  redis.call('DEL', k.lock)
  redis.call('DEL', wake_key(h[1]))
  h[1] = nil
end

if redis.call('EXISTS', k.queue) == 1 then
  if redis.call('EXISTS', k.lock) == 0 then
    grant_next()
  else
    live_head()
  end
  if redis.call('EXISTS', k.queue) == 1 then
    redis.call('PEXPIRE', k.queue, QUEUE_TTL)
    redis.call('PEXPIRE', k.waiters, QUEUE_TTL)
  end
else
  drop_waiters_if_queue_empty()
end
local result = { lock_pttl() }
for _, f in ipairs(told) do result[#result + 1] = f end
return result
