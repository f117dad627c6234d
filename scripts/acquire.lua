-- acquire.lua: an attempt of a thread that holds no guard of the lock (and every retry of it).
-- ARGV: [3] owner [4] attempt [5] lease ms [6] 'try' (never queue) or 'wait' [7] meta "host|pid|thread"
-- Returns {'granted', token, now_ms, pttl} | {'busy', holder pttl} | {'queued', now_ms, holder
--       lease ms (an upper bound of what it has left; 0 when free)}
--       | {'stale'} (a newer attempt of this owner exists, or this one has left: this request
--       came late or twice, nothing done)
-- No barging: a free lock with live waiters goes to the head, never to the caller.
-- Network: a retry of the same attempt (reply lost, or a hand-off whose pop was lost) keeps the
-- queue place or returns the grant; a request that arrives late, after a newer attempt of its
-- owner reached Redis, finds that attempt and does nothing; one that arrives after its attempt's
-- leave finds the leave's left mark and does nothing (a client that saw no reply to a request,
-- or sent it twice, asks its leave for one). Only one that arrives later than QUEUE_TTL after
-- the mark queues (or holds) a place nobody refreshes: it is purged as dead (or the hold runs
-- out after its lease), so it delays others but never gives two owners.
-- Cost: a free lock nobody waits for is HMGET, EXISTS, TIME, SET (the fence), HSET, PEXPIRE;
-- queueing behind a holder is HMGET, HGET (the left marks), HMGET, TIME, ZADD, PEXPIRE, LRANGE
-- (the wake list), HSET.
local owner, attempt, lease, mode, meta = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6], ARGV[7]
return run(function()
  local h = read_lock()
  if h.owner == owner then
    if h.attempt > attempt then return { 'stale' } end
    forget_waiter(owner)
    if h.attempt == attempt then
      -- this very attempt was granted; its reply or its hand-off message was lost
      return { 'granted', h.token_text, now_ms(), grant_pttl(h) }
    end
    -- an older attempt of this thread holds it with no guard left (leaked, or given up as
    -- lost): a new hold, with a new token, so a late release of the old one cannot free this one
    return { 'granted', fmt(take(h, owner, attempt, lease, meta)), now_ms(), lease }
  end

  -- free, and neither a queue nor a waiters hash: nobody waits, take it
  if not h.owner and not queue_keys_exist() then
    return { 'granted', fmt(take(h, owner, attempt, lease, meta)), now_ms(), lease }
  end

  if left_mark(owner) >= attempt then return { 'stale' } end
  local mine = waiter_entry(owner)
  if mine and mine.attempt > attempt then return { 'stale' } end
  if mine and mine.attempt < attempt then
    -- an earlier attempt that was given up: a new attempt queues at the back
    forget_waiter(owner)
    mine = nil
  end

  if not h.owner then
    local head = live_head()
    if not head or head == owner then
      local token = take(h, owner, attempt, lease, meta)
      if mine then forget_waiter(owner) end
      return { 'granted', fmt(token), now_ms(), lease }
    end
    grant_next(h)
  end

  if mode == 'try' then
    return { 'busy', holder_pttl(h) }
  end
  enqueue(owner, attempt, lease, meta, mine)
  return { 'queued', now_ms(), h.lease }
end)
