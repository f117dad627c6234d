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
