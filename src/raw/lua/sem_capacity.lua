-- sem_capacity.lua: change a semaphore's stored capacity.
-- ARGV: [3] kind [4] new capacity
-- Returns {'set', grants made} | {'mismatch', stored kind, stored capacity}
-- The capacity is stored with ~set (sem.lua), used or not (a name without state gets one): every
-- acquisition must agree with it, not only while anyone holds or waits, and the hash lives at
-- least FENCE_TTL from now. So a waiter turned away below cannot store its old capacity again
-- by running its acquire when the name happens to be idle.
-- A raise grants the heads that now fit at once. A cut revokes nothing: holders above the new
-- capacity keep their permits until they release them or their lease ends, and no permit is
-- granted until the permits held plus the head's fit. A queued waiter that wants more than the
-- new capacity could never be served and would block everyone behind it: it is told to retry
-- (its place goes), and its acquire, run again with the capacity it was made with, gets the
-- mismatch (so does a late or repeated copy of it: ~set stays).
-- Network: setting the same capacity twice is setting it once; a late copy that arrives after a
-- newer change sets the older capacity again (a change is an operator's act: the last one sent
-- is meant to win, and a lost reply is answered by running it again).
local kind, cap = ARGV[3], tonumber(ARGV[4])
return run(function()
  read_sem(KEYS)
  if S.kind and S.kind ~= kind then return { 'mismatch', S.kind, fmt(S.cap) } end
  expire_holds()
  revoke_dead_grantees()
  -- the queue and the waiters are looked at before the capacity is written: on a name nobody
  -- uses, another program's data there is refused before any write
  local q = read(k.queue, 'ZRANGE', 0, -1)
  for _, owner in ipairs(q) do
    if not is_owner(owner) then refuse(k.queue, 'a zset whose members are not fairlock owners') end
  end
  if not W.now then waiter_entry('~clock') end
  S.kind, S.cap = kind, cap
  redis.call('HSET', k.lock, '~kind', kind, '~cap', fmt(cap), '~set', '1')
  S.saved.kind, S.saved.cap = kind, fmt(cap)
  keep_sem(FENCE_TTL)
  for _, owner in ipairs(q) do
    local w = waiter_entry(owner)
    if w and wanted(w) > cap then
      forget_attempt(owner, w)
      if can_wake(owner) then push_wakeup(owner, 'r|' .. fmt(w.attempt), WAITER_TTL) end
    end
  end
  return { 'set', grant_heads() }
end)
