#!/usr/bin/env bash
# What a fairlock script costs Redis, called as a function of the library (FCALL, Redis 7) and
# sent whole (EVALSHA, Redis 6.2's way): the server time per call (`INFO commandstats`,
# usec_per_call) of a bare `return 1`, and of four real scripts on paths that change nothing (a
# `try` on a held lock, a release, a re-entry and a renewal by a non-owner), each run 20000 times
# by redis-benchmark on one connection, in ROUNDS alternating rounds (default 3).
#
#   scripts/lua-cost.sh [ROUNDS]
#
# Then the floor of the design: the very Redis calls of an uncontended acquire and release (as
# the bench's per-script table lists them), in two functions that do nothing else, next to the
# naive lock's pair (SET NX PX, then a GET + DEL script).
#
# Last, the steps of a hand-off's scripts one by one: each of the library's helpers (common.lua,
# state.lua) that the release and the queueing acquire run, 100 times in one function call on a
# held lock with one waiter, so that a step's cost is its row less the empty loop's, divided by
# 100 (the calls among them only read, but for the waiters hash's clock, stored at most once a
# call when due).
#
# The figures show where the script time of an acquisition goes (docs/benchmarks.md); they move
# with the machine's load like every timing here, so compare rows of one round.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

rounds=${1:-3}
require_count "$rounds" "usage: scripts/lua-cost.sh [ROUNDS]"
ensure_redis_server
command -v redis-benchmark >/dev/null || { echo "lua-cost.sh: redis-benchmark is missing" >&2; exit 1; }
lua() { cargo run --quiet --features raw --example lua_code -- "$1"; }
lua library >/dev/null # build once, before the server starts
start_redis COST
trap 'stop_redis "$COST_PID" "$COST_DIR"' EXIT
port=${COST_URL##*:}
port=${port%/}
cli() { redis-cli -p "$port" "$@"; }

keys=(4 '{x}' '{x}:fence' '{x}:queue' '{x}:waiters' 604800000 3000)
lib=$(cli FUNCTION LOAD REPLACE "$(lua library)")
cli FCALL "${lib}_acquire" "${keys[@]}" other:1 1 30000 wait 'h|1|1' >/dev/null

# usec CMD ARGS...: run the command 20000 times, print its usec_per_call
usec() {
  local stat
  stat=$(printf '%s' "$1" | tr '[:upper:]' '[:lower:]')
  cli CONFIG RESETSTAT >/dev/null
  redis-benchmark -p "$port" -n 20000 -c 1 -q "$@" >/dev/null
  cli INFO commandstats | sed -n "s/.*cmdstat_$stat:.*usec_per_call=\([0-9.]*\).*/\1/p"
}

# row NAME SCRIPT ARGS...: EVALSHA and FCALL of one script, with the script's own ARGS
row() {
  local name=$1 script=$2 sha
  shift 2
  sha=$(cli SCRIPT LOAD "$(lua "$script")")
  local e f
  e=$(usec EVALSHA "$sha" "${keys[@]}" "$@")
  f=$(usec FCALL "${lib}_$script" "${keys[@]}" "$@")
  printf '| %s | %s | %s | %s |\n' "$round" "$name" "$e" "$f"
}

echo "| round | script | EVALSHA µs per call | FCALL µs per call |"
echo "|---:|---|---:|---:|"
for round in $(seq 1 "$rounds"); do
  printf '| %s | `return 1` | %s | - |\n' "$round" "$(usec EVALSHA "$(cli SCRIPT LOAD 'return 1')" 0)"
  row 'acquire, try on a held lock' acquire me:1 1 30000 try 'h|2|1'
  row 'release by a non-owner' release me:1 123 1
  row 'reenter by a non-owner' reenter me:1 123 1
  row 'renew by a non-owner' renew me:1 123 30000
done

# The floor: an uncontended pair's calls with no logic around them.
floor='#!lua name=fairlock_floor
redis.register_function("floor_acquire", function(KEYS, ARGV)
  redis.call("HMGET", KEYS[1], "owner", "attempt", "token", "lease", "released", "wdl", "vc")
  redis.call("EXISTS", KEYS[3], KEYS[4])
  redis.call("TIME")
  redis.call("SET", KEYS[2], "1795601210931211", "PX", ARGV[1], "GET")
  redis.call("HSET", KEYS[1], "owner", "me:1", "attempt", "1", "count", 1, "token",
    "1795601210931211", "lease", "30000", "since", "1795601210931", "meta", "h|1|1", "wdl", "")
  redis.call("PEXPIRE", KEYS[1], 30000)
  return 1
end)
redis.register_function("floor_release", function(KEYS, ARGV)
  redis.call("HMGET", KEYS[1], "owner", "attempt", "token", "lease", "released", "wdl", "vc")
  redis.call("ZRANGE", KEYS[3], 0, 1)
  redis.call("HSET", KEYS[1], "owner", "", "released", "1795601210931211")
  return 1
end)'
cli FUNCTION LOAD REPLACE "$floor" >/dev/null
floor_keys=(4 '{f}' '{f}:fence' '{f}:queue' '{f}:waiters' 604800000 3000)
naive_del=$(cli SCRIPT LOAD "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0")
echo
echo "| round | the design's floor, and the naive lock | server µs per call |"
echo "|---:|---|---:|"
for round in $(seq 1 "$rounds"); do
  printf '| %s | floor acquire (HMGET, EXISTS, TIME, SET GET, HSET, PEXPIRE) | %s |\n' "$round" \
    "$(usec FCALL floor_acquire "${floor_keys[@]}")"
  printf '| %s | floor release (HMGET, ZRANGE, HSET) | %s |\n' "$round" \
    "$(usec FCALL floor_release "${floor_keys[@]}")"
  printf '| %s | naive acquire (SET NX PX) | %s |\n' "$round" \
    "$(usec SET '{n}' me NX PX 30000)"
  printf '| %s | naive release (EVALSHA: GET, DEL) | %s |\n' "$round" \
    "$(usec EVALSHA "$naive_del" 1 '{n}' me)"
done

# The steps: the library's helpers under other function names, and a function per step that runs
# it 100 times (a held lock "{s}" with one waiter, queued by the library's own acquire).
steps_lib=$(lua library | sed -e '1s/.*/#!lua name=fairlock_steps/' \
  -e "s/redis.register_function('fairlock_[0-9a-f]*_/redis.register_function('steps_/")
steps_lib+='
local function hundred(step)
  return function(KEYS, ARGV)
    reset(KEYS, ARGV)
    reset_state()
    return run(function()
      for i = 1, 100 do step(i) end
      return 1
    end)
  end
end
redis.register_function("step_loop", hundred(function() end))
redis.register_function("step_read_lock", hundred(function() read_lock() end))
redis.register_function("step_front", hundred(function() Q = nil front() end))
redis.register_function("step_waiter_entry", hundred(function() reset_state() waiter_entry("w:1") end))
redis.register_function("step_time", hundred(function() clock, clock_ms = nil, nil now_ms() end))
redis.register_function("step_advance", hundred(function() advance("1795601210931|1795601210931", 1000) end))
redis.register_function("step_clock_value", hundred(function(i) formatted = {} clock_value(1795601210931 + i) end))
redis.register_function("step_parse_waiter", hundred(function() parse_waiter("12|1795601210931|30000|h|1|1") end))
redis.register_function("step_grant_message", hundred(function(i) formatted = {} grant_message(12 + i, 1795601210931211 + i) end))
redis.register_function("step_wake_of", hundred(function() wake_of("0f8c2d4e-5a6b-4c7d-8e9f-a0b1c2d3e4f5:4") end))
redis.register_function("step_with_receipt", hundred(function() with_receipt("1795601210931205 1795601210931206 1795601210931207 1795601210931208 1795601210931209 1795601210931210", "1795601210931211") end))
redis.register_function("step_token_value", hundred(function() token_value("1795601210931211") end))'
cli FUNCTION LOAD REPLACE "$steps_lib" >/dev/null
step_keys=(4 '{s}' '{s}:fence' '{s}:queue' '{s}:waiters' 604800000 3000)
cli FCALL steps_acquire "${step_keys[@]}" h:1 1 30000 wait 'h|1|1' >/dev/null
cli FCALL steps_acquire "${step_keys[@]}" w:1 1 30000 wait 'h|1|1' >/dev/null
echo
echo "| round | step (100 times in one call) | server µs per call | µs per step (less the empty loop) |"
echo "|---:|---|---:|---:|"
for round in $(seq 1 "$rounds"); do
  loop=$(usec FCALL step_loop "${step_keys[@]}")
  printf '| %s | the empty loop | %s | - |\n' "$round" "$loop"
  for step in read_lock front waiter_entry time advance clock_value parse_waiter grant_message \
    wake_of with_receipt token_value; do
    us=$(usec FCALL "step_$step" "${step_keys[@]}")
    printf '| %s | `%s` | %s | %s |\n' "$round" "$step" "$us" \
      "$(awk -v a="$us" -v b="$loop" 'BEGIN { printf "%.2f", (a - b) / 100 }')"
  done
done
