-- release.lua: the owner gives up one level of its hold; at depth 0 the lock is granted to the next
-- live waiter (one wake-up, addressed to it) or freed.
-- ARGV: [1] flag [2] token [3] depth held before this release [4] receipt ttl ms
-- Returns {'held', count} | {'released', next waiter flag or ''} | {'not_held', current owner or ''}
-- Retry-safe: a partial release retried finds count = depth - 1; a full release leaves a receipt
-- (token in P:{N}:released), so a retry reports success instead of a false "not held".
local flag, token, depth, receipt_ttl = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local bad = foreign_key()
if bad then return redis.error_reply(bad) end
local now = now_ms()
local v = redis.call('HMGET', k.lock, 'owner', 'token', 'count')
if v[1] == flag and v[2] == token then
  local count = tonumber(v[3])
  if depth > 1 and count == depth - 1 then return { 'held', count } end
  if count > 1 then return { 'held', redis.call('HINCRBY', k.lock, 'count', -1) } end
  redis.call('DEL', k.lock)
  redis.call('HDEL', k.waiters, flag)
  redis.call('ZADD', k.released, now, token)
  -- trim old receipts now and then (the key's TTL bounds it between trims)
  if tonumber(token) % 16 == 0 then
    redis.call('ZREMRANGEBYSCORE', k.released, '-inf', now - receipt_ttl)
  end
  redis.call('PEXPIRE', k.released, receipt_ttl)
  return { 'released', grant_next(now) or '' }
end
if depth == 1 and redis.call('ZSCORE', k.released, token) then
  return { 'released', '' }
end
return { 'not_held', v[1] or '' }
