-- status.lua: read-only view of one lock.
-- Returns {now_ms, owner, count, token, pttl, since, meta, fence, lease, queue entries...}
-- where each queue entry is three values: owner, arrival time us, meta (or '' when its entry is
-- gone), fence is the last token handed out (the fence; the hash's token if the fence is
-- gone), and lease the hold's lease in ms (what a renewal resets its TTL to; 0 when free).
-- Network: reads only.
-- Undeclared keys: none (it reads the four declared ones).
return run(function()
  W.readonly = true
  local v = read(k.lock, 'HMGET', 'owner', 'count', 'token', 'since', 'meta', 'lease')
  local f = read_fence()
  local fence = (f and fmt(f)) or v[3] or '0'
  local result
  if v[1] and v[1] ~= '' then
    local pttl = redis.call('PTTL', k.lock)
    result = { now_ms(), v[1], v[2] or '0', v[3] or '0', math.max(pttl, 0), v[4] or '0',
               v[5] or '', fence, v[6] or '0' }
  else
    result = { now_ms(), '', '0', '0', 0, '0', '', fence, '0' }
  end
  local q = read(k.queue, 'ZRANGE', 0, -1, 'WITHSCORES')
  for i = 1, #q, 2 do
    local w = waiter_entry(q[i])
    result[#result + 1] = q[i]
    result[#result + 1] = q[i + 1]
    result[#result + 1] = (w and w.meta) or ''
  end
  return result
end)
