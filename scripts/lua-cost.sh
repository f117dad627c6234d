#!/usr/bin/env bash
# What a fairlock script costs Redis, called as a function of the library (FCALL, Redis 7) and
# sent whole (EVALSHA, Redis 6.2's way): the server time per call (`INFO commandstats`,
# usec_per_call) of a bare `return 1`, and of four real scripts on paths that change nothing (a
# `try` on a held lock, a release, a re-entry and a renewal by a non-owner), each run 20000 times
# by redis-benchmark on one connection, in ROUNDS alternating rounds (default 3).
#
#   scripts/lua-cost.sh [ROUNDS]
#
# The figures show where the script time of an acquisition goes (README: Benchmarks); they move
# with the machine's load like every timing here, so compare rows of one round.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

rounds=${1:-3}
require_count "$rounds" "usage: scripts/lua-cost.sh [ROUNDS]"
ensure_redis_server
command -v redis-benchmark >/dev/null || { echo "lua-cost.sh: redis-benchmark is missing" >&2; exit 1; }
lua() { cargo run --quiet --example lua_code -- "$1"; }
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
