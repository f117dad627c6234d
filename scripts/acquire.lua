-- acquire.lua: an attempt of a thread that holds no guard of the lock (and every retry of it).
-- ARGV: [3] owner [4] attempt [5] lease ms [6] 'try' (never queue) or 'wait' [7] meta "host|pid|thread"
-- Returns {'granted', token, now_ms, pttl} | {'busy', holder pttl, now_ms} | {'queued', now_ms, pttl}
--       | {'stale'} (a newer attempt of this owner exists: this request came late, nothing done)
-- No barging: a free lock with live waiters goes to the head, never to the caller.
-- Network: a retry of the same attempt (reply lost, or a hand-off whose pop was lost) keeps the
-- queue place or returns the grant; a request that arrives late, after a newer attempt of its
-- owner reached Redis, finds that attempt and does nothing. One that arrives after its owner
-- left for good queues (or holds) a place nobody refreshes: it is purged as dead (or the hold
-- runs out after its lease), so it delays others but never gives two owners.
local owner, attempt, lease, mode, meta = ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6], ARGV[7]
local bad = foreign_key()
if bad then return redis.error_reply(bad) end
local now = now_ms()

local h = redis.call('HMGET', k.lock, 'owner', 'attempt', 'token')
if h[1] == owner then
  local held = tonumber(h[2]) or 0
  if held > attempt then return { 'stale' } end
  forget_waiter(owner)
  if held == attempt then
    -- this very attempt was granted; its reply or its hand-off message was lost
    return { 'granted', h[3], now, grant_pttl() }
  end
  -- an older attempt of this thread holds it with no guard left (leaked, or given up as lost):
  -- a new hold, with a new token, so a late release of the old one cannot free this one
  redis.call('DEL', k.lock)
  return { 'granted', fmt(take(owner, attempt, lease, meta)), now, lease }
end

local mine = waiter_entry(owner)
if mine and mine.attempt > attempt then return { 'stale' } end
if mine and mine.attempt < attempt then
  -- an earlier attempt that was given up: a new attempt queues at the back
  forget_waiter(owner)
  mine = nil
end

if not h[1] then
  local head = live_head()
  if not head or head == owner then
    if mine then forget_waiter(owner) end
    return { 'granted', fmt(take(owner, attempt, lease, meta)), now, lease }
  end
  grant_next()
end

if mode == 'try' then
  return { 'busy', lock_pttl(), now }
end
enqueue(owner, attempt, lease, meta)
return { 'queued', now, lock_pttl() }
