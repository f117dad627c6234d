-- sem.lua: the semaphore's admission and its holds, after common.lua and state.lua, whose queue
-- core it uses as the lock does (queue, waiters, wake lists, left marks, tokens, the grant with
-- its wake-up, hand-offs on the hand-off clock and their revocation, the grant loop): this file
-- supplies what only the semaphore has, its holds and leases and its admission rule (sem_open,
-- sem_fits, sem_take for state.lua's grant_live_heads). See docs/semaphores.md.
-- KEYS of every semaphore script: [1] the semaphore's hash
-- (P:{N}:sem) [2] its fence [3] its queue [4] its waiters [5] its leases (zset hold -> expiry ms)
-- [6] its hand-offs (zset hold granted by another's script, its wake-up not known to be popped
-- -> the grantee's deadline on the hand-off clock, state.lua).
--
-- The hash: ~kind ('sem' or 'rw'), ~cap, ~used (permits held), ~token (the last token given),
-- ~released (receipts: the last RECEIPTS tokens fully released), ~set ('1' once sem_capacity
-- stored the capacity: it binds every acquisition, used or not, and the hash lives at least
-- FENCE_TTL from then), ~vc and ~vcap (the hand-off clock and its cap, from the first grant
-- that was a hand-off on), and one field per hold, "<owner>#<attempt>" ->
-- "token|permits|lease|meta".
-- A waiter's entry (state.lua) carries the permits it wants in front of its meta: "k;meta".
-- Network: a hold is named by owner and attempt, so a repeated acquire finds its own hold and a
-- release or renewal acts only on the hold of its attempt and token; receipts answer a repeated
-- release. A hand-off's deadline is on the hand-off clock (the lock's, state.lua), so a repeated
-- or late heartbeat only moves it to WAITER_TTL from that copy's run, and a clock step neither
-- revokes a live grantee's grant early nor keeps a dead one's beyond a few calls. Expiry is by
-- the leases zset, on the server clock (as the mutex's TTLs); a hold whose
-- entry there was lost (the zset evicted) gets its whole lease again from the next script.
-- Foreign data (common.lua): the hash is recognized by its ~kind field, the leases and
-- hand-offs zsets by their members being hold ids (`zview`: checked before a script's first
-- write to one, and before any write at all on a semaphore nobody uses), every due member read
-- for expiry or revocation too; other programs' data there is refused, never written to.
-- Undeclared keys (common.lua, "Undeclared keys"): the same as the lock's, through state.lua:
-- the left marks, the caller's wake list and each grantee's (a grant's first write, taken back
-- if the grant is refused after it). Refusals: another program's zset is refused before this
-- run's first write to it (zview); a hold's field and ~used are written by one HSET and its
-- lease entry right after, with nothing between them that can be refused (expire_holds, first
-- in every script that takes or drops a hold, viewed the leases zset), so a refusal ends a run
-- between whole steps, never between a hold and its lease entry.
-- Sizes: the leases zset has one entry per hold (at most the capacity: a hold takes a permit or
-- more), the hand-offs zset one per hold granted by another's script and not yet confirmed;
-- both go with the hash. The fuzzer bounds every key's entries (tests/it/fuzz/checks.rs, 8'').

local S

local FOREIGN_ZSET = 'a sorted set of members fairlock did not write'

-- Whether `id` is a hold's id, "<client>:<thread>#<attempt>" (the leases' and hand-offs'
-- members).
local function is_hold_id(id)
  return string.match(id, '^.+:[^:#]*#%d+$') ~= nil
end

-- This run's view of the leases or hand-offs zset `key`, read once a run (its first two members,
-- ZRANGE 0 1 WITHSCORES), refusing it unless it is absent or those members are hold ids (another
-- program's sorted set is never written to). One call serves what took four: the foreign-data
-- check, whether any member is due (`first`: the lowest score), whether the zset is empty (the
-- leases' repair check, the hand-offs' `sem_pending`) and whether this run's ZADD creates it
-- (then it has no TTL yet: `fresh`, and keep_sem and sem_take set one without asking PTTL;
-- `unsure` when this run removed members it did not count and may have emptied it).
-- `n`: how many members it has at least, exactly when `exact` (fewer than two were read); kept
-- true by this run's own changes (zrem, zadd: every ZREM and ZADD of these keys goes through
-- them), and `first` stays a lower bound of the lowest score (a ZADD lowers it; a ZREM only
-- raises the true one), so a view that says "nothing is due" is never wrong.
local function zview(key)
  local v = S.z[key]
  if v then return v end
  local r = read(key, 'ZRANGE', 0, 1, 'WITHSCORES')
  for i = 1, #r, 2 do
    if not is_hold_id(r[i]) then refuse(key, FOREIGN_ZSET) end
  end
  v = { first = tonumber(r[2]), n = #r / 2, exact = #r < 4, fresh = false, unsure = false }
  S.z[key] = v
  return v
end

-- ZREM `id` from the leases or hand-offs zset `key`, keeping this run's view of it true.
local function zrem(key, id)
  local gone = redis.call('ZREM', key, id)
  local v = S.z[key]
  if v then v.n = math.max(v.n - gone, 0) end
end

-- ZADD `id` at `score` (formatted) to the leases or hand-offs zset `key`, as zrem.
local function zadd(key, score, id)
  local v = S.z[key]
  if v and v.n == 0 then
    if v.exact then v.fresh = true else v.unsure = true end
  end
  local added = redis.call('ZADD', key, score, id)
  if v then
    v.n = v.n + added
    v.first = math.min(v.first or math.huge, tonumber(score))
  end
end

-- The names of the semaphore's hand-off clock fields (state.lua, handoff_now).
local SEM_CLOCK = { '~vc', '~vcap' }

-- The semaphore's hash fields every script needs, read once; `leases` is KEYS[5]. `id`: the
-- hold the script acts on, read with them (S.hold, its stored value, kept true by this run's own
-- changes: take_permits and drop_hold), so that no script asks for it again. `saved`: the kind,
-- capacity and permits held as stored (as this run wrote them), so that a write that would
-- store them again is left out.
local function read_sem(keys, id)
  k.leases, k.handoffs = keys[5], keys[6]
  local v = read(k.lock, 'HMGET', '~kind', '~cap', '~used', '~token', '~released', '~set', '~vc',
    '~vcap', id or '~kind')
  S = { kind = v[1], cap = tonumber(v[2]), used = tonumber(v[3]) or 0, token = tonumber(v[4]),
        released = v[5] or '', unread = not v[1], set = v[6] == '1', z = {},
        vc = v[7], vcap = math.min(tonumber(v[8]) or CAP, CAP), clock = SEM_CLOCK,
        id = id, hold = id and v[9], saved = { kind = v[1], cap = v[2], used = v[3] } }
  if S.unread then
    if redis.call('EXISTS', k.lock) == 1 then
      refuse(k.lock, "a hash without fairlock's semaphore fields")
    end
    -- a semaphore nobody uses: its zsets are checked before any write (in use, before each
    -- script's first write to them: zview)
    zview(k.leases)
    zview(k.handoffs)
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

-- The hold the script acts on (read_sem's `id`), parsed; nil when there is none.
local function own_hold()
  return parse_hold(S.hold)
end

-- The permits a waiter's entry asks for (its meta starts with "k;").
local function wanted(w)
  return tonumber(string.match(w.meta, '^(%d+);')) or 1
end

-- Keep the semaphore's hash and leases for at least `ttl` ms (never shortening them). The
-- leases zset lives as long as the hash: a hold's permits come back only through its entry
-- there, so a zset that expired before the hash (with a dead holder's entry, at the moment it
-- fell due) would keep those permits taken for as long as the hash lives (the queue's TTL).
-- So the leases zset, whenever it exists, lives at least as long as the hash: every raise of
-- the hash's TTL is made here and gives the zset the same, and a zset this run creates (zadd:
-- `fresh`, no TTL yet) gets the hash's. Neither TTL is read again: the hash's is read once
-- (after a PEXPIRE it is `ttl`), the zset's only when this run may have emptied it and made it
-- anew (`unsure`: it removed more members than its view counted); a zset that outlived a lost
-- hash gets the new hash's TTL with its first raise.
local function keep_sem(ttl)
  local hash_ttl, raised = redis.call('PTTL', k.lock), false
  if hash_ttl < ttl then
    -- (a missing hash gets none: -2, as PTTL would say)
    raised = redis.call('PEXPIRE', k.lock, ttl) == 1
    hash_ttl = raised and ttl or -2
  end
  local v = zview(k.leases)
  if hash_ttl > 0 and (v.fresh or (raised and not (v.exact and v.n == 0))
      or (v.unsure and redis.call('PTTL', k.leases) < hash_ttl)) then
    redis.call('PEXPIRE', k.leases, hash_ttl)
    v.fresh, v.unsure = false, false
  end
end

-- Give back the permits of hold `id` (parsed `h`). `...`: more field, value pairs for the
-- hash's write of the permits held (a release's receipts).
local function drop_hold(id, h, ...)
  S.used = math.max(S.used - h.permits, 0)
  redis.call('HDEL', k.lock, id)
  zrem(k.leases, id)
  zrem(k.handoffs, id)
  redis.call('HSET', k.lock, '~used', fmt(S.used), ...)
  S.saved.used = fmt(S.used)
  if id == S.id then S.hold = nil end
end

-- Revoke the hand-offs whose grantee let its deadline pass without popping its wake-up (a dead
-- grantee: its permits go on at once, not after its lease; state.lua, handoff_dead). One whose
-- wake-up was popped is confirmed instead (removed from the zset): its holder has it. The
-- deadlines are on the hand-off clock (state.lua), kept in the hash from the first grant on, so
-- a forward step of the server clock does not revoke a live grantee's grant early.
local function revoke_dead_grantees()
  if not S.vc then return end -- no hand-off since the hash was made
  local now = handoff_now(S)
  local first = zview(k.handoffs).first
  if not first or first >= now then return end -- none due (the earliest deadline is not past)
  local due = read(k.handoffs, 'ZRANGEBYSCORE', '-inf', '(' .. fmt(now), 'WITHSCORES')
  for i = 1, #due, 2 do
    if not is_hold_id(due[i]) then refuse(k.handoffs, FOREIGN_ZSET) end
  end
  for i = 1, #due, 2 do
    local id = due[i]
    local owner, attempt = string.match(id, '^(.*)#(%d+)$')
    local h = parse_hold(redis.call('HGET', k.lock, id))
    if h and owner and handoff_dead(owner, tonumber(attempt), h.token, tonumber(due[i + 1]), now)
    then
      drop_attempt_wakeups(owner, tonumber(attempt))
      drop_hold(id, h)
    else
      zrem(k.handoffs, id)
    end
  end
end

-- Holds without a lease entry (the leases zset was evicted, or lost apart from the hash) would
-- never expire: each gets one from now for its whole lease, at least as long as its holder
-- counts on. Found out from this run's view of the zset (zview, read anyway): permits are held
-- and the zset is missing. A zset is lost whole (eviction, expiry, a lost write is a lost
-- script: its writes replicate and persist together), never one entry of it, and every script
-- that adds a lease entry runs this check first, so the zset is either missing or has every
-- hold's entry (the holds written after a loss are repaired before one more entry is added).
-- Only a repair reads every hold.
local function repair_leases()
  if S.used == 0 or zview(k.leases).n > 0 then return end
  local all, longest = redis.call('HGETALL', k.lock), 0
  for i = 1, #all, 2 do
    local id = all[i]
    if string.sub(id, 1, 1) ~= '~' then
      local h = parse_hold(all[i + 1])
      if h then
        zadd(k.leases, fmt(now_ms() + h.lease), id)
        longest = math.max(longest, h.lease)
      end
    end
  end
  if longest > 0 then keep_sem(longest) end
end

-- Remove the holds whose lease ran out (server clock) and give their permits back.
local function expire_holds()
  repair_leases()
  local first = zview(k.leases).first
  if not first or first > now_ms() then return 0 end -- none ran out (the earliest end is ahead)
  local gone = read(k.leases, 'ZRANGEBYSCORE', '-inf', now_ms())
  for _, id in ipairs(gone) do
    if not is_hold_id(id) then refuse(k.leases, FOREIGN_ZSET) end
  end
  for _, id in ipairs(gone) do
    local h = parse_hold(redis.call('HGET', k.lock, id))
    if h then
      drop_hold(id, h)
    else
      zrem(k.leases, id)
    end
  end
  return #gone
end

-- A new hold of `permits` for owner's attempt (its token: state.lua, next_token). `...`: more
-- field, value pairs for the hash (a hand-off's clock). Returns its token.
local function take_permits(owner, attempt, permits, lease, meta, kind, cap, ...)
  local token = next_token(S.token)
  S.token = token
  local id = hold_id(owner, attempt)
  S.used = S.used + permits
  S.kind, S.cap, S.unread = kind or S.kind, cap or S.cap, false
  local hold = fmt(token) .. '|' .. fmt(permits) .. '|' .. fmt(lease) .. '|' .. meta
  redis.call('HSET', k.lock, id, hold, '~used', fmt(S.used), '~token', fmt(token), '~kind',
    S.kind, '~cap', fmt(S.cap), ...)
  S.saved = { kind = S.kind, cap = fmt(S.cap), used = fmt(S.used) }
  if id == S.id then S.hold = hold end
  zview(k.leases)
  zadd(k.leases, fmt(now_ms() + lease), id)
  keep_sem(lease)
  return token
end


-- The semaphore's admission (state.lua, grant_live_heads): room while a capacity is known; a
-- head fits when its permits do; taking it writes the hold, then its hand-off's deadline in the
-- hand-offs zset (after the take: its member names a hold that exists).
local function sem_open()
  return S.cap ~= nil
end

local function sem_fits(w)
  return S.used + wanted(w) <= S.cap
end

local function sem_take(owner, w, deadline, ...)
  -- (checked before the take's first write: another program's zset is never written to)
  local v = zview(k.handoffs)
  local token = take_permits(owner, w.attempt, wanted(w), w.lease,
    string.match(w.meta, '^%d+;(.*)$') or w.meta, nil, nil, ...)
  zadd(k.handoffs, fmt(deadline), hold_id(owner, w.attempt))
  -- (created by this ZADD, it has no TTL: no need to ask)
  if v.fresh or redis.call('PTTL', k.handoffs) < w.lease then
    redis.call('PEXPIRE', k.handoffs, w.lease)
    v.fresh = false
  end
  return token
end

-- Whether a hand-off may be pending (the hand-off clock's cap then only comes down): this
-- run's view of the hand-offs zset tells, unless this run removed members it did not see.
local function sem_pending()
  local v = zview(k.handoffs)
  if v.n > 0 or v.exact then return v.n > 0 end
  return read(k.handoffs, 'ZCARD') > 0
end

-- Grant to the queue's live heads while they fit (state.lua, grant_live_heads): the first that
-- does not fit stops the loop, so nobody behind it is served before it. Returns how many were
-- granted.
local function grant_heads()
  S.open, S.fits, S.take, S.pending = sem_open, sem_fits, sem_take, sem_pending
  return (grant_live_heads(S))
end
