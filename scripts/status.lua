-- status.lua: read-only view of one lock.
-- Returns {now_ms, owner, count, token, pttl, since, meta, fence, queue entries...}
-- where each queue entry is three values: owner, arrival time us, meta (or '' when its entry is gone).
-- Network: reads only.
local bad = foreign_key()
if bad then return redis.error_reply(bad) end
local h = redis.call('HMGET', k.lock, 'owner', 'count', 'token', 'since', 'meta')
local result = { now_ms(), h[1] or '', h[2] or '0', h[3] or '0', lock_pttl(), h[4] or '0', h[5] or '',
                 redis.call('GET', k.fence) or '0' }
local q = redis.call('ZRANGE', k.queue, 0, -1, 'WITHSCORES')
for i = 1, #q, 2 do
  local w = waiter_entry(q[i])
  result[#result + 1] = q[i]
  result[#result + 1] = q[i + 1]
  result[#result + 1] = (w and w.meta) or ''
end
return result
