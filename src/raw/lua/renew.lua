-- renew.lua: the watchdog extends a hold's lease.
-- ARGV: [3] owner [4] token [5] lease ms
-- Returns 1 when renewed, 0 when the lock is gone or belongs to another hold.
-- Network: it only ever lengthens the TTL (to the lease from now), so a retry or a late renewal
-- leaves the server's lease at or past every estimate the holder made (each measured from when
-- a renewal or grant it saw succeed was sent); a TTL a backward clock step made longer than the
-- lease stays. Tokens are unique per hold, so it never renews the next owner's lock.
return run(function()
  local v = read(k.lock, 'HMGET', 'owner', 'token')
  if v[1] == ARGV[3] and v[2] == ARGV[4] then
    if redis.call('PTTL', k.lock) < tonumber(ARGV[5]) then
      redis.call('PEXPIRE', k.lock, ARGV[5])
    end
    return 1
  end
  return 0
end)
