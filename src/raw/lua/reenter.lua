-- reenter.lua: the owning thread takes the lock again.
-- ARGV: [3] owner [4] token of its hold [5] depth it holds now (before this re-entry)
-- Returns the new count, or 0 when the lock is no longer this hold's (lost).
-- Network: sets the count to depth + 1 rather than adding, so a retry counts once; a late one
-- can only set a count that the thread's own depth overrides (the outermost release frees the
-- lock whatever the count). A new hold has a new token, so nothing reaches a later hold.
local owner, token, depth = ARGV[3], ARGV[4], tonumber(ARGV[5])
return run(function()
  local v = read(k.lock, 'HMGET', 'owner', 'token')
  if v[1] ~= owner or v[2] ~= token then return 0 end
  redis.call('HSET', k.lock, 'count', depth + 1)
  return depth + 1
end)
