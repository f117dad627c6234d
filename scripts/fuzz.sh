#!/usr/bin/env bash
# The long protocol fuzzer run: seeded steps of many logical clients over the real Lua scripts,
# with lost replies, late deliveries, retries, crashes, pauses, evictions, data loss and server
# clock steps (tests/it/fuzz/mod.rs). Prints steps/s, the seeds, the faults injected by kind and every
# violation (with its shrunk step list); exits non-zero on a violation.
#
#   scripts/fuzz.sh [STEPS]          default 1000000 steps (the short mode runs in scripts/test.sh)
#   scripts/fuzz.sh --deadlock [STEPS]
#                                    the deadlock world instead (tests/it/fuzz/deadlock.rs): default
#                                    200000 steps, 5000 per seed; FAIRLOCK_DL_FUZZ_SEED first seed
#   FAIRLOCK_FUZZ_SEED=N             first seed (consecutive seeds follow; default from the clock)
#   FAIRLOCK_FUZZ_SECONDS=N          stop after N seconds even if the steps are not done
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

if [ "${1:-}" = "--deadlock" ]; then
  steps=${2:-200000}
  require_count "$steps" "usage: scripts/fuzz.sh --deadlock [STEPS]"
  ensure_test_tools
  echo "== fuzz long mode, the deadlock world: ${steps} steps (release build)"
  FAIRLOCK_DL_FUZZ_STEPS="$steps" run_long_mode it fuzz::deadlock::long
  exit 0
fi
steps=${1:-1000000}
require_count "$steps" "usage: scripts/fuzz.sh [STEPS] | --deadlock [STEPS]"

ensure_test_tools
echo "== fuzz long mode: ${steps} steps (release build)"
FAIRLOCK_FUZZ_STEPS="$steps" run_long_mode it fuzz::long
