#!/usr/bin/env bash
# What a fairlock script costs Redis before it does anything: the server time per EVALSHA
# (`INFO commandstats`, usec_per_call) of a bare `return 1`, of the helper preludes with
# `return 1`, and of two real scripts on paths that do not change the lock (a `try` on a held
# lock, a release by a non-owner), each run 20000 times by redis-benchmark on one connection.
#
#   scripts/lua-cost.sh
#
# The figures show where the script time of an acquisition goes (README: Benchmarks); they
# move with the machine's load like every timing here, so compare rows of one run.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

ensure_redis_server
command -v redis-benchmark >/dev/null || { echo "lua-cost.sh: redis-benchmark is missing" >&2; exit 1; }
start_redis COST
trap 'stop_redis "$COST_PID" "$COST_DIR"' EXIT
port=${COST_URL##*:}
port=${port%/}
cli() { redis-cli -p "$port" "$@"; }

keys=(4 '{x}' '{x}:fence' '{x}:queue' '{x}:waiters' 604800000 3000)
common=$(cat scripts/common.lua)
state=$(cat scripts/state.lua)

# per_call NAME CODE ARGS...: load CODE, run EVALSHA with ARGS 20000 times, print usec_per_call
per_call() {
  local name=$1 code=$2 sha
  shift 2
  sha=$(cli SCRIPT LOAD "$code")
  cli CONFIG RESETSTAT >/dev/null
  redis-benchmark -p "$port" -n 20000 -c 1 -q EVALSHA "$sha" "${keys[@]}" "$@" >/dev/null
  printf '| %s | %s |\n' "$name" \
    "$(cli INFO commandstats | sed -n 's/.*cmdstat_evalsha:.*usec_per_call=\([0-9.]*\).*/\1/p')"
}

acquire=$(printf '%s\n%s\n%s' "$common" "$state" "$(cat scripts/acquire.lua)")
cli EVALSHA "$(cli SCRIPT LOAD "$acquire")" "${keys[@]}" other:1 1 30000 wait 'h|1|1' >/dev/null

echo "| script | server µs per call |"
echo "|---|---:|"
per_call 'return 1' 'return 1'
per_call 'common.lua + return 1' "$(printf '%s\nreturn 1' "$common")"
per_call 'common.lua + state.lua + return 1' "$(printf '%s\n%s\nreturn 1' "$common" "$state")"
per_call 'acquire, try on a held lock' "$acquire" me:1 1 30000 try 'h|2|1'
per_call 'release by a non-owner' \
  "$(printf '%s\n%s\n%s' "$common" "$state" "$(cat scripts/release.lua)")" me:1 123 1
per_call 'reenter by a non-owner' "$(printf '%s\n%s' "$common" "$(cat scripts/reenter.lua)")" me:1 123 1
