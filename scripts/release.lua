-- release.lua: the owner gives up one level of its hold; its outermost level (depth 1) frees the
-- lock whatever the count says and grants it to the next live waiter (one wake-up, addressed to
-- it), or leaves it free.
-- ARGV: [3] owner [4] token [5] depth held before this release [6] receipt ttl ms
-- Returns {'held', count} | {'released', next waiter or ''} | {'not_held', current owner or ''}
-- Network: an inner level sets the count to depth - 1 (a retry counts once); a full release
-- leaves a receipt (its token in P:{N}:released), so a retry reports success instead of a false
-- "not held". Tokens are unique per hold, so a late release never touches a later hold.
local owner, token, depth, receipt_ttl = ARGV[3], ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local bad = foreign_key()
if bad then return redis.error_reply(bad) end
local v = redis.call('HMGET', k.lock, 'owner', 'token')
if v[1] == owner and v[2] == token then
  if depth > 1 then
    redis.call('HSET', k.lock, 'count', depth - 1)
    return { 'held', depth - 1 }
  end
  local now = now_ms()
  redis.call('DEL', k.lock)
  redis.call('ZADD', k.released, now, token)
  -- trim old receipts now and then (the key's TTL bounds it between trims)
  if tonumber(token) % 16 == 0 then
    redis.call('ZREMRANGEBYSCORE', k.released, '-inf', now - receipt_ttl)
  end
  redis.call('PEXPIRE', k.released, receipt_ttl)
  return { 'released', grant_next() or '' }
end
if depth == 1 and redis.call('ZSCORE', k.released, token) then
  return { 'released', '' }
end
return { 'not_held', v[1] or '' }
