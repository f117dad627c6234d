-- sem_status.lua: read-only view of one semaphore (or read/write lock).
-- Returns {now_ms, kind or '', capacity or '', permits held, last token, holds count,
--          holds (6 values each: hold id, token, permits, pttl, lease, meta)...,
--          waiters (4 values each: owner, arrival time us, permits wanted, meta)...}
-- A hold whose lease has run out (not yet removed by a writing script) is not shown, and the
-- permits held count only the live ones.
-- Network: reads only.
return run(function()
  W.readonly = true
  k.leases, k.handoffs = KEYS[5], KEYS[6]
  local v = read(k.lock, 'HMGET', '~kind', '~cap', '~token')
  local now = now_ms()
  local holds, used = {}, 0
  local ids = read(k.leases, 'ZRANGEBYSCORE', '(' .. fmt(now), '+inf', 'WITHSCORES')
  for i = 1, #ids, 2 do
    local h = parse_hold(redis.call('HGET', k.lock, ids[i]))
    if h then
      used = used + h.permits
      for _, x in ipairs({ ids[i], h.token_text, fmt(h.permits), tonumber(ids[i + 1]) - now,
                           fmt(h.lease), h.meta }) do
        holds[#holds + 1] = x
      end
    end
  end
  local f = read_fence()
  local last = (f and fmt(f)) or v[3] or '0'
  local result = { now, v[1] or '', v[2] or '', used, last, #holds / 6 }
  for _, x in ipairs(holds) do result[#result + 1] = x end
  local q = read(k.queue, 'ZRANGE', 0, -1, 'WITHSCORES')
  for i = 1, #q, 2 do
    local w = waiter_entry(q[i])
    result[#result + 1] = q[i]
    result[#result + 1] = q[i + 1]
    result[#result + 1] = w and fmt(wanted(w)) or '0'
    result[#result + 1] = (w and (string.match(w.meta, '^%d+;(.*)$') or w.meta)) or ''
  end
  return result
end)
