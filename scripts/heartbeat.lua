-- heartbeat.lua: a client's janitor keeps its live waiters' places and repairs what others left.
-- ARGV: [1] waiter timeout ms, then triples: flag, lease ms, meta (this client's waiters of this lock)
-- Returns {holder pttl, flags told to retry...}
-- 1. Refresh each local waiter's deadline. A waiter with no entry (dropped as dead during a pause,
--    or lost with a Redis restart) is told "retry" through its wake list and re-queues itself.
-- 2. Purge dead waiters anywhere in the queue; revoke a grant its dead grantee never popped.
-- 3. A stranded lock (free, waiters queued: the holder died) is granted to the live head.
local bad = foreign_key()
if bad then return redis.error_reply(bad) end
local now = now_ms()
local waiter_ttl = tonumber(ARGV[1])
local owner = redis.call('HGET', k.lock, 'owner')
local told = {}
for i = 2, #ARGV, 3 do
  local flag, lease, meta = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
  if redis.call('HEXISTS', k.waiters, flag) == 1 then
    redis.call('HSET', k.waiters, flag, string.format('%.0f|%d|%s', now + waiter_ttl, lease, meta))
  elseif owner ~= flag then
    local wk = wake_key(flag)
    redis.call('RPUSH', wk, 'retry')
    redis.call('PEXPIRE', wk, waiter_ttl)
    told[#told + 1] = flag
  end
end
keep_for(k.queue, 2 * waiter_ttl)
keep_for(k.waiters, 2 * waiter_ttl)

local entries = redis.call('HGETALL', k.waiters)
for i = 1, #entries, 2 do
  local flag = entries[i]
  local deadline = parse_waiter(entries[i + 1])
  if deadline < now then
    redis.call('ZREM', k.queue, flag)
    redis.call('HDEL', k.waiters, flag)
    if flag == owner then
      local token = redis.call('HGET', k.lock, 'token')
      local wk = wake_key(flag)
      for _, msg in ipairs(redis.call('LRANGE', wk, 0, -1)) do
        if msg:sub(1, #token + 1) == token .. '|' then
          redis.call('DEL', k.lock)
          owner = nil
        end
      end
      redis.call('DEL', wk)
    else
      redis.call('DEL', wake_key(flag))
    end
  end
end

if not redis.call('HGET', k.lock, 'owner') then
  grant_next(now)
end
local result = { lock_pttl() }
for _, f in ipairs(told) do result[#result + 1] = f end
return result
