-- leave.lua: a waiter stops waiting (its time ran out, or it failed).
-- ARGV: [3] owner [4] attempt [5] 'claim' (take a grant that reached it meanwhile) or 'pass'
-- Returns {'left'} | {'granted', token, now_ms, pttl} | {'passed', next owner or ''}
-- Network: acts only on the queue entry or hold of this very attempt, so a late leave never
-- drops a newer wait or releases a newer hold of the same thread; a retry finds nothing left
-- (or, for 'claim', the same grant again).
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
    return { 'passed', next or '' }
  end
  local mine = waiter_entry(owner)
  if mine and mine.attempt == attempt then
    forget_waiter(owner)
  end
  return { 'left' }
end)
