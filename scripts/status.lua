-- status.lua: read-only view of one lock.
-- Returns {now_ms, owner, count, token, pttl, since, meta, fence counter, queue entries...}
-- where each queue entry is three values: flag, arrival time us, meta (or '' when its entry is gone).
local bad = foreign_key()
if bad then return redis.error_reply(bad) end
local now = now_ms()
local h = redis.call('HMGET', KEYS[1], 'owner', 'count', 'token', 'since', 'meta')
local result = { now, h[1] or '', h[2] or '0', h[3] or '0', lock_pttl(), h[4] or '0', h[5] or '',
                 redis.call('GET', KEYS[2]) or '0' }
local q = redis.call('ZRANGE', KEYS[3], 0, -1, 'WITHSCORES')
for i = 1, #q, 2 do
  local v = redis.call('HGET', KEYS[4], q[i])
  local meta = ''
  if v then
    local _, _, m = parse_waiter(v)
    meta = m
  end
  result[#result + 1] = q[i]
  result[#result + 1] = q[i + 1]
  result[#result + 1] = meta
end
return result
