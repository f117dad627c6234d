-- acquire.lua: first attempt of a thread that does not hold the lock (and every retry of it).
-- ARGV: [1] flag (client id:thread) [2] lease ms [3] 'try' (never queue) or 'wait'
--       [4] waiter timeout ms [5] meta "host|pid|thread"
-- Returns {'granted', token, now_ms, pttl} | {'busy', holder pttl, now_ms} | {'queued', now_ms, pttl}
-- Invariants: no barging (a free lock with live waiters goes to the head, never to the caller);
-- idempotent for one flag (a retry after a lost reply keeps the queue place or claims the grant).
local flag, lease, mode, waiter_ttl, meta = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]), ARGV[5]
local bad = foreign_key()
if bad then return redis.error_reply(bad) end
local now = now_ms()

local owner = redis.call('HGET', k.lock, 'owner')
if owner == flag then
  -- Granted to this thread (a hand-off whose wake-up it never received) or a hold whose guard is
  -- gone: the thread holds no guard, so this is a fresh hold of depth 1 with the granted token.
  redis.call('HSET', k.lock, 'count', 1, 'lease', lease)
  redis.call('PEXPIRE', k.lock, lease)
  redis.call('ZREM', k.queue, flag)
  redis.call('HDEL', k.waiters, flag)
  redis.call('DEL', wake_key(flag))
  return { 'granted', tonumber(redis.call('HGET', k.lock, 'token')), now, lease }
end

if not owner then
  local head = live_head(now)
  if not head or head == flag then
    redis.call('ZREM', k.queue, flag)
    redis.call('HDEL', k.waiters, flag)
    redis.call('DEL', wake_key(flag))
    return { 'granted', take(flag, lease, meta, now), now, lease }
  end
  grant_next(now)
end

if mode == 'try' then
  return { 'busy', lock_pttl(), now }
end
enqueue(flag, now, waiter_ttl, lease, meta)
return { 'queued', now, lock_pttl() }
