-- state.lua: helpers over a lock's hash, queue and waiters, prepended after common.lua to the
-- scripts that take the lock or change the queue (see common.lua for the keys and states).
-- Network: a repeated or late script finds the state these helpers left: a grant removes the
-- grantee's queue entry, so a repeat cannot grant twice; a new queue place drops its owner's
-- older wake-ups, so a lapsed grant cannot be popped after it; the tombstone keeps the receipts
-- a repeated release looks for. Wake lists are shared by a client's threads: a repeated or late
-- removal takes only its own thread's messages (drop_wakeups), never a neighbour's, and a push
-- never shortens the list's TTL under others' messages (push_wakeup). A left mark keeps the
-- newest attempt marked, so a repeated or late mark of an older one changes nothing (mark_left).

-- ---- the lock hash --------------------------------------------------------------------------

-- The lock hash as this script first saw it; owner is false when the lock is free.
local function read_lock()
  local v = read(k.lock, 'HMGET', 'owner', 'attempt', 'token', 'lease', 'released', 'wdl', 'vc')
  local owner = v[1]
  if owner == '' then owner = false end
  return { owner = owner, attempt = tonumber(v[2]) or 0, token = tonumber(v[3]), token_text = v[3],
           lease = tonumber(v[4]) or 0, released = v[5] or '', wdl = tonumber(v[6]), vc = v[7] }
end

-- ---- wake lists -----------------------------------------------------------------------------
-- One list per lock per client ("<lock>:wake:<client id>"), shared by that client's waiting
-- threads; its waker thread pops it and hands each message to the thread of its attempt. A
-- message starts with the thread's number, so a script can remove one thread's messages without
-- touching its neighbours'.

-- owner "<client id>:<thread>" -> its client's wake list, and the prefix of its messages
local function wake_of(owner)
  local client, thread = string.match(owner, '^(.*):([^:]*)$')
  if not client then client, thread = owner, '' end
  return k.lock .. ':wake:' .. client, thread .. '|'
end

-- Remove every message to `owner` (whatever attempt it is for) from its client's wake list.
local function drop_wakeups(owner)
  local wk, prefix = wake_of(owner)
  for _, msg in ipairs(read(wk, 'LRANGE', 0, -1)) do
    if msg:sub(1, #prefix) == prefix then redis.call('LREM', wk, 1, msg) end
  end
end

-- Push `body` to `owner`, keeping the list for at least `ttl` ms: others' messages may be
-- waiting in it with a longer time to live, which a shorter PEXPIRE would cut.
local function push_wakeup(owner, body, ttl)
  local wk, prefix = wake_of(owner)
  if read(wk, 'RPUSH', prefix .. body) == 1 or redis.call('PTTL', wk) < ttl then
    redis.call('PEXPIRE', wk, ttl)
  end
end

-- The next token after the hash `h` (see "Tokens" above). The fence is the script's first write
-- on every path that takes the lock, so foreign data there is refused before anything else is
-- written.
local function next_token(h)
  local token = math.max((h.token or 0) + 1, now_us())
  local old = read(k.fence, 'SET', fmt(token), 'PX', FENCE_TTL, 'GET')
  if old and not tonumber(old) then
    -- another program's string: put it back (without the TTL it may have had) and refuse
    redis.call('SET', k.fence, old)
    refuse(k.fence, 'a non-numeric string')
  end
  if old and tonumber(old) >= token then
    -- the fence is ahead of the hash (no hash: its lease ran out; or the server clock went back)
    token = tonumber(old) + 1
    redis.call('SET', k.fence, fmt(token), 'PX', FENCE_TTL)
  end
  return token
end

-- A new hold, written over whatever hash (tombstone or an older hold) is there. `...`: more
-- field, value pairs (a hand-off's wdl and vc). Returns the token.
local function take(h, owner, attempt, lease, meta, ...)
  local token = next_token(h)
  if select('#', ...) == 0 then
    redis.call('HSET', k.lock, 'owner', owner, 'attempt', fmt(attempt), 'count', 1,
      'token', fmt(token), 'lease', fmt(lease), 'since', fmt(now_ms()), 'meta', meta, 'wdl', '')
  else
    redis.call('HSET', k.lock, 'owner', owner, 'attempt', fmt(attempt), 'count', 1,
      'token', fmt(token), 'lease', fmt(lease), 'since', fmt(now_ms()), 'meta', meta, ...)
  end
  redis.call('PEXPIRE', k.lock, lease)
  h.owner, h.attempt, h.token, h.token_text, h.lease = owner, attempt, token, fmt(token), lease
  h.wdl = nil
  return token
end

-- The released list with `token` added in front, the oldest dropped beyond RECEIPTS (string
-- operations in C: a release runs this on the hand-off's critical path).
local function with_receipt(released, token)
  if released == '' then return token end
  local out = token .. ' ' .. released
  local _, spaces = string.gsub(out, ' ', ' ')
  if spaces >= RECEIPTS then out = string.match(out, '^(.*) %d+$') end
  return out
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
-- and the entries read so far (owner -> entry or false). Q: the first two queue members.
local W, Q

local function reset_state()
  W = { now = nil, tail = 0, existed = false, entries = {} }
  Q = nil
end

-- The waiters entry of `owner` (nil if none). The first read also reads the hash's clock.
local function waiter_entry(owner)
  local e = W.entries[owner]
  if e ~= nil then return e or nil end
  if W.now then
    e = parse_waiter(read(k.waiters, 'HGET', owner))
  else
    local v = read(k.waiters, 'HMGET', owner, '~clock', '~tail')
    e = parse_waiter(v[1])
    W.now, W.tail, W.existed = advance(v[2]), tonumber(v[3]) or 0, v[2] and true or false
  end
  W.entries[owner] = e or false
  return e
end

-- The waiters hash's virtual clock now.
local function waiters_now()
  if not W.now then waiter_entry('~clock') end
  return W.now
end

-- Store a waiter's entry (and the clock reading with it).
local function write_waiter(owner, attempt, deadline, lease, meta, ...)
  local e = fmt(attempt) .. '|' .. fmt(deadline) .. '|' .. fmt(lease) .. '|' .. meta
  redis.call('HSET', k.waiters, owner, e, '~clock', clock_value(waiters_now()), ...)
  W.entries[owner] = parse_waiter(e)
end

-- The first two members of the queue, read once a script (kept up to date by its own changes).
local function front()
  if not Q then Q = read(k.queue, 'ZRANGE', 0, 1) end
  return Q
end

-- Remove `owner` from the queue and the waiters hash; the waiters hash (and its clock) goes
-- with the last queue entry. What the script read of the queue spares most checks.
local function dequeue(owner)
  local q = Q
  Q = nil
  if q and q[1] == owner and not q[2] and W.now then
    -- the only member, and both keys read (type-checked) already: one call deletes both (the
    -- hand-off to a lone waiter)
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
    -- a hash this script has not read yet is read (type-checked) before it is deleted
    if not W.now then read(k.waiters, 'HLEN') end
    redis.call('DEL', k.waiters)
  end
  W = { now = W.now, tail = 0, existed = false, entries = {} }
  Q = {}
end

-- Remove an owner's queue entry and wake-ups, whatever attempt they belong to.
local function forget_waiter(owner)
  dequeue(owner)
  drop_wakeups(owner)
end

-- Queue `owner` at the back (a retry of a queued attempt keeps its place), or refresh its entry.
-- `mine`: its entry as read (only a retry has one; its queue place may have been lost).
local function enqueue(owner, attempt, lease, meta, mine)
  local now = waiters_now()
  if not (mine and read(k.queue, 'ZSCORE', owner)) then
    local score = math.max(now_us(), W.tail + 1)
    read(k.queue, 'ZADD', fmt(score), owner)
    redis.call('PEXPIRE', k.queue, QUEUE_TTL)
    -- a new place: drop wake-ups of earlier ones. A grant to this same attempt that lapsed
    -- (its lease ran out, or was revoked) must not be popped after this queueing: the shared
    -- list outlives it (other threads' messages keep it alive, and a backward step of the
    -- server clock revives an expired key Redis has not deleted yet), and the waiter would take
    -- the old grant for a new one.
    drop_wakeups(owner)
    write_waiter(owner, attempt, now + WAITER_TTL, lease, meta, '~tail', fmt(score))
    Q = nil
  else
    write_waiter(owner, attempt, now + WAITER_TTL, lease, meta)
  end
  if not W.existed then
    redis.call('PEXPIRE', k.waiters, QUEUE_TTL)
    W.existed = true
  end
end

-- Whether the queue, the waiters hash or the left marks exist: one call for all, and the common
-- case (no waiter, no garbage) stops here. It checks no key's type, so it only guards paths that
-- write none of these keys when it says no.
local function queue_keys_exist()
  return redis.call('EXISTS', k.queue, k.waiters, k.left) > 0
end

-- ---- left marks -----------------------------------------------------------------------------
-- P:{N}:left, owner -> the newest attempt of that owner that left while one of its acquire
-- requests could still arrive (it went unanswered, or was sent twice). Such a request, arriving
-- after the leave, must do nothing, rather than queue a waiter nobody refreshes or take the lock
-- for a thread that holds no guard. The key lives QUEUE_TTL after the last mark: as long as a
-- ghost waiter's queue keys would have.

-- The newest attempt of `owner` that left with a mark (0: none).
local function left_mark(owner)
  return tonumber(read(k.left, 'HGET', owner)) or 0
end

-- Mark `owner`'s `attempt` as left. On a fresh lock this is the script's first write, so it
-- first checks the keys the leave has not read.
local function mark_left(owner, attempt)
  read(k.queue, 'ZCARD')
  local fence = read(k.fence, 'GET')
  if fence and not tonumber(fence) then refuse(k.fence, 'a non-numeric string') end
  if left_mark(owner) < attempt then redis.call('HSET', k.left, owner, fmt(attempt)) end
  redis.call('PEXPIRE', k.left, QUEUE_TTL)
end

-- The queue is empty: a waiters hash left without it (its queue key was evicted or lost) goes,
-- so no entry outlives its place by more than one script that looks.
local function drop_orphaned_waiters()
  if W.existed or (not W.now and read(k.waiters, 'HLEN') > 0) then
    redis.call('DEL', k.waiters)
    W = { now = W.now, tail = 0, existed = false, entries = {} }
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

local function grant_message(attempt, token)
  return 'g|' .. fmt(attempt) .. '|' .. fmt(token) .. '|'
end

-- Hand the free lock (hash `h`, as read) to the live head of the queue: the release grants, the
-- waiter needs no further round trip. The grantee's liveness moves into the lock hash (wdl, on
-- the hash's own virtual clock vc), so a heartbeat can revoke a hand-off whose grantee died
-- before popping it. `...`: more field, value pairs for the hash (a release's receipts).
-- Returns the grantee or false.
local function grant_next(h, ...)
  local head, w = live_head()
  if not head then return false end
  local left = math.max(w.deadline - waiters_now(), 0)
  local now = now_ms()
  local vc = fmt(now) .. '|' .. fmt(now)
  local token = take(h, head, w.attempt, w.lease, w.meta, 'vc', vc, 'wdl', fmt(now + left), ...)
  h.wdl, h.vc = now + left, vc
  dequeue(head)
  -- the list lives at least as long as the grant; a message popped after the grant's lease is
  -- refused by its waiter's own estimate (it knows when it queued), and a stale message of an
  -- older attempt is dropped by the waker (those of this attempt went when it queued)
  push_wakeup(head, grant_message(w.attempt, token) .. fmt(now), w.lease)
  return head
end

-- Whether the hand-off of this hold still waits in its grantee's wake list.
local function handoff_pending(owner, attempt, token)
  local wk, thread = wake_of(owner)
  local prefix = thread .. grant_message(attempt, token)
  for _, msg in ipairs(read(wk, 'LRANGE', 0, -1)) do
    if msg:sub(1, #prefix) == prefix then return true end
  end
  return false
end
