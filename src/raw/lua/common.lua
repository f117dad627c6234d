-- common.lua: helpers of every fairlock script; the scripts that change the queue or take the
-- lock also use state.lua's. On Redis 7 and later the helpers, state.lua's and every script are
-- one function library (`FUNCTION LOAD`, called with `FCALL`), so Lua creates each helper once,
-- when the library loads; each script's body is registered as a function that starts with
-- `reset(KEYS, ARGV)` (and `reset_state()` where it uses state.lua). On Redis 6.2 every script
-- is these files followed by its own (`EVALSHA`), and every helper is created anew on each run
-- (a few us each on this kind of machine), which is why the short scripts (reenter, renew) go
-- without state.lua there.
--
-- The keys of one lock named N under prefix P (all share the hash tag {N}, so one slot):
--   P:{N}             HASH    owner, attempt, count, token, lease, since, meta,   TTL = the lease
--                             wdl (a hand-off's grantee deadline), vc and vcap (the
--                             hand-off clock, see "Time"), released (last tokens released)
--   P:{N}:fence       STRING  the last token handed out                         TTL = fence ttl
--   P:{N}:queue       ZSET    owner -> arrival time (server us)                 TTL = QUEUE_TTL
--   P:{N}:waiters     HASH    owner -> "attempt|deadline|lease|meta",           TTL = QUEUE_TTL
--                             ~clock (virtual clock), ~tail (last score given)
--   P:{N}:left        HASH    owner -> "<newest attempt that left with a mark>|<expiry ms>",
--                             ~ (when the next prune of expired marks is due)   TTL = QUEUE_TTL
--   P:{N}:wake:<client> LIST  the wake-ups of one client's waiting threads     TTL >= lease / waiter ttl
--
-- An owner is "<client id>:<thread number>". Each call of a thread that may take the lock is an
-- *attempt* with a number that grows with every call of that client. The attempt is stored with
-- the queue entry and the hold, and every script acts on "this thread's" entry or hold only for
-- the attempt it was sent for: a request that arrives late, after its sender gave up and moved on
-- to a newer attempt, finds a newer attempt number and does nothing.
--
-- States of a lock (owner = HGET P:{N} owner, '' or absent when free; head = first of the queue):
--   free        no hash, or a *tombstone*: the hash of the last hold with owner '' (see below);
--               empty queue
--   held        owner set, queue maybe non-empty (a release grants to the live head)
--   handed off  owner set with wdl, and its client's wake list still holds its grant message
--   stranded    free, queue non-empty (a lease ran out, a hand-off was revoked): any script
--               that sees it (acquire, heartbeat, force_unlock) grants to the live head
-- Invariant: a waiters entry exists only for a queued owner (grant, leave and purge remove both;
-- only a lost queue key breaks it, and then the owner's heartbeat tells it to retry).
-- Left marks: an attempt that leaves while one of its acquire requests may still arrive (the
-- client saw no reply to it, or sent it twice) is marked in P:{N}:left, and that acquire, if it
-- arrives, does nothing instead of queueing a waiter nobody refreshes (state.lua, mark_left).
-- Wake-ups: "<thread>|g|<attempt>|<token>|<grant ms>" (the lock is yours) or
-- "<thread>|r|<attempt>" (your queue entry is gone: run acquire again), pushed to the wake list
-- of the owner's client. The client's waker hands each to the thread waiting with that attempt
-- (attempt numbers are unique per client) and drops messages for attempts nobody waits with.
--
-- Tombstones. A release that leaves the lock free does not delete the hash: it sets owner to ''
-- and lives out the released hold's TTL. It keeps the token and `released`, the last RECEIPTS
-- tokens fully released,
-- which a retried release finds (its first run was applied, its reply lost). Every hold writes
-- all of its own fields, so nothing of an earlier hold leaks into it.
--
-- Tokens are max(last + 1, server time in us), last being the token in the hash (a hold or a
-- tombstone) and the fence, which a SET ... GET writes and reads in one call; so they keep rising
-- across data loss as long as the server clock does. (A fence written only now and then, as a
-- bound ahead of the tokens, would save that call, but a hold taken from such a bound runs
-- ahead of the server clock, and tokens after data loss would then go back: the fuzzer found it.)
--
-- Time. Redis's clock is the wall clock and may step. Liveness deadlines of waiters are kept on a
-- *virtual clock* per key (field ~clock of the waiters hash; for hand-offs, the *hand-off clock*
-- of the primitive's hash: field vc of the lock hash, ~vc of a semaphore's, one code for both,
-- state.lua's handoff_now): it
-- advances with the wall clock, but by at most CAP (a third of the waiter timeout) from the
-- stored reading, and never backwards from it, so a clock step of either sign neither purges live
-- waiters nor keeps dead ones for more than a few calls. Clients with different waiter timeouts
-- may wait on one lock: a clock advances by at most the smallest CAP of the clients that queued
-- on it (field ~cap of the waiters hash, field vcap / ~vcap for the hand-off clock), so
-- a client with a long timeout cannot, after a step, advance it by more than a short-timeout
-- waiter's whole timeout. Every script that judges waiters or a hand-off stores the reading it
-- took once it is due (`advance`: cap/10 after the stored one, or after a backward step), by
-- acquire, release, leave, force_unlock or heartbeat (not status, which only reads), so the
-- clock moves on with whatever traffic the lock has: a dead waiter is found dead by a call at
-- most cap/10 after its deadline however that call came (a cron job's try_lock), not only by
-- another waiter's heartbeat. So a forward step of the server clock revokes no unpopped hand-off
-- early, of the lock or of a semaphore: its deadline is on the hand-off clock. Leases are Redis
-- TTLs (a semaphore's, scores of its leases zset on the server clock): a forward step of the
-- server clock shortens them (docs/guarantees.md: Limits).
--
-- Foreign data. Another program's data at a lock's key is never modified: every key is read or
-- written through `read`, with a command that fails with WRONGTYPE on another type, before any
-- command that would overwrite it (SET, DEL, PEXPIRE), and data of fairlock's own type is
-- recognized before it is written to: the lock hash by its owner field, the waiters hash by its
-- ~clock field, the marks hash by its '~' field, queue members by the owner form
-- "<client>:<thread number>", wake-ups by "<thread>|g|" or "<thread>|r|", the fence by being a
-- token (whole digits below 2^53; another string there is put back). A script's body runs in
-- `run`, which turns a refusal into a FOREIGN error reply. On a fresh lock the refusal comes
-- before the script's first write; on a lock already in use a script may be refused midway,
-- after changing fairlock's own keys of that lock, which the foreign data has made unusable
-- anyway.
--
-- Undeclared keys. Scripts declare the four keys below; two more of the lock's keys are named
-- inside them: the wake lists (named after a waiter's client, which only the script knows: the
-- grantee of a release) and the left marks (P:{N}:left, named here to keep the key list the
-- same for every script). They share the hash tag, so they live on the lock's node; but while
-- the lock's Cluster slot migrates, Redis refuses a script's access to such a key when it is
-- missing on the node ("non local key"), an ACL key pattern may refuse them, and serverless
-- offerings that check declared keys refuse them always. Scripts are not transactions: a
-- command refused midway leaves the writes before it. So every script touches these keys
-- before the first write of the work they belong to: a grant pushes the grantee's wake-up
-- before it takes the lock (offer_wakeup), and takes it back if the rest is refused; refused
-- itself, the grant leaves the lock free with its queue, which a heartbeat repairs once the key
-- can be reached. Queueing and leaving drop the thread's old wake-ups before they write; a
-- script that may leave a left mark reads the marks first.

-- Network: these helpers only run inside a script, atomically; why a lost reply, a late delivery
-- and a repeat are safe is said per script, in its own header (every one acts only on the
-- attempt or the token it was sent for). In the function library a run's state lives in
-- upvalues shared by every call, and `reset` (with `reset_state`) rewrites all of it before
-- anything else runs, so a repeated or late call, or one after a call that failed midway,
-- starts from its own keys and arguments only, as a script sent whole does.
--
-- KEYS of every script: [1] lock hash [2] fence [3] queue [4] waiters.
-- ARGV of every script: [1] fence ttl ms [2] waiter timeout ms; the script's own from [3].
-- Every number that goes into a string is formatted with %.0f (Lua's tostring gives 1.7e+15).

-- how many fully released tokens a lock's hash remembers for retried releases
local RECEIPTS = 8

-- What one run of a script works on, set by `reset` before anything else runs: its keys, its
-- settings, the server time it read (once a run) and the numbers it formatted. They are the
-- library's upvalues on Redis 7, so a run must never see the previous run's: `reset` writes
-- every one of them.
local k, FENCE_TTL, WAITER_TTL, CAP, QUEUE_TTL, clock, clock_ms, formatted

local function reset(keys, argv)
  -- (the left marks' key, like the wake lists, is named here rather than passed: same hash tag)
  k = { lock = keys[1], fence = keys[2], queue = keys[3], waiters = keys[4],
        left = keys[1] .. ':left' }
  FENCE_TTL = tonumber(argv[1])
  WAITER_TTL = tonumber(argv[2])
  CAP = math.floor(WAITER_TTL / 3)
  -- the queue outlives a forward clock step of up to 10 minutes (its entries' own deadlines
  -- are virtual); it is deleted as soon as it is empty
  QUEUE_TTL = math.max(2 * WAITER_TTL, 600000)
  clock, clock_ms = nil, nil
  formatted = {}
end

-- n as a whole number's digits. A grant writes its token, the time and the attempt into the
-- lock hash, the fence and the wake-up message: formatted anew each time, that was ~14
-- string.format calls of ~0.7 us each on this kind of machine, on the hand-off's critical path,
-- so a run formats each number once, with '%d' (half the cost of '%.0f') where it is exact:
-- Lua 5.1 formats '%d' through a C long, 64 bits on the 64-bit builds Redis runs on nearly
-- everywhere, and 32 bits elsewhere, where the check below falls back to '%.0f'. (It runs on
-- first use: a library being loaded may not call `string`.)
local WHOLE

local function fmt(n)
  local s = formatted[n]
  if not s then
    if not WHOLE then
      WHOLE = string.format('%d', 2 ^ 53) == '9007199254740992' and '%d' or '%.0f'
    end
    s = string.format(WHOLE, n)
    if n == n then formatted[n] = s end -- (a NaN cannot be a key)
  end
  return s
end

-- ---- foreign data ---------------------------------------------------------------------------

-- The type fairlock keeps at `key` (only a refusal asks, so no run builds a table for it).
local function expected_type(key)
  if key == k.lock or key == k.waiters or key == k.left then return 'hash' end
  if key == k.fence then return 'string' end
  if key == k.queue then return 'zset' end
  return 'list'
end

local function refuse(key, what)
  error({ foreign = 'FOREIGN key ' .. key .. ' holds ' .. what ..
    '; another program uses this key: choose another lock name or key prefix' })
end

-- redis.call(cmd, key, ...), refusing a key of another type than fairlock's.
local function read(key, cmd, ...)
  local r = redis.pcall(cmd, key, ...)
  if type(r) == 'table' and r.err then
    if string.find(r.err, 'WRONGTYPE', 1, true) then
      refuse(key, 'a ' .. redis.call('TYPE', key)['ok'] .. ' but fairlock expects a ' ..
        expected_type(key))
    end
    error(r)
  end
  return r
end

-- The server's own error in a string redis.call raised: "CODE message" (Redis 7), or
-- "@user_script: 12: -CODE message" (Redis 6.2); nil for a Lua error of the script itself
-- ("user_script:12: attempt to ...").
local function server_error(r)
  if string.match(r, '^%u[%u_%-]* ') then return r end
  return string.match(r, '^@[%w_]+: ?%d+: %-(%u[%u_%-]* .*)$')
end

-- Run a script's body: its result, or its refusal or error as an error reply. A command the
-- server refused (OOM, READONLY, NOPERM, MOVED...: a table from redis.pcall, or a string from
-- redis.call) keeps its code and message, so the client tells a failover or a refused write
-- from a fault of the script itself.
local function run(body)
  local ok, r = pcall(body)
  if ok then return r end
  if type(r) == 'table' and r.foreign then return redis.error_reply(r.foreign) end
  if type(r) == 'table' and r.err then return redis.error_reply(r.err) end
  local server = type(r) == 'string' and server_error(r)
  if server then return redis.error_reply(server) end
  return redis.error_reply('ERR fairlock script: ' .. tostring(r))
end

-- Tokens are whole numbers below 2^53, so that every one is exact in Lua's numbers and in
-- '%d'. A stored token (the fence, another program's string there) that is not one is refused:
-- '1e20', 'inf' or 2^63 would overflow the next token, which the holder could then not release,
-- and tokens after it would go back.
local MAX_TOKEN = 9007199254740991

-- The value of the stored token `s`, or nil when it is not one fairlock can use.
local function token_value(s)
  if type(s) ~= 'string' or #s > 16 or not string.match(s, '^%d+$') then return nil end
  local n = tonumber(s)
  if n > MAX_TOKEN then return nil end
  return n
end

local NOT_A_TOKEN = 'a string that is not a fairlock token (whole digits below 2^53)'

-- The fence (the last token handed out; nil when it is gone), refusing another program's
-- string there.
local function read_fence()
  local f = read(k.fence, 'GET')
  if not f then return nil end
  local n = token_value(f)
  if not n then refuse(k.fence, NOT_A_TOKEN) end
  return n
end

-- ---- time -----------------------------------------------------------------------------------

-- One TIME per script (it does not change within a script anyway), and only when needed.
local function now_us()
  if not clock then
    local t = redis.call('TIME')
    clock = tonumber(t[1]) * 1000000 + tonumber(t[2])
    clock_ms = math.floor(clock / 1000)
  end
  return clock
end

-- (a hand-off's scripts read it a dozen times: computed with the reading)
local function now_ms()
  if not clock_ms then now_us() end
  return clock_ms
end

-- A virtual clock's reading now, from its stored "v|real" (false or nil: a new clock, at the
-- real time), and whether that reading is due to be stored. See "Time" above.
-- `cap`: the most it may advance in one reading (CAP, or less: see "Time").
-- Due: a reading taken less than cap/10 after the stored one is the stored reading plus the
-- real time since, which any later reading computes again from the stored one: storing it
-- changes no judgement, and skipping the write keeps it off the hand-off's path. A later
-- reading (or one after a backward step of the server clock, so that the clock runs on from
-- the new real time, or of a new clock) is stored: after a long quiet spell the clock then runs
-- at most cap/10 behind a clock stored by every run, so a dead waiter is found dead at most
-- that much later. (One parse gives both: the reading is on the hand-off's path.)
local function advance(stored, cap)
  local real = now_ms()
  local v, r = string.match(stored or '', '^(%d+)|(%d+)$')
  if not v then return real, true end
  cap = cap or CAP
  local since = real - tonumber(r)
  return tonumber(v) + math.min(math.max(since, 0), cap), since < 0 or since > cap / 10
end

-- The stored form of a virtual clock reading `v` taken now.
local function clock_value(v)
  return fmt(v) .. '|' .. fmt(now_ms())
end
