-- sem_leave.lua: a waiter gives up its attempt: its queue place goes, and a hold granted to that
-- attempt meanwhile (a hand-off it will not take) is given back, which may grant the next heads;
-- with 'claim' (a wait whose deadline came), such a hold is kept and returned instead.
-- ARGV: [3] owner [4] attempt [5] 'mark' or '' [6] 'claim' or ''
-- Returns {'left'} | {'passed', grants made} | {'granted', token, now_ms, pttl}
-- Network: acts only on that attempt. With 'mark', a copy of its acquire that arrives later finds
-- the left mark and does nothing. A repeat of a claim finds the same hold and returns it again;
-- a late claim after the hold was released finds nothing and leaves.
local owner, attempt, mark, claim = ARGV[3], tonumber(ARGV[4]), ARGV[5] == 'mark',
  ARGV[6] == 'claim'
return run(function()
  local id = hold_id(owner, attempt)
  if mark then left_mark(owner) end
  read_sem(KEYS, id)
  expire_holds()
  revoke_dead_grantees()
  local result = { 'left' }
  local h = own_hold()
  local mine = waiter_entry(owner)
  if h and claim then
    -- the deadline came, but the permits did too: the caller holds them (its wake-up goes, and
    -- the hand-off is confirmed: the holder renews it from here)
    drop_attempt_wakeups(owner, attempt)
    zrem(k.handoffs, id)
    if mine and mine.attempt == attempt then forget_attempt(owner, mine) end
    local pttl = tonumber(read(k.leases, 'ZSCORE', id)) or 0
    pttl = math.min(math.max(pttl - now_ms(), 0), h.lease)
    return { 'granted', h.token_text, now_ms(), pttl }
  end
  if h then
    drop_attempt_wakeups(owner, attempt)
    drop_hold(id, h)
    result = { 'passed', 0 }
  end
  if mine and mine.attempt == attempt then forget_attempt(owner, mine) end
  local n = grant_heads()
  if h then result[2] = n end
  if mark and not (mine and mine.attempt > attempt) then mark_left(owner, attempt) end
  return result
end)
