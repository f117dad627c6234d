-- sem_release.lua (prototype): the holder of one hold gives its permits back; the queue's live
-- heads that now fit are granted (sem.lua, grant_heads).
-- ARGV: [3] owner [4] attempt [5] token
-- Returns {'released', grants made} | {'not_held'}
-- Network: the hold is named by owner and attempt and must carry the token, so a late release
-- never touches a later hold; a full release leaves a receipt, so a repeat reports success.
local owner, attempt, token = ARGV[3], tonumber(ARGV[4]), ARGV[5]
return run(function()
  read_sem(KEYS)
  expire_holds()
  local id = hold_id(owner, attempt)
  local h = parse_hold(redis.call('HGET', k.lock, id))
  if h and h.token_text == token then
    S.used = math.max(S.used - h.permits, 0)
    redis.call('HDEL', k.lock, id)
    redis.call('ZREM', k.leases, id)
    redis.call('HSET', k.lock, '~used', fmt(S.used), '~released',
      with_receipt(S.released, token))
    return { 'released', grant_heads() }
  end
  if has_receipt(S.released, token) then return { 'released', 0 } end
  return { 'not_held' }
end)
