#!/usr/bin/env bash
# Compare two revisions back to back: builds the benchmark driver of each (in git worktrees
# under target/bench-ab/) and runs them in alternating rounds against one throwaway
# redis-server, so both see the same machine and the same round trip.
#
#   scripts/bench-ab.sh REV_A REV_B [ROUNDS] [SECTIONS]
#
# ROUNDS defaults to 2; SECTIONS to handoff,scaling (the driver's --only list). Prints each
# round's Markdown tables; the figures move with the machine's load, so compare rows of the
# same round. Example: scripts/bench-ab.sh dc1aca5 HEAD
# The worktrees (each with its driver) stay, so a second run builds nothing new; remove them with
# `rm -rf target/bench-ab && git worktree prune`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

a=${1:?usage: scripts/bench-ab.sh REV_A REV_B [ROUNDS] [SECTIONS]}
b=${2:?usage: scripts/bench-ab.sh REV_A REV_B [ROUNDS] [SECTIONS]}
rounds=${3:-2}
sections=${4:-handoff,scaling}

ensure_redis_server
root=target/bench-ab
mkdir -p "$root"
shared_target=$(pwd)/$root/target

# build_driver REV: a worktree of REV with its driver built; prints the driver's path
build_driver() {
  local rev=$1 sha dir
  sha=$(git rev-parse --short "$rev")
  dir="$root/$sha"
  if [ ! -d "$dir" ]; then
    git worktree add --detach -q "$dir" "$sha"
  fi
  if [ ! -x "$dir/driver" ]; then
    echo "== building the driver of $rev ($sha)" >&2
    # One target dir for every revision: the dependencies build once. Cargo may take another
    # revision's fairlock for fresh there, so its fingerprints go first, and the driver is
    # kept in the worktree.
    rm -rf "$shared_target"/release/.fingerprint/fairlock-*
    (cd "$dir" && CARGO_TARGET_DIR="$shared_target" cargo bench --quiet --no-run --bench driver >&2)
    cp "$(find "$shared_target/release/deps" -maxdepth 1 -type f -name 'driver-*' ! -name '*.d' \
      -printf '%T@ %p\n' | sort -n | tail -n1 | cut -d' ' -f2)" "$dir/driver"
  fi
  echo "$dir/driver"
}

driver_a=$(build_driver "$a")
driver_b=$(build_driver "$b")

start_redis AB
trap 'stop_redis "$AB_PID" "$AB_DIR"' EXIT
export FAIRLOCK_BENCH_REDIS="$AB_URL"

for round in $(seq 1 "$rounds"); do
  for side in a b; do
    if [ "$side" = a ]; then rev=$a driver=$driver_a; else rev=$b driver=$driver_b; fi
    echo "== round $round: $rev"
    "$driver" --only "$sections" --out "$root/round-$round-$side.json" 2>/dev/null | grep '^|'
  done
done
