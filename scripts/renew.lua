-- renew.lua: the watchdog extends a hold's lease.
-- ARGV: [3] owner [4] token [5] lease ms
-- Returns 1 when renewed, 0 when the lock is gone or belongs to another hold.
-- Network: a retry sets the same TTL again; a late renewal extends the server's lease past the
-- holder's estimate (which is measured from when the renewal it saw succeed was sent), never
-- short of it; tokens are unique per hold, so it never renews the next owner's lock.
local v = redis.call('HMGET', k.lock, 'owner', 'token')
if v[1] == ARGV[3] and v[2] == ARGV[4] then
  redis.call('PEXPIRE', k.lock, ARGV[5])
  return 1
end
return 0
