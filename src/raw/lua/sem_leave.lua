-- sem_leave.lua (prototype): a waiter gives up its attempt: its queue place goes, and a hold
-- granted to that attempt meanwhile (a hand-off it will not take) is given back, which may
-- grant the next heads. ARGV: [3] owner [4] attempt [5] 'mark' or ''
-- Returns {'left'} | {'passed', grants made}
-- Network: acts only on that attempt; with 'mark', a copy of its acquire that arrives later
-- finds the left mark and does nothing.
local owner, attempt, mark = ARGV[3], tonumber(ARGV[4]), ARGV[5] == 'mark'
return run(function()
  if mark then left_mark(owner) end
  read_sem(KEYS)
  expire_holds()
  revoke_dead_grantees()
  local result = { 'left' }
  local id = hold_id(owner, attempt)
  local h = parse_hold(redis.call('HGET', k.lock, id))
  if h then
    drop_wakeups(owner)
    drop_hold(id, h)
    result = { 'passed', 0 }
  end
  local mine = waiter_entry(owner)
  if mine and mine.attempt == attempt then forget_waiter(owner) end
  local n = grant_heads()
  if h then result[2] = n end
  if mark and not (mine and mine.attempt > attempt) then mark_left(owner, attempt) end
  return result
end)
