-- sem_renew.lua: extend one hold's lease, never shortening it.
-- ARGV: [3] owner [4] attempt [5] token [6] lease ms. Returns 1 (renewed) or 0 (not held).
-- Network: acts only on the hold of that attempt and token; a repeat or a late copy extends at
-- most to its own send time + lease, never below what a later renewal set.
local owner, attempt, token, lease = ARGV[3], tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
return run(function()
  local id = hold_id(owner, attempt)
  read_sem(KEYS, id)
  expire_holds()
  revoke_dead_grantees()
  local h = own_hold()
  if not (h and h.token_text == token) then return 0 end
  -- its holder renews it, so it has it: a hand-off of it is confirmed
  zrem(k.handoffs, id)
  local until_ms = now_ms() + lease
  zview(k.leases)
  if (tonumber(read(k.leases, 'ZSCORE', id)) or 0) < until_ms then
    zadd(k.leases, fmt(until_ms), id)
  end
  keep_sem(lease)
  return 1
end)
