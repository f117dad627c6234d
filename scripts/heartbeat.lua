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
-- nothing (a newer attempt's entry) or pushes a "retry" for that old attempt, which its client's
-- waiting threads drop (no thread waits with that attempt); a repeated "retry" only makes its
-- thread run acquire once more, which keeps its place.
return run(function()
  local h = read_lock()
  -- the lock hash's own virtual clock (see "Time" in common.lua), for hand-off deadlines; stored
  -- below, as heartbeats are what moves it on
  local lock_now = h.owner and h.wdl and advance(h.vc)
  local own_handoff = false
  local told = {}
  for i = 3, #ARGV, 2 do
    local owner, attempt = ARGV[i], tonumber(ARGV[i + 1])
    if h.owner == owner and h.attempt == attempt then
      own_handoff = true
      if h.wdl then
        h.wdl = lock_now + WAITER_TTL
        redis.call('HSET', k.lock, 'wdl', fmt(h.wdl))
      end
    else
      local w = waiter_entry(owner)
      if w and w.attempt == attempt and read(k.queue, 'ZSCORE', owner) then
        write_waiter(owner, attempt, waiters_now() + WAITER_TTL, w.lease, w.meta)
      elseif not (w and w.attempt > attempt) then
        if w then forget_waiter(owner) end
        push_wakeup(owner, 'r|' .. fmt(attempt), WAITER_TTL)
        told[#told + 1] = owner
      end
    end
  end

  if lock_now then
    redis.call('HSET', k.lock, 'vc', clock_value(lock_now))
  end
  if h.owner and h.wdl and not own_handoff and h.wdl < lock_now
      and handoff_pending(h.owner, h.attempt, h.token) then
    redis.call('HSET', k.lock, 'owner', '')
    drop_wakeups(h.owner)
    h.owner = false
  end

  if front()[1] then
    if not h.owner then
      grant_next(h)
    else
      live_head()
    end
    if front()[1] then
      redis.call('PEXPIRE', k.queue, QUEUE_TTL)
      redis.call('PEXPIRE', k.waiters, QUEUE_TTL)
    end
  elseif W.now or read(k.waiters, 'HLEN') > 0 then
    -- no queue (emptied, or its key lost): the waiters hash goes too
    redis.call('DEL', k.waiters)
  end
  local result = { holder_pttl(h) }
  for _, f in ipairs(told) do result[#result + 1] = f end
  return result
end)
