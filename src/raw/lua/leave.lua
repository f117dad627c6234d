-- leave.lua: a waiter stops waiting (its time ran out, or it failed).
-- ARGV: [3] owner [4] attempt [5] 'claim' (take a grant that reached it meanwhile) or 'pass'
--       [6] 'mark' when an acquire request of the attempt may still arrive (it went unanswered,
--       or was sent twice), else ''
-- Returns {'left'} | {'granted', token, now_ms, pttl} | {'passed', next owner or ''}
-- Network: acts only on the queue entry or hold of this very attempt (or an older one), so a
-- late leave never drops a newer wait or releases a newer hold of the same thread; a retry
-- finds nothing left (or, for 'claim', the same grant again). When asked, it leaves a *left
-- mark* for the attempt (state.lua, mark_left), so an acquire of it that arrives afterwards,
-- late or twice, does nothing; only the client knows whether one can (it saw no reply, or sent
-- it again), and the mark lingers, so it is not left after every leave.
-- Undeclared keys (common.lua): the left marks (read first when asked for a mark) and wake
-- lists (the caller's dropped before anything is written; a grantee's pushed to first by a grant),
-- so a refusal comes before the first write.
local owner, attempt, mode, mark = ARGV[3], tonumber(ARGV[4]), ARGV[5], ARGV[6] == 'mark'
return run(function()
  -- the keys a leave may write that it does not declare (the wake list, the marks) are touched
  -- before its first write (see "Undeclared keys")
  if mark then left_mark(owner) end
  local h = read_lock()
  if h.owner == owner and h.attempt == attempt then
    drop_wakeups(owner)
    if mode == 'claim' then
      return { 'granted', h.token_text, now_ms(), grant_pttl(h) }
    end
    local next = grant_next(h)
    if not next then redis.call('HSET', k.lock, 'owner', '') end
    if mark then mark_left(owner, attempt) end
    return { 'passed', next or '' }
  end
  local mine = waiter_entry(owner)
  if mine and mine.attempt == attempt then
    forget_waiter(owner)
  end
  if mark and not (mine and mine.attempt > attempt) then mark_left(owner, attempt) end
  return { 'left' }
end)
