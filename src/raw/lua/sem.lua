-- sem.lua: helpers of the semaphore's scripts, after common.lua and state.lua (whose
-- queue, waiters, wake-list and left-mark helpers it reuses as they are). See
-- docs/semaphores.md. KEYS of every semaphore script: [1] the semaphore's hash
-- (P:{N}:sem) [2] its fence [3] its queue [4] its waiters [5] its leases (zset hold -> expiry ms)
-- [6] its hand-offs (zset hold granted by another's script, its wake-up not known to be popped
-- -> the grantee's deadline, server ms).
--
-- The hash: ~kind ('sem' or 'rw'), ~cap, ~used (permits held), ~token (the last token given),
-- ~released (receipts: the last RECEIPTS tokens fully released), ~set ('1' once sem_capacity
-- stored the capacity: it binds every acquisition, used or not, and the hash lives at least
-- FENCE_TTL from then), and one field per hold, "<owner>#<attempt>" -> "token|permits|lease|meta".
-- A waiter's entry (state.lua) carries the permits it wants in front of its meta: "k;meta".
-- Network: a hold is named by owner and attempt, so a repeated acquire finds its own hold and a
-- release or renewal acts only on the hold of its attempt and token; receipts answer a repeated
-- release. Expiry is by the leases zset, on the server clock (as the mutex's TTLs); a hold whose
-- entry there was lost (the zset evicted) gets its whole lease again from the next script.
-- Foreign data (common.lua): the hash is recognized by its ~kind field, the leases and
-- hand-offs zsets by their members being hold ids (`zset_ours`: checked before a script's first
-- write to one, and before any write at all on a semaphore nobody uses), every due member read
-- for expiry or revocation too; other programs' data there is refused, never written to.

local S

local FOREIGN_ZSET = 'a sorted set of members fairlock did not write'

-- Whether `id` is a hold's id, "<client>:<thread>#<attempt>" (the leases' and hand-offs'
-- members).
local function is_hold_id(id)
  return string.match(id, '^.+:[^:#]*#%d+$') ~= nil
end

-- Refuse the leases or hand-offs zset `key` unless it is absent or its first member is a hold's
-- id (another program's sorted set is never written to). Once per key and run.
local function zset_ours(key)
  if S.ours[key] then return end
  S.ours[key] = true
  local first = read(key, 'ZRANGE', 0, 0)[1]
  if first and not is_hold_id(first) then refuse(key, FOREIGN_ZSET) end
end

-- The semaphore's hash fields every script needs, read once; `leases` is KEYS[5].
local function read_sem(keys)
  k.leases, k.handoffs = keys[5], keys[6]
  local v = read(k.lock, 'HMGET', '~kind', '~cap', '~used', '~token', '~released', '~set')
  local fields = 0
  for i = 1, 6 do
    if v[i] then fields = fields + 1 end
  end
  S = { kind = v[1], cap = tonumber(v[2]), used = tonumber(v[3]) or 0, token = tonumber(v[4]),
        released = v[5] or '', unread = not v[1], fields = fields, set = v[6] == '1', ours = {} }
  if S.unread then
    if redis.call('EXISTS', k.lock) == 1 then
      refuse(k.lock, "a hash without fairlock's semaphore fields")
    end
    -- a semaphore nobody uses: its zsets are checked before any write (in use, before each
    -- script's first write to them: zset_ours)
    zset_ours(k.leases)
    zset_ours(k.handoffs)
  end
  return S
end

local function hold_id(owner, attempt)
  return owner .. '#' .. fmt(attempt)
end

-- "token|permits|lease|meta" -> table (nil if none)
local function parse_hold(v)
  if not v then return nil end
  local t, p, l, meta = string.match(v, '^(%d+)|(%d+)|(%d+)|(.*)$')
  if not t then return nil end
  return { token = tonumber(t), token_text = t, permits = tonumber(p), lease = tonumber(l),
           meta = meta }
end

-- The permits a waiter's entry asks for (its meta starts with "k;").
local function wanted(w)
  return tonumber(string.match(w.meta, '^(%d+);')) or 1
end

-- Keep the semaphore's hash and leases for at least `ttl` ms (never shortening them). The
-- leases zset lives as long as the hash: a hold's permits come back only through its entry
-- there, so a zset that expired before the hash (with a dead holder's entry, at the moment it
-- fell due) would keep those permits taken for as long as the hash lives (the queue's TTL).
local function keep_sem(ttl)
  if redis.call('PTTL', k.lock) < ttl then redis.call('PEXPIRE', k.lock, ttl) end
  local hash_ttl = redis.call('PTTL', k.lock)
  zset_ours(k.leases)
  if hash_ttl > 0 and redis.call('PTTL', k.leases) < hash_ttl then
    redis.call('PEXPIRE', k.leases, hash_ttl)
  end
end

-- Give back the permits of hold `id` (parsed `h`).
local function drop_hold(id, h)
  S.used = math.max(S.used - h.permits, 0)
  redis.call('HDEL', k.lock, id)
  redis.call('ZREM', k.leases, id)
  redis.call('ZREM', k.handoffs, id)
  redis.call('HSET', k.lock, '~used', fmt(S.used))
end

-- Remove the messages to `owner` about `attempt` only: a thread may hold the permits of one
-- attempt while it waits with another, and a message about one (a late copy of its acquire, a
-- revoked grant) must never take the other's with it. Touches the wake list first thing, as
-- drop_wakeups does (an undeclared key).
local function drop_attempt_wakeups(owner, attempt)
  local wk, prefix = wake_of(owner)
  local msgs = read(wk, 'LRANGE', 0, -1)
  for _, msg in ipairs(msgs) do
    if not is_wakeup(msg) then refuse(wk, FOREIGN_LIST) end
  end
  local grant, retry = prefix .. 'g|' .. fmt(attempt) .. '|', prefix .. 'r|' .. fmt(attempt)
  for _, msg in ipairs(msgs) do
    if msg:sub(1, #grant) == grant or msg == retry then redis.call('LREM', wk, 1, msg) end
  end
end

-- The queue place of `owner`'s waiting attempt `w` goes, with the messages about that attempt.
local function forget_attempt(owner, w)
  drop_attempt_wakeups(owner, w.attempt)
  dequeue(owner)
end

-- Revoke the hand-offs whose grantee let its deadline pass without popping its wake-up (a dead
-- grantee: its permits go on at once, not after its lease). One whose wake-up was popped is
-- confirmed instead (removed from the zset): its holder has it. The deadline is on
-- the server clock, so a forward step can revoke an unpopped grant early (liveness, never
-- safety: the wake-up goes with the hold, so it cannot be popped after).
local function revoke_dead_grantees()
  local due = read(k.handoffs, 'ZRANGEBYSCORE', '-inf', now_ms())
  for _, id in ipairs(due) do
    if not is_hold_id(id) then refuse(k.handoffs, FOREIGN_ZSET) end
  end
  for _, id in ipairs(due) do
    local owner, attempt = string.match(id, '^(.*)#(%d+)$')
    local h = parse_hold(redis.call('HGET', k.lock, id))
    if h and owner and handoff_pending(owner, tonumber(attempt), h.token) then
      drop_attempt_wakeups(owner, tonumber(attempt))
      drop_hold(id, h)
    else
      redis.call('ZREM', k.handoffs, id)
    end
  end
end

-- Holds without a lease entry (the leases zset was evicted, or lost apart from the hash) would
-- never expire: each gets one from now for its whole lease, at least as long as its holder
-- counts on. Found out in O(1) (the hash's field count against the zset's); only a repair reads
-- every hold.
local function repair_leases()
  if S.used == 0 then return end
  local holds = redis.call('HLEN', k.lock) - S.fields
  if holds <= read(k.leases, 'ZCARD') then return end
  zset_ours(k.leases)
  local all, longest = redis.call('HGETALL', k.lock), 0
  for i = 1, #all, 2 do
    local id = all[i]
    if string.sub(id, 1, 1) ~= '~' and not read(k.leases, 'ZSCORE', id) then
      local h = parse_hold(all[i + 1])
      if h then
        redis.call('ZADD', k.leases, fmt(now_ms() + h.lease), id)
        longest = math.max(longest, h.lease)
      end
    end
  end
  if longest > 0 then keep_sem(longest) end
end

-- Remove the holds whose lease ran out (server clock) and give their permits back.
local function expire_holds()
  repair_leases()
  local gone = read(k.leases, 'ZRANGEBYSCORE', '-inf', now_ms())
  for _, id in ipairs(gone) do
    if not is_hold_id(id) then refuse(k.leases, FOREIGN_ZSET) end
  end
  for _, id in ipairs(gone) do
    local h = parse_hold(redis.call('HGET', k.lock, id))
    if h then
      drop_hold(id, h)
    else
      redis.call('ZREM', k.leases, id)
    end
  end
  return #gone
end

-- The next token (as the mutex's: max(last + 1, server time in us), and after the fence).
local function sem_next_token()
  local token = math.max((S.token or 0) + 1, now_us())
  local old = read(k.fence, 'SET', fmt(token), 'PX', FENCE_TTL, 'GET')
  local last = old and token_value(old)
  if old and not last then
    redis.call('SET', k.fence, old)
    refuse(k.fence, NOT_A_TOKEN)
  end
  if last and last >= token then
    token = last + 1
    redis.call('SET', k.fence, fmt(token), 'PX', FENCE_TTL)
  end
  S.token = token
  return token
end

-- A new hold of `permits` for owner's attempt. Returns its token.
local function take_permits(owner, attempt, permits, lease, meta, kind, cap)
  local token = sem_next_token()
  local id = hold_id(owner, attempt)
  S.used = S.used + permits
  S.kind, S.cap, S.unread = kind or S.kind, cap or S.cap, false
  redis.call('HSET', k.lock, id, fmt(token) .. '|' .. fmt(permits) .. '|' .. fmt(lease) .. '|' ..
    meta, '~used', fmt(S.used), '~token', fmt(token), '~kind', S.kind, '~cap', fmt(S.cap))
  zset_ours(k.leases)
  redis.call('ZADD', k.leases, fmt(now_ms() + lease), id)
  keep_sem(lease)
  return token
end


-- Grant to the queue's live heads while they fit: the first that does not fit stops the loop,
-- so nobody behind it is served before it. Each grant's wake-up is pushed first (state.lua,
-- offer_wakeup), as the mutex's grant does. Returns how many were granted.
local function grant_heads()
  local n = 0
  while S.cap do
    local head, w = live_head()
    if not head then break end
    local permits = wanted(w)
    if S.used + permits > S.cap then break end
    local now = now_ms()
    local guess = math.max((S.token or 0) + 1, now_us())
    local wk, sent, len = offer_wakeup(head, grant_message(w.attempt, guess) .. fmt(now))
    if not wk then break end
    local ok, token = pcall(take_permits, head, w.attempt, permits, w.lease,
      string.match(w.meta, '^%d+;(.*)$') or w.meta)
    if not ok then
      redis.call('LREM', wk, -1, sent)
      error(token, 0)
    end
    if token ~= guess then
      redis.call('LREM', wk, -1, sent)
      local _, prefix = wake_of(head)
      len = redis.call('RPUSH', wk, prefix .. grant_message(w.attempt, token) .. fmt(now))
    end
    -- the grantee must pop it within what is left of its waiter deadline, as the mutex's
    local left = math.max(w.deadline - waiters_now(), 0)
    zset_ours(k.handoffs)
    redis.call('ZADD', k.handoffs, fmt(now + left), hold_id(head, w.attempt))
    if redis.call('PTTL', k.handoffs) < w.lease then redis.call('PEXPIRE', k.handoffs, w.lease) end
    dequeue(head)
    keep_list(wk, len, w.lease)
    n = n + 1
  end
  return n
end
