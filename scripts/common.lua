-- common.lua: helpers prepended to every fairlock script (Redis 6.2 has no function libraries).
--
-- The keys of one lock named N under prefix P (all share the hash tag {N}, so one slot on Cluster):
--   P:{N}            HASH    owner, count, token, lease, since, meta      TTL = the holder's lease
--   P:{N}:fence      STRING  fencing counter, INCR on every new grant     no TTL (the only lasting key)
--   P:{N}:queue      ZSET    waiter flag -> arrival time (server us)      TTL >= the waiter timeout
--   P:{N}:waiters    HASH    waiter flag -> "deadline|lease|meta"         TTL >= the waiter timeout
--   P:{N}:released   ZSET    token -> release time, receipts for retries  TTL = RECEIPT
--   P:{N}:wake:<flag> LIST   one waiter's wake-ups                        TTL = grant lease / waiter timeout
--
-- States of a lock (owner = HGET P:{N} owner; head = first member of queue):
--   free                 no hash, empty queue
--   held                 hash, empty queue
--   held, queued         hash, queue non-empty (a release grants to the head)
--   granted              hash owned by a waiter whose wake list still holds "<token>|<ms>" (HANDOFF)
--   stranded             no hash, queue non-empty: the holder's lease ran out or a grant was revoked;
--                        any script that sees it (acquire, heartbeat) grants to the live head.
-- Wake-up messages: "<token>|<grant ms>" (HANDOFF: the lock is yours) or "retry" (NORMAL: run acquire
-- again, your queue entry was dropped as dead).
--
-- KEYS of every script: [1] lock hash [2] fence [3] queue [4] waiters [5] released.

local k = { lock = KEYS[1], fence = KEYS[2], queue = KEYS[3], waiters = KEYS[4], released = KEYS[5] }

-- One TIME per script (it does not change within a script anyway).
local clock = nil
local function now_us()
  if not clock then
    local t = redis.call('TIME')
    clock = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return clock
end

local function now_ms()
  return math.floor(now_us() / 1000)
end

local function wake_key(flag)
  return k.lock .. ':wake:' .. flag
end

local function check_fence()
  local f = redis.call('GET', k.fence)
  if f and not tonumber(f) then
    return 'FOREIGN key ' .. k.fence .. ' holds a non-numeric string; another program uses this key'
  end
  return nil
end

-- Scripts are not transactions: refuse foreign data before the first write so nothing is half-done.
local function foreign_key()
  local expected = { {k.lock, 'hash'}, {k.fence, 'string'}, {k.queue, 'zset'}, {k.waiters, 'hash'},
                     {k.released, 'zset'} }
  for _, e in ipairs(expected) do
    local t = redis.call('TYPE', e[1])['ok']
    if t ~= 'none' and t ~= e[2] then
      return 'FOREIGN key ' .. e[1] .. ' holds a ' .. t .. ' but fairlock expects a ' .. e[2] ..
        '; another program uses this key: choose another lock name or key prefix'
    end
  end
  -- the fence is a string either way: a non-numeric one would fail the INCR of a grant mid-script
  return check_fence()
end

-- "deadline|lease|meta" -> deadline, lease, meta
local function parse_waiter(v)
  local deadline, lease, meta = string.match(v, '^(%d+)|(%d+)|(.*)$')
  return tonumber(deadline), tonumber(lease), meta
end

-- Extend a key's TTL to at least ttl ms (never shorten: waiters of other clients may use longer ones).
local function keep_for(key, ttl)
  if redis.call('PTTL', key) < ttl then
    redis.call('PEXPIRE', key, ttl)
  end
end

local function enqueue(flag, now, waiter_ttl, lease, meta)
  local added = false
  if not redis.call('ZSCORE', k.queue, flag) then
    local score = now_us()
    local tail = redis.call('ZRANGE', k.queue, -1, -1, 'WITHSCORES')
    if tail[2] and tonumber(tail[2]) >= score then
      score = tonumber(tail[2]) + 1
    end
    redis.call('ZADD', k.queue, string.format('%.0f', score), flag)
    -- a fresh wait: drop wake-ups left from an earlier one
    redis.call('DEL', wake_key(flag))
    added = true
  end
  redis.call('HSET', k.waiters, flag, string.format('%.0f|%d|%s', now + waiter_ttl, lease, meta))
  keep_for(k.queue, 2 * waiter_ttl)
  keep_for(k.waiters, 2 * waiter_ttl)
  return added
end

-- Only called when the lock hash does not exist (every hash fairlock writes has an owner).
local function take(flag, lease, meta, now)
  local token = redis.call('INCR', k.fence)
  redis.call('HSET', k.lock, 'owner', flag, 'count', 1, 'token', token, 'lease', lease, 'since', now,
    'meta', meta)
  redis.call('PEXPIRE', k.lock, lease)
  return token
end

-- Remove dead waiters from the front of the queue; return the first live one (or nil) and its
-- waiters entry.
local function live_head(now)
  while true do
    local head = redis.call('ZRANGE', k.queue, 0, 0)[1]
    if not head then return nil end
    local v = redis.call('HGET', k.waiters, head)
    if v then
      local deadline = parse_waiter(v)
      if deadline >= now then return head, v end
    end
    redis.call('ZREM', k.queue, head)
    redis.call('HDEL', k.waiters, head)
    redis.call('DEL', wake_key(head))
  end
end

-- Hand the (free) lock to the live head of the queue: the release grants, the waiter needs no
-- further round trip. Its waiters entry stays until the grant is popped, so a janitor can revoke a
-- grant whose waiter died. Returns the grantee's flag or false.
local function grant_next(now)
  local head, entry = live_head(now)
  if not head then return false end
  local _, lease, meta = parse_waiter(entry)
  redis.call('ZREM', k.queue, head)
  local token = take(head, lease, meta, now)
  local wk = wake_key(head)
  redis.call('DEL', wk)
  redis.call('RPUSH', wk, token .. '|' .. string.format('%.0f', now))
  -- the message expires with the grant, so a late pop can never hold a lock that expired meanwhile
  redis.call('PEXPIRE', wk, lease)
  return head
end

local function lock_pttl()
  local p = redis.call('PTTL', k.lock)
  if p < 0 then return 0 end
  return p
end
