-- renew.lua: the watchdog extends a hold's lease.
-- ARGV: [1] flag [2] token [3] lease ms
-- Returns 1 when renewed, 0 when the lock is gone or belongs to another hold (never renews those:
-- the token check keeps a released guard from renewing the next owner's lock).
local v = redis.call('HMGET', KEYS[1], 'owner', 'token')
if v[1] == ARGV[1] and v[2] == ARGV[2] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
return 0
