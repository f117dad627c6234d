-- state.lua: the queue core of every primitive, and the lock's own hash and admission,
-- prepended after common.lua to the scripts that take the lock or change the queue, and to every
-- semaphore script (before sem.lua). See common.lua for the keys and states.
-- The queue core, each part once for the lock and the semaphore: the wake lists, the tokens
-- (next_token over the last token the primitive's state knows), the queue and waiters, the left
-- marks, and (last, "the queue core: hand-offs, grants, revocation") the hand-off clock and
-- deadline, the revocation judgement, the grant with its wake-up and the grant loop over live
-- heads. A primitive supplies only its admission rule (grant_live_heads: open, fits, take) and
-- where it keeps a hand-off's deadline: the lock's is below ("the lock hash", take, "the lock's
-- admission"), the semaphore's in sem.lua. (One file, not two: Redis 6.2 runs each script as
-- these files followed by its own, and the lock's take sits between the tokens and the grant.)
-- Network: a repeated or late script finds the state these helpers left: a grant removes the
-- grantee's queue entry, so a repeat cannot grant twice; a new queue place drops its owner's
-- older wake-ups, so a lapsed grant cannot be popped after it; the tombstone keeps the receipts
-- a repeated release looks for; a hand-off's deadline is on the hand-off clock, which a
-- repeated or late call only reads (moving it on as real time allows), so a repeat neither
-- revokes a live grantee's grant nor keeps a dead one's. Wake lists are shared by a client's threads: a repeated or late
-- removal takes only its own thread's messages (drop_wakeups), never a neighbour's, and a push
-- never shortens the list's TTL under others' messages (push_wakeup). A left mark keeps the
-- newest attempt marked, so a repeated or late mark of an older one changes nothing (mark_left).

-- ---- the lock hash --------------------------------------------------------------------------

-- The names of the lock's hand-off clock fields (see handoff_now), shared by every run.
local LOCK_CLOCK = { 'vc', 'vcap' }

-- The lock hash as this script first saw it; owner is false when the lock is free. `unread`:
-- it has no owner field, so it is either missing or another program's hash (fairlock's always
-- has one: '' for a tombstone); `take` tells which before it writes. (Not the receipts: only a
-- release reads them, read_lock_to_release.)
local function read_lock()
  local v = read(k.lock, 'HMGET', 'owner', 'attempt', 'token', 'lease', 'wdl', 'vc', 'vcap')
  local owner = v[1]
  if owner == '' then owner = false end
  return { owner = owner, attempt = tonumber(v[2]) or 0, token = tonumber(v[3]), token_text = v[3],
           lease = tonumber(v[4]) or 0, wdl = tonumber(v[5]), vc = v[6],
           vcap = math.min(tonumber(v[7]) or CAP, CAP), clock = LOCK_CLOCK, unread = not v[1] }
end

-- The lock hash as a release needs it, on the hand-off's critical path: the fields a release
-- and its grant read (owner, token, the receipts, the hand-off clock), and the hold's attempt
-- only with `attempt_too` (a release asked for a left mark); no lease (the grant writes the
-- grantee's) nor wdl (a release judges no hand-off). As read_lock otherwise.
local function read_lock_to_release(attempt_too)
  local v
  if attempt_too then
    v = read(k.lock, 'HMGET', 'owner', 'token', 'released', 'vc', 'vcap', 'attempt')
  else
    v = read(k.lock, 'HMGET', 'owner', 'token', 'released', 'vc', 'vcap')
  end
  local owner = v[1]
  if owner == '' then owner = false end
  return { owner = owner, attempt = attempt_too and tonumber(v[6]) or 0, token = tonumber(v[2]),
           token_text = v[2], released = v[3] or '', vc = v[4],
           vcap = math.min(tonumber(v[5]) or CAP, CAP), clock = LOCK_CLOCK, unread = not v[1] }
end

-- The last token handed out as far as this run can tell (the hash's token, or the fence when
-- the hash is gone; 0 when both are): every grant made after this run has a greater token, so
-- a waiter that reads it knows which grants came after its request (see the client's
-- `judge_handoff` (src/lease_estimate.rs)).
local function last_token(h)
  -- every take writes the fence and the hash's token together, so a hash with a token holds
  -- the fence's value (or a greater one, when the fence alone was evicted)
  return h.token or read_fence() or 0
end

-- ---- wake lists -----------------------------------------------------------------------------
-- One list per lock per client ("<lock>:wake:<client id>"), shared by that client's waiting
-- threads; whichever of them leads the client's one BLPOP pops it and hands each message to the
-- thread of its attempt (src/waker.rs). A
-- message starts with the thread's number, so a script can remove one thread's messages without
-- touching its neighbours'.

-- owner "<client id>:<thread>" -> its client's wake list, and the prefix of its messages
local function wake_of(owner)
  local client, thread = string.match(owner, '^(.*):([^:]*)$')
  if not client then client, thread = owner, '' end
  return k.lock .. ':wake:' .. client, thread .. '|'
end

-- Whether `msg` is a wake-up fairlock wrote ("<thread>|g|..." or "<thread>|r|...").
local function is_wakeup(msg)
  return string.match(msg, '^[^|]*|[gr]|') ~= nil
end

local FOREIGN_LIST = 'a list of messages fairlock did not write'

-- Remove `owner`'s messages about `attempt` and older ones, never those of a newer attempt of
-- the thread (a late copy of an old request must not take the wake-up of the thread's newer
-- grant); with `only`, those about `attempt` alone (drop_attempt_wakeups). Its first call
-- touches the list (undeclared, see "Undeclared keys"): callers make it before their first
-- write of a unit of work.
local function drop_wakeups_upto(owner, attempt, only)
  local wk, prefix = wake_of(owner)
  local msgs = read(wk, 'LRANGE', 0, -1)
  for _, msg in ipairs(msgs) do
    if not is_wakeup(msg) then refuse(wk, FOREIGN_LIST) end
  end
  for _, msg in ipairs(msgs) do
    if msg:sub(1, #prefix) == prefix then
      local a = tonumber(string.match(msg, '^[^|]*|[gr]|(%d+)'))
      if only then
        if a == attempt then redis.call('LREM', wk, 1, msg) end
      elseif not a or a <= attempt then
        redis.call('LREM', wk, 1, msg)
      end
    end
  end
end

-- Remove every message to `owner`, whatever attempt it is for (as drop_wakeups_upto).
local function drop_wakeups(owner)
  drop_wakeups_upto(owner, math.huge)
end

-- Remove the messages to `owner` about `attempt` only: a thread may hold the permits of one
-- attempt while it waits with another (a semaphore), and a message about one (a late copy of
-- its acquire, a revoked grant) must never take the other's with it.
local function drop_attempt_wakeups(owner, attempt)
  drop_wakeups_upto(owner, attempt, true)
end

-- Whether a wake-up can be pushed to `owner` now. The wake list is a key the script does not
-- declare (it is named after the grantee, whom only the script knows): while the lock's Cluster
-- slot migrates, Redis refuses it when it is missing on this node, and an ACL may refuse it.
-- The heartbeat checks it before it drops a waiter it tells to retry; a grant's own push is its
-- probe (offer_wakeup), so a grant is never left half done (the hold written, the wake-up
-- refused); refused, the lock stays free with its queue (stranded), which the grantee's
-- heartbeat repairs once the key can be reached.
local function can_wake(owner)
  local wk = wake_of(owner)
  local r = redis.pcall('LINDEX', wk, 0)
  if type(r) == 'table' and r.err then
    if string.find(r.err, 'WRONGTYPE', 1, true) then
      refuse(wk, 'a ' .. redis.call('TYPE', wk)['ok'] .. ' but fairlock expects a list')
    end
    return false
  end
  if r and not is_wakeup(r) then refuse(wk, FOREIGN_LIST) end
  return true
end

-- Keep the wake list `wk`, `n` long after a push, for at least `ttl` ms: others' messages may
-- be waiting in it with a longer time to live, which a shorter PEXPIRE would cut.
local function keep_list(wk, n, ttl)
  if n == 1 or redis.call('PTTL', wk) < ttl then
    redis.call('PEXPIRE', wk, fmt(ttl))
  end
end

-- Push `body` to `owner`, keeping the list for at least `ttl` ms.
local function push_wakeup(owner, body, ttl)
  local wk, prefix = wake_of(owner)
  keep_list(wk, read(wk, 'RPUSH', prefix .. body), ttl)
end

-- Errors of a server that refuses every write now, whatever the key.
local WRITES_REFUSED = { 'OOM', 'MISCONF', 'NOREPLICAS', 'READONLY' }

-- The first write of a grant: `body` pushed to `owner`, which is also the probe can_wake makes.
-- Refused (see can_wake), nothing is written and it returns nil; WRONGTYPE is refused as
-- foreign. A list that held messages already is looked at first thing: another program's gets
-- its list back (the message removed again) before the refusal. Returns the list, the message
-- as pushed (to take it back if what follows is refused) and the list's length.
local function offer_wakeup(owner, body)
  local wk, prefix = wake_of(owner)
  local msg = prefix .. body
  local n = redis.pcall('RPUSH', wk, msg)
  if type(n) == 'table' and n.err then
    if string.find(n.err, 'WRONGTYPE', 1, true) then
      refuse(wk, 'a ' .. redis.call('TYPE', wk)['ok'] .. ' but fairlock expects a list')
    end
    -- the server refusing writes at all (memory, a failed save, too few replicas, a replica) is
    -- no refusal of this key: the caller hears it, as from its first write before
    for _, e in ipairs(WRITES_REFUSED) do
      if string.sub(n.err, 1, #e) == e then error(n) end
    end
    return nil
  end
  if n > 1 and not is_wakeup(redis.call('LINDEX', wk, 0)) then
    redis.call('LREM', wk, -1, msg)
    refuse(wk, FOREIGN_LIST)
  end
  return wk, msg, n
end

-- ---- tokens (the queue core) -----------------------------------------------------------------
-- Both primitives' tokens: `last` is the last token the primitive's state knows (the lock's
-- hash's token, the semaphore's ~token; nil when it has none).

-- The token a new hold after `last` gets unless the fence is ahead of it.
local function first_token(last)
  return math.max((last or 0) + 1, now_us())
end

-- The next token after `last` (see "Tokens" in common.lua). The fence is the script's first write
-- on every path that takes the lock (but a grant's wake-up, which the grant takes back when the
-- fence is refused), so foreign data there is refused before anything else is written.
local function next_token(last)
  local token = first_token(last)
  local old = read(k.fence, 'SET', fmt(token), 'PX', FENCE_TTL, 'GET')
  local last = old and token_value(old)
  if old and not last then
    -- another program's string: put it back (without the TTL it may have had) and refuse
    redis.call('SET', k.fence, old)
    refuse(k.fence, NOT_A_TOKEN)
  end
  if last and last >= token then
    -- the fence is ahead of the hash (no hash: its lease ran out; or the server clock went back)
    token = last + 1
    redis.call('SET', k.fence, fmt(token), 'PX', FENCE_TTL)
  end
  return token
end

-- A new hold, written over whatever hash (tombstone or an older hold) is there. `...`: more
-- field, value pairs (a hand-off's wdl and vc). Returns the token.
local function take(h, owner, attempt, lease, meta, ...)
  if h.unread and redis.call('EXISTS', k.lock) == 1 then
    refuse(k.lock, "a hash without fairlock's fields")
  end
  h.unread = false
  local token = next_token(h.token)
  if select('#', ...) == 0 then
    redis.call('HSET', k.lock, 'owner', owner, 'attempt', fmt(attempt), 'count', '1',
      'token', fmt(token), 'lease', fmt(lease), 'since', fmt(now_ms()), 'meta', meta, 'wdl', '')
  else
    redis.call('HSET', k.lock, 'owner', owner, 'attempt', fmt(attempt), 'count', '1',
      'token', fmt(token), 'lease', fmt(lease), 'since', fmt(now_ms()), 'meta', meta, ...)
  end
  redis.call('PEXPIRE', k.lock, fmt(lease))
  h.owner, h.attempt, h.token, h.token_text, h.lease = owner, attempt, token, fmt(token), lease
  h.wdl = nil
  return token
end

-- The released list with `token` added in front, the oldest dropped beyond RECEIPTS: the list
-- is cut after its first RECEIPTS - 1 tokens (plain searches for the spaces between them, no
-- copy of the list but the one returned: a release runs this on the hand-off's critical path).
local function with_receipt(released, token)
  if released == '' then return token end
  local at = 0
  for _ = 1, RECEIPTS - 1 do
    at = string.find(released, ' ', at + 1, true)
    if not at then return token .. ' ' .. released end
  end
  return token .. ' ' .. string.sub(released, 1, at - 1)
end

local function has_receipt(released, token)
  for t in string.gmatch(released, '%d+') do
    if t == token then return true end
  end
  return false
end

-- The holder's lease left (0 when free).
local function holder_pttl(h)
  if not h.owner then return 0 end
  local p = redis.call('PTTL', k.lock)
  if p < 0 then return 0 end
  return p
end

-- The lease left of a grant, as reported to its holder: at most the hold's lease, since a
-- backward step of the server clock can leave a TTL longer than that, which no renewal keeps.
local function grant_pttl(h)
  return math.min(holder_pttl(h), h.lease)
end

-- ---- the queue and the waiters --------------------------------------------------------------

-- "attempt|deadline|lease|meta" -> table
local function parse_waiter(v)
  if not v then return nil end
  local a, deadline, l, meta = string.match(v, '^(%d+)|(%d+)|(%d+)|(.*)$')
  if not a then return nil end
  local attempt, lease = tonumber(a), tonumber(l)
  -- a grant writes both again: their digits are those fmt would give (fmt wrote them)
  formatted[attempt], formatted[lease] = a, l
  return { attempt = attempt, deadline = tonumber(deadline), lease = lease, meta = meta }
end

-- What one run has read and written of the waiters hash and the queue, set by `reset_state`
-- at the start of every run that uses these helpers (see `reset` in common.lua).
-- W: the waiters hash as this run sees it: its virtual clock now, the last score given out,
-- and the entries read so far (owner -> entry or false); `readonly` (status) never stores the
-- clock. Q: the first two queue members.
local W, Q

local function reset_state()
  W = { now = nil, tail = 0, existed = false, entries = {}, readonly = false, cap = CAP }
  Q = nil
end

local FOREIGN_WAITERS = "a hash without fairlock's clock field"

-- The waiters entry of `owner` (nil if none). The first read also reads the hash's clock and
-- stores its reading: every script that judges waiters moves the clock on, not only
-- heartbeats, so a dead waiter is found dead whoever calls (a reading advances at most CAP
-- from the stored one, so a forward step of the server clock still costs at most CAP however
-- many scripts run).
local function waiter_entry(owner)
  local e = W.entries[owner]
  if e ~= nil then return e or nil end
  if W.now then
    e = parse_waiter(read(k.waiters, 'HGET', owner))
  else
    local v = read(k.waiters, 'HMGET', owner, '~clock', '~tail', '~cap')
    e = parse_waiter(v[1])
    W.cap = math.min(tonumber(v[4]) or CAP, CAP)
    local due
    W.now, due = advance(v[2], W.cap)
    W.tail, W.existed = tonumber(v[3]) or 0, v[2] and true or false
    if v[2] and not W.readonly then
      if due then redis.call('HSET', k.waiters, '~clock', clock_value(W.now)) end
    elseif not v[2] and v[1] then
      refuse(k.waiters, FOREIGN_WAITERS)
    end
  end
  W.entries[owner] = e or false
  return e
end

-- The waiters hash is fairlock's or missing: a hash there without the clock field fairlock
-- always writes with an entry is another program's. Checked before the first write to it.
local function check_waiters_ours()
  if not W.now then waiter_entry('~clock') end
  if W.existed or W.checked then return end
  if redis.call('EXISTS', k.waiters) == 1 then refuse(k.waiters, FOREIGN_WAITERS) end
  W.checked = true
end

-- The waiters hash's virtual clock now.
local function waiters_now()
  if not W.now then waiter_entry('~clock') end
  return W.now
end

-- Store a waiter's entry (and the clock reading with it).
local function write_waiter(owner, attempt, deadline, lease, meta, ...)
  if not W.existed then check_waiters_ours() end
  local e = fmt(attempt) .. '|' .. fmt(deadline) .. '|' .. fmt(lease) .. '|' .. meta
  redis.call('HSET', k.waiters, owner, e, '~clock', clock_value(waiters_now()), '~cap',
    fmt(W.cap), ...)
  -- the entry as parse_waiter would read it back (attempt, deadline and lease are whole numbers)
  W.entries[owner] = { attempt = attempt, deadline = deadline, lease = lease, meta = meta }
end

-- Whether `member` can be one of fairlock's queue members (an owner, "<client id>:<thread>").
local function is_owner(member)
  return string.match(member, '^[^|]+:%d+$') ~= nil
end

-- The first two members of the queue, read once a script (kept up to date by its own changes).
-- A member that is no owner is another program's zset: refused before anything judges it.
local function front()
  if not Q then
    Q = read(k.queue, 'ZRANGE', 0, 1)
    for _, m in ipairs(Q) do
      if not is_owner(m) then refuse(k.queue, 'a zset whose members are not fairlock owners') end
    end
  end
  return Q
end

-- Before a queue place is written: without a waiters hash of ours (fairlock's holds the clock
-- with every entry) the queue is new, or these keys are another program's. One EXISTS of both
-- tells the common case, a first waiter on a lock nobody else waits for (neither key is
-- there); otherwise each is looked at: a hash there without the clock, queue members that are
-- no owners. (A call less than looking at each, on the path of every hand-off's queueing.)
local function check_queue_new()
  if not W.now then waiter_entry('~clock') end
  if W.existed or W.checked then return end
  if redis.call('EXISTS', k.queue, k.waiters) > 0 then
    check_waiters_ours()
    front()
  end
  W.checked = true
end

-- Remove `owner` from the queue and the waiters hash; the waiters hash (and its clock) goes
-- with the last queue entry. What the script read of the queue spares most checks.
local function dequeue(owner)
  local q = Q
  Q = nil
  if q and q[1] == owner and not q[2] and W.now then
    -- the only member, and both keys read (type-checked) already: one call deletes both (the
    -- hand-off to a lone waiter)
    check_waiters_ours()
    redis.call('DEL', k.queue, k.waiters)
  else
    read(k.queue, 'ZREM', owner)
    local empty
    if not q then
      empty = redis.call('EXISTS', k.queue) == 0
    elseif not q[1] then
      empty = true
    elseif q[1] ~= owner then
      empty = false
    else
      empty = not q[2]
    end
    if not empty then
      read(k.waiters, 'HDEL', owner)
      W.entries[owner] = false
      return
    end
    -- a hash this script has not read yet is read (checked) before it is deleted
    check_waiters_ours()
    redis.call('DEL', k.waiters)
  end
  W = { now = W.now, tail = 0, existed = false, entries = {}, readonly = W.readonly,
        cap = W.cap }
  Q = {}
end

-- Remove an owner's wake-ups and queue entry, whatever attempt they belong to (the wake list
-- first: it is the key that may be refused, see can_wake).
local function forget_waiter(owner)
  drop_wakeups(owner)
  dequeue(owner)
end

-- The queue place of `owner`'s waiting attempt `w` goes, with the messages about that attempt.
local function forget_attempt(owner, w)
  drop_attempt_wakeups(owner, w.attempt)
  dequeue(owner)
end

-- Queue `owner` at the back (a retry of a queued attempt keeps its place), or refresh its entry.
-- `mine`: its entry as read (only a retry has one; its queue place may have been lost).
local function enqueue(owner, attempt, lease, meta, mine)
  local now = waiters_now()
  if not (mine and read(k.queue, 'ZSCORE', owner)) then
    -- a new place: drop wake-ups of earlier ones (first: the wake list may be refused, see
    -- can_wake), never of a newer attempt (this may be a late copy of an old request, and the
    -- thread may wait for its newer grant's wake-up). A grant to this same attempt that lapsed
    -- (its lease ran out, or was revoked) must not be popped after this queueing: the shared
    -- list outlives it (other threads' messages keep it alive, and a backward step of the
    -- server clock revives an expired key Redis has not deleted yet), and the waiter would take
    -- the old grant for a new one.
    drop_wakeups_upto(owner, attempt)
    check_queue_new()
    local score = math.max(now_us(), W.tail + 1)
    read(k.queue, 'ZADD', fmt(score), owner)
    redis.call('PEXPIRE', k.queue, QUEUE_TTL)
    write_waiter(owner, attempt, now + WAITER_TTL, lease, meta, '~tail', fmt(score))
    -- the place is in both keys: each lives the queue's TTL from now, so a forward step of the
    -- server clock before the waiter's first heartbeat cannot expire one of them (the waiters
    -- hash of a lock whose other waiters are dead is refreshed by no heartbeat)
    redis.call('PEXPIRE', k.waiters, QUEUE_TTL)
    W.existed = true
    Q = nil
  else
    -- (its entry was read: the waiters hash is there)
    write_waiter(owner, attempt, now + WAITER_TTL, lease, meta)
  end
end

-- A heartbeat's word for `owner`'s waiting `attempt` (its entry `w` as read; the attempt holds
-- nothing): a queued one gets a new deadline; any other, unless the owner's entry is a newer
-- attempt's (its place was purged during a pause, its grant lapsed unseen, its queue key was
-- lost), loses what is left of it (`forget(owner, w)`: the primitive's) and is told to retry
-- through its wake list, its owner added to `told`. (A wake list that cannot be reached now is
-- told at the next heartbeat.)
local function refresh_waiter(owner, attempt, w, told, forget)
  if w and w.attempt == attempt and read(k.queue, 'ZSCORE', owner) then
    write_waiter(owner, attempt, waiters_now() + WAITER_TTL, w.lease, w.meta)
  elseif not (w and w.attempt > attempt) then
    if w then forget(owner, w) end
    if can_wake(owner) then
      push_wakeup(owner, 'r|' .. fmt(attempt), WAITER_TTL)
      told[#told + 1] = owner
    end
  end
end

-- Whether the queue, the waiters hash or the left marks exist, or (when the lock hash `h` has
-- no owner field) a hash at the lock's key: one call for all, and the common case (no waiter,
-- no garbage) stops here. It checks no key's type, so it only guards paths that write none of
-- these keys when it says no.
local function queue_keys_exist(h)
  if h.unread then
    if redis.call('EXISTS', k.queue, k.waiters, k.left, k.lock) > 0 then return true end
    h.unread = false -- no hash at all: nobody else's
    return false
  end
  return redis.call('EXISTS', k.queue, k.waiters, k.left) > 0
end

-- ---- left marks -----------------------------------------------------------------------------
-- P:{N}:left, owner -> "<attempt>|<expiry ms>": the newest attempt of that owner that left while
-- one of its acquire requests could still arrive (it went unanswered, or was sent twice). Such a
-- request, arriving after the leave, must do nothing, rather than queue a waiter nobody
-- refreshes or take the lock for a thread that holds no guard. A mark lives QUEUE_TTL (as long
-- as a ghost waiter's queue keys would have), each on its own: the field '~' holds when the
-- next prune is due (the earliest expiry + QUEUE_TTL/10), and the mark that finds it due drops
-- every expired one, so however many marks keep coming, none outlives 1.1 QUEUE_TTL after it
-- was made (as of the latest mark), and a prune reads the hash at most once per QUEUE_TTL/10
-- plus once per expiry that came due. The key lives QUEUE_TTL after the last mark.

-- The attempt of a mark's value ("<attempt>|<expiry>"; a plain number from an older version).
local function mark_attempt(v)
  return tonumber(v and string.match(v, '^(%d+)')) or 0
end

-- The newest attempt of `owner` that left with a mark (0: none). The key is not declared
-- (see "Undeclared keys"): a script that may mark reads it before its first write.
local function left_mark(owner)
  return mark_attempt(read(k.left, 'HGET', owner))
end

-- Drop every mark expired at `now` (a mark of an older version, without an expiry, counts as
-- expired); returns the earliest expiry of those left (nil: none).
local function prune_left_marks(now)
  local all, expired, earliest = redis.call('HGETALL', k.left), {}, nil
  for i = 1, #all, 2 do
    if all[i] ~= '~' then
      local expiry = tonumber(string.match(all[i + 1], '|(%d+)$')) or 0
      if expiry <= now then
        expired[#expired + 1] = all[i]
      elseif not earliest or expiry < earliest then
        earliest = expiry
      end
    end
  end
  for i = 1, #expired, 1000 do
    redis.call('HDEL', k.left, unpack(expired, i, math.min(i + 999, #expired)))
  end
  return earliest
end

-- Mark `owner`'s `attempt` as left. On a fresh lock this is the script's first write, so it
-- first checks the keys the script may not have read. Fairlock's marks hash always has the
-- field '~' (another program's hash there is refused, not written to).
local function mark_left(owner, attempt)
  read(k.queue, 'ZCARD')
  read_fence()
  local v = read(k.left, 'HMGET', owner, '~')
  if not v[2] and redis.call('EXISTS', k.left) == 1 then
    refuse(k.left, "a hash without fairlock's marker field")
  end
  local now, slack = now_ms(), math.floor(QUEUE_TTL / 10)
  local due, earliest = tonumber(v[2]), nil
  if due and due <= now then
    earliest = prune_left_marks(now)
    if mark_attempt(v[1]) > 0 and not redis.call('HEXISTS', k.left, owner) then v[1] = nil end
  elseif due then
    earliest = due - slack
  end
  local fields = {}
  if mark_attempt(v[1]) < attempt then
    local expiry = now + QUEUE_TTL
    fields = { owner, fmt(attempt) .. '|' .. fmt(expiry) }
    if not earliest or expiry < earliest then earliest = expiry end
  end
  local next_due = earliest and fmt(earliest + slack) or fmt(now + QUEUE_TTL + slack)
  if next_due ~= v[2] then
    fields[#fields + 1] = '~'
    fields[#fields + 1] = next_due
  end
  if #fields > 0 then redis.call('HSET', k.left, unpack(fields)) end
  redis.call('PEXPIRE', k.left, QUEUE_TTL)
end

-- An acquire's own waiter entry, for `owner`'s `attempt`: false when the request is stale (the
-- attempt left with a mark, or the owner waits with a newer attempt: a late or repeated copy,
-- which does nothing), nil when it has none. An entry of an earlier attempt, given up, goes
-- (`forget(owner, w)`: the primitive's), so the new attempt queues at the back. The marks are
-- read first: an undeclared key, touched before the first write (see "Undeclared keys").
local function own_entry(owner, attempt, forget)
  if left_mark(owner) >= attempt then return false end
  local mine = waiter_entry(owner)
  if mine and mine.attempt > attempt then return false end
  if mine and mine.attempt < attempt then
    forget(owner, mine)
    return nil
  end
  return mine
end

-- The queue is empty: a waiters hash left without it (its queue key was evicted or lost) goes,
-- so no entry outlives its place by more than one script that looks.
local function drop_orphaned_waiters()
  if not W.now then waiter_entry('~clock') end
  if W.existed then
    redis.call('DEL', k.waiters)
    W = { now = W.now, tail = 0, existed = false, entries = {}, readonly = W.readonly,
        cap = W.cap }
  end
end

-- Remove dead waiters from the front of the queue; return the first live one and its entry.
local function live_head()
  while true do
    local head = front()[1]
    if not head then
      drop_orphaned_waiters()
      return nil
    end
    local w = waiter_entry(head)
    if w and w.deadline >= waiters_now() then return head, w end
    forget_waiter(head)
  end
end

-- ==== the queue core: hand-offs, grants, revocation ===========================================
-- What both primitives do once a head of the queue is admitted; each supplies only its admission
-- rule (grant_live_heads: is there room, does the head fit, take) and where it keeps a hand-off's
-- deadline (the lock: field wdl of its hash; the semaphore: its hand-offs zset, sem.lua).

local function grant_message(attempt, token)
  return 'g|' .. fmt(attempt) .. '|' .. fmt(token) .. '|'
end

-- ---- the hand-off clock ---------------------------------------------------------------------
-- A *hand-off* is a grant made by another's script (a release, a heartbeat...) whose wake-up its
-- grantee has not popped yet. Its grantee must pop it, or heartbeat, before a deadline: what was
-- left of its waiter deadline when it was granted, then WAITER_TTL from each of its heartbeats.
-- Every hand-off deadline is kept on the primitive's *hand-off clock*, a virtual clock (see
-- "Time" in common.lua) stored in the primitive's hash: `p` is the primitive's record of its
-- hash as read, with p.vc (the stored "v|real", nil: none yet), p.vcap (its cap, at most CAP)
-- and p.clock (the two field names: 'vc', 'vcap' in the lock's hash, '~vc', '~vcap' in the
-- semaphore's). So a forward step of the server clock moves a hand-off's deadline nearer by at
-- most the cap (a third of the shortest waiter timeout), never revoking a live grantee's grant.

-- The hand-off clock of `p` now, stored when due (`advance`); `deferred`: the caller writes
-- p.vc itself, with its own HSET (a grant writes it with the hold).
local function handoff_now(p, deferred)
  local now, due = advance(p.vc, p.vcap)
  if due then
    p.vc = clock_value(now)
    if not deferred then redis.call('HSET', k.lock, p.clock[1], p.vc) end
  end
  return now
end

-- The deadline of a new hand-off to waiter entry `w` (what is left of its waiter deadline, on
-- the hand-off clock), then the clock's fields, value pairs, for the grant's own HSET. The cap
-- is the waiters' smallest (W.cap); while other hand-offs of `p` may be pending (p.pending()),
-- it only comes down, so no grantee's deadline is judged with a longer-timeout client's cap.
local function new_handoff(p, w)
  local now = handoff_now(p, true)
  p.vc = clock_value(now)
  -- (only a cap that would go up asks p.pending(): otherwise both answers give W.cap)
  if not (W.cap > p.vcap and p.pending and p.pending()) then p.vcap = W.cap end
  return now + math.max(w.deadline - waiters_now(), 0), p.clock[1], p.vc, p.clock[2], fmt(p.vcap)
end

-- A deadline WAITER_TTL from now on the hand-off clock of `p`: a grantee that heartbeats while
-- its hand-off waits unpopped keeps it.
local function handoff_extended(p)
  return handoff_now(p) + WAITER_TTL
end

-- Whether the hand-off of `owner`'s `attempt` (token `token`) still waits in its wake list.
local function handoff_pending(owner, attempt, token)
  local wk, thread = wake_of(owner)
  local prefix = thread .. grant_message(attempt, token)
  for _, msg in ipairs(read(wk, 'LRANGE', 0, -1)) do
    if msg:sub(1, #prefix) == prefix then return true end
  end
  return false
end

-- A heartbeat's word to a hold granted to `owner`'s `attempt` (token `token`), an attempt its
-- client still names as waiting, the same for every primitive. True while the grant's wake-up
-- waits in the wake list (or the list cannot be reached now): the grantee, alive, gets more time
-- to pop it. False when the wake-up is not there although the attempt still waits: it was
-- popped with a reply that never reached the thread (the waker's BLPOP applied, its reply lost
-- with the connection), or never pushed (a repeat or late copy of the attempt's acquire took
-- the hold with a reply that went to no one). It is pushed again now, with the grant's time
-- (`granted_ms()`, server ms), and the caller confirms the hand-off: a deadline would revoke a
-- grant whose grantee is alive. The copy lives WAITER_TTL, not the lease: while the attempt
-- waits, each heartbeat tells it again once the copy is gone, and a copy nobody pops (below) must
-- not keep the client's list for a lease. Network: a late or repeated heartbeat for an attempt
-- whose thread took its hold meanwhile pushes a wake-up nobody waits with, which its client drops
-- when a thread still waits on the list and which expires with it otherwise; a second heartbeat
-- before the waker pops finds the wake-up pending and pushes none.
local function tell_waiting_grantee(owner, attempt, token, granted_ms)
  if not can_wake(owner) or handoff_pending(owner, attempt, token) then return true end
  push_wakeup(owner, grant_message(attempt, token) .. granted_ms(), WAITER_TTL)
  return false
end

-- The revocation judgement, the same for every primitive: the hand-off of `owner`'s `attempt`
-- (token `token`) is revoked when its `deadline` passed on the hand-off clock (reading `now`)
-- and its wake-up was never popped (a dead grantee). One whose wake-up was popped is held: its
-- holder has it, and its lease alone ends it. (Revoking is safe under a late pop: the wake-up
-- goes with the grant, so it cannot be popped after.)
local function handoff_dead(owner, attempt, token, deadline, now)
  return deadline < now and handoff_pending(owner, attempt, token)
end

-- ---- the grant ------------------------------------------------------------------------------

-- Grant `owner`'s `attempt` through the primitive's `take(...)` (which writes the hold and
-- returns its token), pushing the grant's wake-up first. `last`: the last token the primitive's
-- state knows (its hash's), so the wake-up carries the token the hold will have unless the fence
-- is ahead. The push is the probe of the undeclared key (see can_wake), and a take refused after
-- it takes it back, so no refusal leaves half a grant (and an empty list's probe costs no call).
-- Returns the token, or nil when the wake list cannot be reached (nothing written).
local function grant_with_wakeup(owner, attempt, last, lease, take, ...)
  local now = now_ms()
  local guess = first_token(last)
  local wk, sent, n = offer_wakeup(owner, grant_message(attempt, guess) .. fmt(now))
  if not wk then return nil end
  local ok, token = pcall(take, ...)
  if not ok then
    redis.call('LREM', wk, -1, sent)
    error(token, 0)
  end
  if token ~= guess then
    -- the fence was ahead of the hash (its hash was lost, or the server clock went back)
    redis.call('LREM', wk, -1, sent)
    local _, prefix = wake_of(owner)
    n = redis.call('RPUSH', wk, prefix .. grant_message(attempt, token) .. fmt(now))
  end
  -- the list lives at least as long as the grant; a message popped after the grant's lease is
  -- refused by its waiter's own estimate (it knows when it queued), and a stale message of an
  -- older attempt is dropped by the waker (those of this attempt went when it queued)
  keep_list(wk, n, lease)
  return token
end

-- Grant to the queue's live heads in order while the primitive `p` admits them: p.open() (is
-- there room for anyone), p.fits(w) (does this head's waiter entry fit), p.take(head, w,
-- deadline, clock fields...) (write the hold and the hand-off's deadline; returns the token).
-- The first head that does not fit stops the loop, so nobody behind it is served before it.
-- Each grant is a hand-off (new_handoff), its wake-up pushed first (grant_with_wakeup), its
-- queue entry removed. Returns how many were granted and the last grantee.
local function grant_live_heads(p)
  local n, last = 0, nil
  while p.open() do
    local head, w = live_head()
    if not (head and p.fits(w)) then break end
    if not grant_with_wakeup(head, w.attempt, p.token, w.lease, p.take, head, w,
        new_handoff(p, w)) then
      break
    end
    dequeue(head)
    n, last = n + 1, head
  end
  return n, last
end

-- ==== the lock's admission ======================================================================

-- Hand the free lock (hash `h`, as read) to the live head of the queue: the release grants, the
-- waiter needs no further round trip. The grantee's liveness moves into the lock hash (wdl, on
-- the hand-off clock), so a heartbeat can revoke a hand-off whose grantee died before popping
-- it. The lock admits one head (its caller has freed it, or found it free), whoever it is.
-- `...`: more field, value pairs for the hash (a release's receipts). Returns the grantee or
-- false. It is one turn of grant_live_heads's loop (live head, hand-off, grant with its
-- wake-up, dequeue), written out: a release runs it on the hand-off's critical path, where the
-- loop's admission closures and field lists cost more than the turn's own work.
local function grant_next(h, ...)
  local head, w = live_head()
  if not head then return false end
  local deadline, c1, v1, c2, v2 = new_handoff(h, w)
  if not grant_with_wakeup(head, w.attempt, h.token, w.lease, take, h, head, w.attempt, w.lease,
      w.meta, 'wdl', fmt(deadline), c1, v1, c2, v2, ...) then
    return false
  end
  h.wdl = deadline
  dequeue(head)
  return head
end

-- Free the hold `h` (as read) or grant the lock to the next live waiter (state.lua's, not the
-- release's own: no function made per run); `...`: more field, value pairs for the hash (a
-- release's receipts), written either way. Returns the grantee, or false with the lock left
-- free (h.owner false).
local function pass_on(h, ...)
  local next = front()[1] and grant_next(h, ...)
  if not next then
    redis.call('HSET', k.lock, 'owner', '', ...)
    h.owner = false
  end
  return next
end

-- Revoke the hand-off of hold `h` when its grantee let its deadline pass (on the hand-off clock,
-- `lock_now`) without popping it: a dead grantee. The lock is free again (h.owner false).
local function revoke_stale_handoff(h, lock_now)
  if h.owner and h.wdl and handoff_dead(h.owner, h.attempt, h.token, h.wdl, lock_now) then
    drop_wakeups(h.owner)
    redis.call('HSET', k.lock, 'owner', '')
    h.owner = false
    return true
  end
  return false
end
