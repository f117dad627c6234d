-- heartbeat.lua: a client's janitor keeps its waiters' places and repairs what others left.
-- ARGV: [3..] pairs: owner, attempt (this client's waiting attempts on this lock)
-- Returns {holder pttl, last token handed out, repairs, owners told to retry...}, where repairs
-- counts what 2. and 3. did (a hand-off revoked, a stranded lock granted: 0 to 2), for the
-- client's metrics.
-- 1. For each attempt: a queued one gets a new deadline; one whose hand-off waits unpopped keeps
--    it alive; one that holds the lock with no wake-up (a repeat of its acquire took it with a
--    reply nobody read, or its wake-up was popped with a reply that never reached its thread)
--    is pushed its grant's wake-up, once, and a hand-off confirmed; any other (its entry was purged
--    during a pause, its grant lapsed unseen, its queue key was lost) is told "retry" through
--    its wake list and queues again.
-- 2. A hand-off whose grantee stopped refreshing it and never popped it is revoked.
-- 3. Dead waiters at the head of the queue are purged; a stranded lock (free, waiters queued:
--    the holder died, or a grant's wake list could not be reached) goes to the live head.
-- The last token lets each waiter tell which grants came after this heartbeat ran (the
-- client's `judge_handoff` (src/lease_estimate.rs)).
-- Cost: O(this client's waiters + dead heads), never a scan of all waiters.
-- Network: a retry refreshes again; a late heartbeat for an attempt that has moved on does
-- nothing (a newer attempt's entry) or pushes a "retry" for that old attempt, or a grant's
-- wake-up to an attempt whose thread took its hold from the acquire's reply or popped its
-- wake-up meanwhile, which its client's waiting threads drop (no thread waits with that
-- attempt) or which expires a waiter timeout later (nobody waits on the list), confirming the hand-off of a holder that is alive (so the copy, never popped, cannot
-- get it revoked); a repeat finds that copy pending and pushes none; a repeated "retry" only
-- makes its thread run acquire once more, which keeps its place.
-- Undeclared keys (common.lua): wake lists (a told owner's is probed with can_wake before the
-- push; a grant pushes its grantee's wake-up first). Refused midway, only refreshes of
-- this client's entries and clock readings have been written, which the next tick repeats.
return run(function()
  local h = read_lock()
  -- the hand-off clock (state.lua, handoff_now), moved on by heartbeats and acquires
  local lock_now = h.owner and h.wdl and handoff_now(h)
  local own_handoff = false
  local told = {}
  for i = 3, #ARGV, 2 do
    local owner, attempt = ARGV[i], tonumber(ARGV[i + 1])
    if h.owner == owner and h.attempt == attempt then
      -- a hold of an attempt that still waits: its wake-up is waiting to be popped (a hand-off
      -- gets more time), or is gone and told again with the hold's grant time (state.lua,
      -- tell_waiting_grantee)
      own_handoff = true
      local since = function() return redis.call('HGET', k.lock, 'since') or '0' end
      if tell_waiting_grantee(owner, attempt, h.token, since) then
        if h.wdl then
          h.wdl = handoff_extended(h)
          redis.call('HSET', k.lock, 'wdl', fmt(h.wdl))
        end
      elseif h.wdl then
        h.wdl = nil
        redis.call('HSET', k.lock, 'wdl', '')
      end
    else
      refresh_waiter(owner, attempt, waiter_entry(owner), told, forget_waiter)
    end
  end

  local repairs = 0
  if not own_handoff and lock_now and revoke_stale_handoff(h, lock_now) then
    repairs = repairs + 1
  end

  if front()[1] then
    if not h.owner then
      if grant_next(h) then repairs = repairs + 1 end
    else
      live_head()
    end
    if front()[1] then
      redis.call('PEXPIRE', k.queue, QUEUE_TTL)
      redis.call('PEXPIRE', k.waiters, QUEUE_TTL)
    end
  else
    -- no queue (emptied, or its key lost): the waiters hash goes too
    drop_orphaned_waiters()
  end
  local result = { holder_pttl(h), fmt(last_token(h)), repairs }
  for _, f in ipairs(told) do result[#result + 1] = f end
  return result
end)
