-- leave.lua: a waiter stops waiting (its time ran out, or it failed).
-- ARGV: [3] owner [4] attempt [5] 'claim' (take a grant that reached it meanwhile) or 'pass'
-- Returns {'left'} | {'granted', token, now_ms, pttl} | {'passed', next owner or ''}
-- Network: acts only on the queue entry or hold of this very attempt (or an older one), so a
-- late leave never drops a newer wait or releases a newer hold of the same thread; a retry
-- finds nothing left (or, for 'claim', the same grant again). It leaves a *left mark* for the
-- attempt (state.lua, mark_left), so an acquire of it that arrives afterwards, late or twice,
-- does nothing.
local owner, attempt, mode = ARGV[3], tonumber(ARGV[4]), ARGV[5]
return run(function()
  local h = read_lock()
  if h.owner == owner and h.attempt == attempt then
    drop_wakeups(owner)
    if mode == 'claim' then
      return { 'granted', h.token_text, now_ms(), grant_pttl(h) }
    end
    local next = grant_next(h)
    if not next then redis.call('HSET', k.lock, 'owner', '') end
    mark_left(owner, attempt)
    return { 'passed', next or '' }
  end
  local mine = waiter_entry(owner)
  if mine and (mine.attempt > attempt or (mine.left and mine.attempt == attempt)) then
    return { 'left' } -- a newer attempt waits, or this one has left already
  end
  -- this attempt's place, an older attempt's (its thread has moved on), or nothing yet
  if mine then forget_waiter(owner) end
  mark_left(owner, attempt)
  return { 'left' }
end)
