-- reenter.lua: the owning thread takes the lock again.
-- ARGV: [1] flag [2] token of its hold [3] depth it holds now (before this re-entry)
-- Returns the new count, or 0 when the lock is no longer this hold's (lost).
-- Idempotent: a retry after a lost reply finds count = depth + 1 and does not count twice.
local flag, token, depth = ARGV[1], ARGV[2], tonumber(ARGV[3])
local bad = foreign_key()
if bad then return redis.error_reply(bad) end
local v = redis.call('HMGET', k.lock, 'owner', 'token', 'count')
if v[1] ~= flag or v[2] ~= token then return 0 end
local count = tonumber(v[3])
if count == depth + 1 then return count end
return redis.call('HINCRBY', k.lock, 'count', 1)
