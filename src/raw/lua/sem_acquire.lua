-- sem_acquire.lua: an attempt to take `permits` of a semaphore.
-- KEYS: see sem.lua. ARGV: [3] owner [4] attempt [5] permits [6] lease ms [7] 'try' or 'wait'
--       [8] meta [9] kind ('sem' or 'rw') [10] capacity
-- Returns {'granted', token, now_ms, pttl} | {'busy', used, cap} | {'queued', now_ms, last token}
--       | {'stale'} | {'mismatch', stored kind, stored capacity}
-- No barging: permits are taken at once only when no live waiter is queued (or the caller is
-- the head) and they fit. Network: a repeat of a granted attempt finds its hold (named by owner
-- and attempt) and returns it; of a queued one, its place; either whatever capacity its handle
-- asks with (only a new entry must agree with the stored capacity), and leaves a hand-off
-- message nobody popped yet for the waiter (a repeat's reply may go to no one). A late copy
-- after a newer attempt or after the attempt left with a mark does nothing; a late copy of a
-- held attempt changes neither the thread's newer queue place nor its wake-ups.
local owner, attempt, permits, lease, mode, meta, kind, cap =
  ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7], ARGV[8], ARGV[9],
  tonumber(ARGV[10])
return run(function()
  local id = hold_id(owner, attempt)
  read_sem(KEYS, id)
  expire_holds()
  revoke_dead_grantees()
  local mismatch = false
  if S.kind and (S.kind ~= kind or S.cap ~= cap) then
    -- capacity and kind bind while anyone holds or waits, and for FENCE_TTL after
    -- sem_capacity stored them (~set: a waiter it turned away must not undo it); a state nobody
    -- uses (the hash left until the last lease's end, with the receipts) takes this caller's
    if S.used > 0 or front()[1] or S.set then
      mismatch = true
    else
      S.kind, S.cap = kind, cap
      redis.call('HSET', k.lock, '~kind', kind, '~cap', fmt(cap))
      S.saved.kind, S.saved.cap = kind, fmt(cap)
    end
  end
  if not S.cap then S.kind, S.cap = kind, cap end
  -- this thread's waiter entry is read with the waiters' clock (one HMGET: the grants below
  -- would read the clock alone, and own_entry the entry after it); the run's own changes keep
  -- what it read true (state.lua, W)
  waiter_entry(owner)
  -- permits freed by expiry (or a stranded queue) go to the waiters first; this very attempt,
  -- if queued at the head, may be among them
  grant_heads()
  local mine_hold = own_hold()
  if mine_hold then
    -- granted (its reply or its wake-up lost, or granted just now): any queue place of this
    -- attempt goes (an older attempt's messages with it)
    local pttl = tonumber(read(k.leases, 'ZSCORE', id)) or 0
    pttl = math.min(math.max(pttl - now_ms(), 0), mine_hold.lease)
    -- A hand-off of it still waiting in the wake list stays for the waiter to pop: nobody may
    -- read this reply (a repeat whose first copy was answered, a late copy), and the waker
    -- drops it if the thread learnt of the grant here instead. The hand-off is confirmed
    -- (its entry goes), so a hold this reply reports is never revoked as an unpopped grant's.
    local w = waiter_entry(owner)
    if w and w.attempt < attempt then
      forget_attempt(owner, w)
    elseif w and w.attempt == attempt then
      dequeue(owner)
    end
    zrem(k.handoffs, id)
    return { 'granted', mine_hold.token_text, now_ms(), pttl }
  end
  local mine = own_entry(owner, attempt, forget_attempt)
  if mine == false then return { 'stale' } end
  if mismatch and not mine then
    -- a new entry must agree with the stored capacity; this attempt's own hold (above) or queue
    -- place (a re-run after a dropped connection, a hand-off to confirm) is kept whatever the
    -- handle it was made with
    return { 'mismatch', S.kind, fmt(S.cap) }
  end
  if not live_head() and S.used + permits <= S.cap then
    local token = take_permits(owner, attempt, permits, lease, meta, kind, cap)
    return { 'granted', fmt(token), now_ms(), lease }
  end
  if mode == 'try' then return { 'busy', fmt(S.used), fmt(S.cap) } end
  -- the state must exist while anyone waits: capacity and kind are part of it (written unless
  -- the hash holds them already, as read or as this run wrote them)
  local saved = S.saved
  if saved.kind ~= S.kind or saved.cap ~= fmt(S.cap) or saved.used ~= fmt(S.used) then
    redis.call('HSET', k.lock, '~kind', S.kind, '~cap', fmt(S.cap), '~used', fmt(S.used))
  end
  keep_sem(QUEUE_TTL)
  enqueue(owner, attempt, lease, fmt(permits) .. ';' .. meta, mine)
  return { 'queued', now_ms(), fmt(S.token or read_fence() or 0) }
end)
