#!/usr/bin/env bash
# The long fault-injection run: worker processes contend for two locks through a TCP proxy while
# the harness SIGKILLs and SIGSTOPs them, restarts redis-server (without persistence, and with
# appendonly + appendfsync always, in alternating rounds), cuts, black-holes and slows the
# network, delivers a request of an abandoned connection late, force-unlocks holds through a
# connection whose reply is lost, and (without persistence, under libfaketime) steps the server's
# wall clock; a checker reads the histories and fails on any violation. Prints the summary, also
# written to target/chaos/summary.json (per round: target/chaos/long-NN-*/).
#
#   scripts/chaos.sh [SECONDS]      default 600; the short mode runs in scripts/test.sh
#   FAIRLOCK_CHAOS_SEED=N           replay a fault schedule (the seed is printed per round)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

seconds=${1:-600}
require_count "$seconds" "usage: scripts/chaos.sh [SECONDS]"

ensure_test_tools
echo "== chaos long mode for ${seconds} s (release build)"
FAIRLOCK_CHAOS_SECS="$seconds" run_long_mode chaos chaos_long
