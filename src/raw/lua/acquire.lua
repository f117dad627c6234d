-- acquire.lua: an attempt of a thread that holds no guard of the lock (and every retry of it).
-- ARGV: [3] owner [4] attempt [5] lease ms [6] 'try' (never queue) or 'wait' [7] meta "host|pid|thread"
--       [8] 'keep' when the thread leaked a hold of this lock that is to run out by its lease, else ''
-- Returns {'granted', token, now_ms, pttl} | {'busy', holder pttl} | {'queued', now_ms, holder
--       lease ms (an upper bound of what it has left; 0 when free), last token handed out}
--       | {'stale'} (a newer attempt of this owner exists, or this one has ended: this request
--       came late or twice, nothing done)
-- No barging: a free lock with live waiters goes to the head, never to the caller; nor does a
-- lock this very thread holds with an older attempt. A hold the thread leaked on purpose
-- ('keep') runs out by its lease like anyone else's, and this attempt queues or is busy behind
-- it; any other older hold of the thread has no guard (a grant refused for too few replicas
-- whose leave went to a master that failed over, a hold the client gave up as lost): it is
-- passed on as a release would (to the queue's head), and this attempt is a newcomer.
-- A hand-off whose grantee is dead (its deadline passed on the lock's clock, its wake-up never
-- popped) is revoked here too, so no one has to heartbeat the lock for that (heartbeat.lua).
-- Network: a retry of the same attempt (reply lost, or a hand-off whose pop was lost) keeps the
-- queue place or returns the grant (and leaves a hand-off message nobody popped yet for the
-- waiter, since a repeat's reply may go to no one; the head of a free lock is told both ways
-- too); a request that arrives late, after a newer attempt of its owner reached Redis, finds
-- that attempt and does nothing; one that arrives after its attempt
-- ended (a leave, or a release of the hold it got) finds the left mark the client asked for and
-- does nothing (a client that saw no reply to a request, or sent it twice, asks its leave or
-- release for one). Only one that arrives later than QUEUE_TTL after the mark, or after a hold
-- that was never released ran out (its process died), queues (or holds) a place nobody
-- refreshes: it is purged as dead (or the hold runs out after its lease), so it delays others
-- but never gives two owners. Passing on an older hold of the thread is safe the same way: a
-- repeat finds this attempt's own hold or queue entry (nothing older to pass on), and a late
-- copy was sent when the thread had no guard of that older hold (the client sends 'keep'
-- while a leaked one runs), so it only hands on what nobody holds.
-- Undeclared keys (common.lua): the left marks (read before any write of the queueing path),
-- the caller's wake list (dropped before the orphan is passed on, and before queueing), and a
-- grantee's wake list (a grant's first write, taken back if the grant is refused after it).
-- Refused midway, only the lock's clock (vc) or a complete grant has been written: the
-- caller's retry finds a consistent state.
-- Cost: a free lock nobody waits for is HMGET, EXISTS, TIME, SET (the fence), HSET, PEXPIRE;
-- queueing behind a holder is HMGET, HGET (the left marks), HMGET, TIME, LRANGE (the wake list),
-- ZADD, PEXPIRE, HSET, PEXPIRE (the first waiter: EXISTS more); a clock's reading is
-- stored with them only when due (`advance`: at most every cap/10).
local owner, attempt, lease, mode, meta = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6], ARGV[7]
local keep = ARGV[8] == 'keep'
return run(function()
  local h = read_lock()
  if h.owner == owner then
    if h.attempt > attempt then return { 'stale' } end
    if h.attempt == attempt then
      -- this very attempt was granted; its reply or its hand-off message was lost, or this is
      -- a repeat or a late copy while the thread waits to pop the hand-off or holds the lock.
      -- Nobody may read this reply, so a hand-off message still waiting stays for the waiter
      -- to pop (the waker drops it if the thread learnt of the grant here instead), and the
      -- hand-off is confirmed (wdl cleared): a hold this reply reports is never revoked as an
      -- unpopped grant's. A queue entry of this attempt goes; a newer attempt of the thread
      -- queued behind this hold keeps its place.
      local mine = waiter_entry(owner)
      if h.wdl then redis.call('HSET', k.lock, 'wdl', '') end
      if not (mine and mine.attempt > attempt) then dequeue(owner) end
      return { 'granted', h.token_text, now_ms(), grant_pttl(h) }
    end
    if not keep then
      -- an older hold of this thread that nobody keeps: passed on (FIFO), as a release would
      drop_wakeups(owner)
      pass_on(h)
    end
  elseif h.owner and h.wdl then
    revoke_stale_handoff(h, handoff_now(h))
  end

  -- free, and neither a queue, a waiters hash, marks nor another program's hash: take it
  if not h.owner and not queue_keys_exist(h) then
    return { 'granted', fmt(take(h, owner, attempt, lease, meta)), now_ms(), lease }
  end

  local mine = own_entry(owner, attempt, forget_waiter)
  if mine == false then return { 'stale' } end

  if not h.owner then
    local head = live_head()
    if head and head == owner then
      -- the head's own attempt, run again (a retry, a repeat, a late copy) while the lock is
      -- free: the thread may be asleep on its wake list and this reply go to no one, so it is
      -- also told there, as a release would tell it. The hold is confirmed (no wdl): this reply
      -- may be the one the thread reads, and then nobody pops the wake-up (its waker drops it).
      drop_wakeups(owner)
      local token = grant_with_wakeup(owner, attempt, h.token, lease, take, h, owner, attempt,
        lease, meta)
      -- (a wake list the drop above could read but the push could not write: the reply is the
      -- only word, as for a newcomer; one that cannot be read at all fails the drop, and with
      -- it this run, before any write)
      token = token or take(h, owner, attempt, lease, meta)
      dequeue(owner)
      return { 'granted', fmt(token), now_ms(), lease }
    end
    if not head then
      local token = take(h, owner, attempt, lease, meta)
      if mine then forget_waiter(owner) end
      return { 'granted', fmt(token), now_ms(), lease }
    end
    grant_next(h)
  end

  if mode == 'try' then
    return { 'busy', holder_pttl(h) }
  end
  local last = last_token(h)
  enqueue(owner, attempt, lease, meta, mine)
  return { 'queued', now_ms(), h.lease, fmt(last) }
end)
