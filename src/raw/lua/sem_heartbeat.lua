-- sem_heartbeat.lua: a client's waiting attempts, refreshed; expired holds given
-- back and the heads that fit granted; a waiter whose place is gone is told to retry.
-- ARGV: [3..] owner, attempt pairs. Returns {used, capacity or '', grants made, last token,
-- ms until the next hold's lease ends (-1: no hold), told...}
-- A hand-offs entry whose hold is gone (its hash evicted) is dropped, never taken for a grant.
-- A hold of a named attempt whose wake-up is not in the wake list (popped with a reply that
-- never reached its thread, or never pushed) is told again, once, and its hand-off confirmed
-- (state.lua, tell_waiting_grantee); one whose wake-up waits gets more time to pop it.
-- Network: refreshes only entries of the attempts named; a late copy refreshes a live entry a
-- little early (its deadline is the copy's arrival + the waiter timeout), or tells an attempt
-- that has ended to retry, or one that holds its grant already (its thread saw the reply of
-- its acquire, or popped its wake-up) of that grant, which its client drops (no thread waits
-- with that attempt) or which expires a waiter timeout later (nobody waits on the list),
-- confirming the hand-off of a holder that is alive; a repeat finds the
-- wake-up it pushed pending and pushes none.
-- Undeclared keys (common.lua): wake lists, each probed with can_wake before a push (a list
-- that cannot be reached now is told at the next heartbeat; the hand-off keeps its deadline
-- meanwhile). Refused midway, only refreshes of this client's entries, clock readings and
-- expiries have been written, which the next tick repeats.
return run(function()
  read_sem(KEYS)
  local told = {}
  for i = 3, #ARGV, 2 do
    local owner, attempt = ARGV[i], tonumber(ARGV[i + 1])
    local w = waiter_entry(owner)
    local id = hold_id(owner, attempt)
    local handoff = read(k.handoffs, 'ZSCORE', id)
    local hold = redis.call('HGET', k.lock, id)
    if handoff and not hold then
      -- the hold went with an evicted hash: the entry is stale (the attempt may have queued
      -- again, and its place must be refreshed below, not mistaken for a hand-off)
      zrem(k.handoffs, id)
      handoff = nil
    end
    local held = parse_hold(hold)
    if held then
      -- a hold of an attempt that still waits: its wake-up is waiting to be popped (a hand-off
      -- gets more time), or is gone (popped with a reply that never reached the thread, or a
      -- repeat of its acquire took the permits with a reply that went to no one) and is told
      -- again, with the grant time its lease end implies (a renewal only moves it on), and a
      -- hand-off confirmed (state.lua, tell_waiting_grantee)
      local granted = function()
        local ends = tonumber(read(k.leases, 'ZSCORE', id)) or now_ms()
        return fmt(ends - held.lease)
      end
      if tell_waiting_grantee(owner, attempt, held.token, granted) then
        if handoff then
          zview(k.handoffs)
          zadd(k.handoffs, fmt(handoff_extended(S)), id)
        end
      elseif handoff then
        zrem(k.handoffs, id)
      end
    else
      -- (no hold of this attempt, or one that is not fairlock's: parse_hold)
      refresh_waiter(owner, attempt, w, told, forget_attempt)
    end
  end
  expire_holds()
  revoke_dead_grantees()
  local n = grant_heads()
  if front()[1] then
    redis.call('PEXPIRE', k.queue, QUEUE_TTL)
    redis.call('PEXPIRE', k.waiters, QUEUE_TTL)
    keep_sem(QUEUE_TTL)
  else
    drop_orphaned_waiters()
  end
  local next_end = redis.call('ZRANGE', k.leases, 0, 0, 'WITHSCORES')
  local until_end = next_end[2] and math.max(tonumber(next_end[2]) - now_ms(), 0) or -1
  local result = { fmt(S.used), S.cap and fmt(S.cap) or '', n,
                   fmt(S.token or read_fence() or 0), until_end }
  for _, f in ipairs(told) do result[#result + 1] = f end
  return result
end)
