-- release.lua: the owner gives up one level of its hold; its outermost level (depth 1) frees the
-- lock whatever the count says and grants it to the next live waiter (one wake-up, addressed to
-- it), or leaves it free (a tombstone: see common.lua).
-- ARGV: [3] owner [4] token [5] depth held before this release [6] the hold's attempt, when an
--       acquire request of it may still arrive (it went unanswered, or was sent twice), else ''
-- Returns {'held', count} | {'released', next waiter or ''} | {'not_held', current owner or ''}
-- Network: an inner level sets the count to depth - 1 (a retry counts once); a full release
-- leaves a receipt (its token in the hash's `released`, with the last few others), so a retry
-- reports success instead of a false "not held" while the lock's hash remembers it (the hash
-- lives on through the next holds; a tombstone for the rest of the released lease). Tokens
-- are unique per hold, so a late release never touches a later hold. When asked (ARGV[6]),
-- the outermost release (whatever it finds) leaves a left mark for the hold's attempt
-- (state.lua, mark_left), so a copy of its acquire that arrives afterwards does nothing
-- instead of taking the lock for a thread that holds no guard; and a hold of that very
-- attempt with another token (such a copy arrived after the thread's own hold was lost:
-- force-unlocked, or run out) is freed with it, and a queue place of that attempt removed,
-- since no guard of it exists and nobody waits with it.
-- Cost: with nobody waiting HMGET, ZRANGE (the queue's head), HSET.
-- Undeclared keys (common.lua): the left marks (read first when asked for a mark) and the
-- grantee's wake list (the grant's first write, taken back if the grant is refused after it;
-- refused itself, the lock is left free with its queue, which the grantee's heartbeat grants
-- later), so a refusal never leaves half a hand-off.
local owner, token, depth, mark = ARGV[3], ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])

return run(function()
  -- the marks' key is undeclared: touched before the first write (see "Undeclared keys")
  if mark and depth <= 1 then left_mark(owner) end
  local h = read_lock_to_release(mark and depth <= 1)
  local result
  if h.owner == owner and h.token_text == token then
    if depth > 1 then
      redis.call('HSET', k.lock, 'count', depth - 1)
      return { 'held', depth - 1 }
    end
    result = { 'released', pass_on(h, 'released', with_receipt(h.released, token)) or '' }
  elseif depth == 1 and has_receipt(h.released, token) then
    result = { 'released', '' }
  elseif mark and depth <= 1 and h.owner == owner and h.attempt == mark then
    -- a late copy of this attempt's acquire took the lock after the thread's hold was lost
    pass_on(h)
    result = { 'not_held', '' }
  else
    result = { 'not_held', h.owner or '' }
  end
  if mark and depth <= 1 then
    -- and a queue place such a copy took meanwhile goes too (nobody waits with it)
    local ghost = waiter_entry(owner)
    if ghost and ghost.attempt == mark then forget_waiter(owner) end
    mark_left(owner, mark)
  end
  return result
end)
