-- force_unlock.lua: an operator releases a named hold (owner and token, as status shows them)
-- and the lock goes to the next waiter.
-- ARGV: [3] owner [4] token
-- Returns {'released', next owner or ''} | {'not_held', current owner or '', its token or ''}
-- Network: it names the hold, so a retry (or a late copy) finds that hold gone and does nothing,
-- never releasing the hold it granted next. A stranded lock (free, waiters queued) is repaired.
local owner, token = ARGV[3], ARGV[4]
return run(function()
  local h = read_lock()
  if h.owner and h.owner == owner and h.token_text == token then
    drop_wakeups(owner)
    local next = grant_next(h)
    if not next then redis.call('HSET', k.lock, 'owner', '') end
    return { 'released', next or '' }
  end
  local holder, holder_token = h.owner or '', (h.owner and h.token_text) or ''
  if not h.owner and front()[1] then
    grant_next(h)
  end
  return { 'not_held', holder, holder_token }
end)
