-- common.lua: helpers prepended to every fairlock script (Redis 6.2 has no function libraries).
--
-- The keys of one lock named N under prefix P (all share the hash tag {N}, so one slot):
--   P:{N}             HASH    owner, attempt, count, token, lease, since, meta    TTL = the lease
--                             + wdl, vc while a hand-off waits to be picked up
--   P:{N}:fence       STRING  the last token handed out                           TTL = fence ttl
--   P:{N}:queue       ZSET    owner -> arrival time (server us)                   TTL = QUEUE_TTL
--   P:{N}:waiters     HASH    owner -> "attempt|deadline|lease|meta", ~clock      TTL = QUEUE_TTL
--   P:{N}:released    ZSET    token -> release time, receipts for retries         TTL = receipt ttl
--   P:{N}:wake:<owner> LIST   one thread's wake-ups                               TTL = lease / waiter ttl
--
-- An owner is "<client id>:<thread number>". Each call of a thread that may take the lock is an
-- *attempt* with a number that grows with every call of that client. The attempt is stored with
-- the queue entry and the hold, and every script acts on "this thread's" entry or hold only for
-- the attempt it was sent for: a request that arrives late, after its sender gave up and moved on
-- to a newer attempt, finds a newer attempt number and does nothing.
--
-- States of a lock (owner = HGET P:{N} owner; head = first member of the queue):
--   free        no hash, empty queue
--   held        hash, queue maybe non-empty (a release grants to the live head)
--   handed off  hash with wdl whose owner's wake list still holds "g|attempt|token|ms"
--   stranded    no hash, queue non-empty (a lease ran out, a hand-off was revoked): any script
--               that sees it (acquire, heartbeat, force_unlock) grants to the live head
-- Invariant: a waiters entry exists only for a queued owner (grant, leave and purge remove both;
-- only a lost queue key breaks it, and then the owner's heartbeat tells it to retry).
-- Wake-ups: "g|<attempt>|<token>|<grant ms>" (the lock is yours) or "r|<attempt>" (your queue
-- entry is gone: run acquire again). A waiter ignores messages for other attempts.
--
-- Time. Redis's clock is the wall clock and may step. Liveness deadlines of waiters are kept on a
-- *virtual clock* per key (field ~clock of the waiters hash, field vc of the lock hash): it
-- advances with the wall clock, but never backwards and by at most CAP (a third of the waiter
-- timeout) between two scripts, so a clock step of either sign neither purges live waiters nor
-- keeps dead ones for more than a few heartbeats. Leases are Redis TTLs: a forward step of the
-- server clock shortens them (README: Limits). Tokens are max(last + 1, server time in us), so
-- they keep rising across data loss as long as the server clock does.
--
-- KEYS of every script: [1] lock hash [2] fence [3] queue [4] waiters [5] released.
-- ARGV of every script: [1] fence ttl ms [2] waiter timeout ms; the script's own from [3].
-- Every number that goes into a string is formatted with %.0f (Lua's tostring gives 1.7e+15).

local k = { lock = KEYS[1], fence = KEYS[2], queue = KEYS[3], waiters = KEYS[4], released = KEYS[5] }
local FENCE_TTL = tonumber(ARGV[1])
local WAITER_TTL = tonumber(ARGV[2])
local CAP = math.floor(WAITER_TTL / 3)
-- the queue outlives a forward clock step of up to 10 minutes (its entries' own deadlines are
-- virtual); it is deleted as soon as it is empty
local QUEUE_TTL = math.max(2 * WAITER_TTL, 600000)

local function fmt(n)
  return string.format('%.0f', n)
end

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

-- The virtual clock kept in field `field` of hash `key` (see "Time" above). Only call it on a
-- hash that exists or is about to be written.
local vclocks = {}
local function vclock(key, field)
  local memo = vclocks[key]
  if memo then return memo end
  local real = now_ms()
  local v = real
  local c = redis.call('HGET', key, field)
  if c then
    local cv, cr = string.match(c, '^(%d+)|(%d+)$')
    if cv then
      v = tonumber(cv) + math.min(math.max(real - tonumber(cr), 0), CAP)
    end
  end
  redis.call('HSET', key, field, fmt(v) .. '|' .. fmt(real))
  vclocks[key] = v
  return v
end

local function waiters_now()
  return vclock(k.waiters, '~clock')
end

local function lock_now()
  return vclock(k.lock, 'vc')
end

local function wake_key(owner)
  return k.lock .. ':wake:' .. owner
end

-- The fence as read by the type checks (one GET a script), for next_token.
local fence_read = false
local fence_value = nil

local function check_fence()
  local f = redis.call('GET', k.fence)
  fence_read, fence_value = true, f
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
  -- the fence is a string either way: a non-numeric one would fail a grant mid-script
  return check_fence()
end

-- "attempt|deadline|lease|meta" -> table
local function parse_waiter(v)
  local attempt, deadline, lease, meta = string.match(v, '^(%d+)|(%d+)|(%d+)|(.*)$')
  if not attempt then return nil end
  return { attempt = tonumber(attempt), deadline = tonumber(deadline), lease = tonumber(lease),
           meta = meta }
end

local function waiter_entry(owner)
  local v = redis.call('HGET', k.waiters, owner)
  if not v then return nil end
  return parse_waiter(v)
end

local function write_waiter(owner, attempt, deadline, lease, meta)
  redis.call('HSET', k.waiters, owner, fmt(attempt) .. '|' .. fmt(deadline) .. '|' .. fmt(lease) ..
    '|' .. meta)
end

-- The waiters hash (and its clock) goes with the last queue entry.
local function drop_waiters_if_queue_empty()
  if redis.call('EXISTS', k.queue) == 0 then
    redis.call('DEL', k.waiters)
    vclocks[k.waiters] = nil
  end
end

-- Remove an owner's queue entry and wake list, whatever attempt they belong to.
local function forget_waiter(owner)
  redis.call('ZREM', k.queue, owner)
  redis.call('HDEL', k.waiters, owner)
  redis.call('DEL', wake_key(owner))
  drop_waiters_if_queue_empty()
end

local function enqueue(owner, attempt, lease, meta)
  if not redis.call('ZSCORE', k.queue, owner) then
    local score = now_us()
    local tail = redis.call('ZRANGE', k.queue, -1, -1, 'WITHSCORES')
    if tail[2] and tonumber(tail[2]) >= score then
      score = tonumber(tail[2]) + 1
    end
    redis.call('ZADD', k.queue, fmt(score), owner)
    -- a fresh wait: drop wake-ups left from an earlier one
    redis.call('DEL', wake_key(owner))
  end
  write_waiter(owner, attempt, waiters_now() + WAITER_TTL, lease, meta)
  redis.call('PEXPIRE', k.queue, QUEUE_TTL)
  redis.call('PEXPIRE', k.waiters, QUEUE_TTL)
end

-- The next token: above the last one, and above the server clock in us, so tokens keep rising
-- when the fence is lost (restart without persistence, failover, eviction, its TTL).
local function next_token()
  if not fence_read then fence_value = redis.call('GET', k.fence) end
  local last = tonumber(fence_value or '0')
  local token = math.max(last + 1, now_us())
  redis.call('SET', k.fence, fmt(token), 'PX', FENCE_TTL)
  fence_read, fence_value = true, fmt(token)
  return token
end

-- A new hold (the lock hash must not exist). Returns the token. `...`: more field, value pairs.
local function take(owner, attempt, lease, meta, ...)
  local token = next_token()
  redis.call('HSET', k.lock, 'owner', owner, 'attempt', fmt(attempt), 'count', 1, 'token', fmt(token),
    'lease', fmt(lease), 'since', fmt(now_ms()), 'meta', meta, ...)
  redis.call('PEXPIRE', k.lock, lease)
  return token
end

-- Remove dead waiters from the front of the queue; return the first live one and its entry.
local function live_head()
  local purged = false
  while true do
    local head = redis.call('ZRANGE', k.queue, 0, 0)[1]
    if not head then
      -- whoever else emptied the queue dropped the waiters hash (a lost queue key leaves it to
      -- the heartbeats, which tell its waiters to retry)
      if purged then drop_waiters_if_queue_empty() end
      return nil
    end
    local w = waiter_entry(head)
    if w and w.deadline >= waiters_now() then return head, w end
    purged = true
    redis.call('ZREM', k.queue, head)
    redis.call('HDEL', k.waiters, head)
    redis.call('DEL', wake_key(head))
  end
end

local function grant_message(attempt, token)
  return 'g|' .. fmt(attempt) .. '|' .. fmt(token) .. '|'
end

-- Hand the (free) lock to the live head of the queue: the release grants, the waiter needs no
-- further round trip. The grantee's liveness moves into the lock hash (wdl, on the hash's own
-- virtual clock vc), so a heartbeat can revoke a hand-off whose grantee died before popping it.
-- Returns the grantee or false.
local function grant_next()
  local head, w = live_head()
  if not head then return false end
  local left = math.max(w.deadline - waiters_now(), 0)
  redis.call('ZREM', k.queue, head)
  redis.call('HDEL', k.waiters, head)
  local now = now_ms()
  local token = take(head, w.attempt, w.lease, w.meta, 'vc', fmt(now) .. '|' .. fmt(now), 'wdl',
    fmt(now + left))
  vclocks[k.lock] = now
  local wk = wake_key(head)
  redis.call('DEL', wk)
  redis.call('RPUSH', wk, grant_message(w.attempt, token) .. fmt(now))
  -- the message expires with the grant, so a late pop can never hold a lock that expired meanwhile
  redis.call('PEXPIRE', wk, w.lease)
  drop_waiters_if_queue_empty()
  return head
end

-- Whether the hand-off of this hold still waits in its grantee's wake list.
local function handoff_pending(owner, attempt, token)
  local prefix = grant_message(attempt, token)
  for _, msg in ipairs(redis.call('LRANGE', wake_key(owner), 0, -1)) do
    if msg:sub(1, #prefix) == prefix then return true end
  end
  return false
end

local function lock_pttl()
  local p = redis.call('PTTL', k.lock)
  if p < 0 then return 0 end
  return p
end

-- The lease left of a grant, as reported to its holder: at most the hold's lease, since a
-- backward step of the server clock can leave a TTL longer than that, which no renewal keeps.
local function grant_pttl()
  local lease = tonumber(redis.call('HGET', k.lock, 'lease')) or 0
  return math.min(lock_pttl(), lease)
end
