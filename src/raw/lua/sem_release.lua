-- sem_release.lua: the holder of one hold gives its permits back; the queue's live
-- heads that now fit are granted (sem.lua, grant_heads).
-- ARGV: [3] owner [4] attempt [5] token [6] 'mark' when a copy of the attempt's acquire may
--       still arrive (it went unanswered, or was sent twice), 'force' for an operator's release
--       of another's hold (no receipt: a repeat reports not_held), else ''
-- Returns {'released', grants made} | {'not_held'}
-- Network: the hold is named by owner and attempt and must carry the token, so a late release
-- never touches a later hold; a full release leaves a receipt, so a repeat reports success; with
-- 'mark', a left mark makes a late copy of the acquire do nothing (state.lua, mark_left), and a
-- hold or place such a copy took after the thread's own hold ran out is given back.
local owner, attempt, token, mark, force = ARGV[3], tonumber(ARGV[4]), ARGV[5],
  ARGV[6] == 'mark', ARGV[6] == 'force'
return run(function()
  local id = hold_id(owner, attempt)
  if mark then left_mark(owner) end
  read_sem(KEYS, id)
  expire_holds()
  revoke_dead_grantees()
  local h = own_hold()
  if h and h.token_text == token then
    -- forced, the hold may be a hand-off its grantee has not popped: its wake-up goes first
    -- (the list is an undeclared key, touched before the release's first write), so it cannot
    -- be popped as a grant after the permits went on, as the mutex's force-unlock does
    -- a forced release leaves no receipt: the holder's own release then finds its hold gone
    -- (the receipt is written with the permits given back, in one HSET)
    if force then
      drop_attempt_wakeups(owner, attempt)
      drop_hold(id, h)
    else
      drop_hold(id, h, '~released', with_receipt(S.released, token))
    end
    local n = grant_heads()
    if mark then mark_left(owner, attempt) end
    return { 'released', n }
  end
  if mark then
    -- a late copy of this attempt's acquire that arrived after the thread's own hold was lost
    -- (ran out) took permits, or a place, with no guard behind them: they go too (as the
    -- mutex's release.lua does)
    if h then
      drop_hold(id, h)
      grant_heads()
    end
    local ghost = waiter_entry(owner)
    if ghost and ghost.attempt == attempt then forget_attempt(owner, ghost) end
    mark_left(owner, attempt)
  end
  -- a receipt answers the holder's own repeated release, never a forced one: the hold was given
  -- back by its holder (or by an earlier call of this force-release, which leaves none), not by
  -- this call
  if not force and has_receipt(S.released, token) then return { 'released', 0 } end
  return { 'not_held' }
end)
