#!/usr/bin/env bash
# Compare two revisions back to back: builds the benchmark driver of each (in git worktrees
# under target/bench-ab/) and runs them in alternating rounds against one throwaway
# redis-server, so both see the same machine and the same round trip.
#
#   scripts/bench-ab.sh REV_A REV_B [ROUNDS] [SECTIONS] [LOCKS]
#
# ROUNDS defaults to 2; SECTIONS to handoff,scaling (the driver's --only list); LOCKS to every
# lock the driver knows (its --libs list, e.g. fairlock). The order alternates (A B, then B A),
# so neither side always runs first. Prints each round's Markdown tables, then for every row of a
# table with a "p50 µs" column (the hand-off tables) or an "acq/s" column (contended throughput)
# that both sides printed, the median of that figure over the rounds, side by side; the figures
# move with the machine's load, so compare rows of the same round, or medians over many rounds.
# Example:
#   scripts/bench-ab.sh dc1aca5 HEAD 24 handoff fairlock
# The worktrees (each with its driver) stay, so a second run builds nothing new; remove them with
# `rm -rf target/bench-ab && git worktree prune`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

usage="usage: scripts/bench-ab.sh REV_A REV_B [ROUNDS] [SECTIONS] [LOCKS]"
a=${1:?$usage}
b=${2:?$usage}
rounds=${3:-2}
sections=${4:-handoff,scaling}
locks=${5:-}
require_count "$rounds" "$usage"

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
    (cd "$dir" && CARGO_TARGET_DIR="$shared_target" cargo bench --quiet --all-features --no-run --bench driver >&2)
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

libs=()
if [ -n "$locks" ]; then libs=(--libs "$locks"); fi
rows="$root/rows.tsv"
: > "$rows"
for round in $(seq 1 "$rounds"); do
  order="a b"
  if [ $((round % 2)) -eq 0 ]; then order="b a"; fi
  for side in $order; do
    if [ "$side" = a ]; then rev=$a driver=$driver_a; else rev=$b driver=$driver_b; fi
    echo "== round $round: $rev"
    out="$root/round-$round-$side.md"
    "$driver" --only "$sections" "${libs[@]}" --out "$root/round-$round-$side.json" 2>/dev/null \
      | grep '^|' > "$out" || true
    cat "$out"
    # the p50 of every row of a table with a "p50 µs" column (the hand-off tables) and the
    # acquisitions per second of every row of one with an "acq/s" column (contended
    # throughput), labelled by the row's first two cells (three for throughput: lock, workers,
    # hold) and the column (a table's header is the line before its |---| line)
    awk -F'|' -v side="$side" '
      /^\| *---/ {
        col = 0
        n = split(header, h, "|")
        for (i = 2; i < n; i++) if (!col && h[i] ~ /^ *(p50 µs|acq\/s) *$/) { col = i; name = h[i] }
        gsub(/^ +| +$/, "", name)
        next
      }
      { header = $0 }
      col > 0 && $col ~ /^ *[0-9.]+ *$/ {
        label = $2 "|" $3 (name == "acq/s" ? "|" $4 : "")
        printf "%s\t%s %s\t%s\n", side, label, name, $col + 0
      }
    ' "$out" >> "$rows"
  done
done

# the median over the rounds of each row's p50, per side
median() { tr ' ' '\n' | grep . | sort -g | awk '{ x[NR] = $1 } END { print (NR % 2 ? x[(NR + 1) / 2] : (x[NR / 2] + x[NR / 2 + 1]) / 2) }'; }
echo "== medians over $rounds rounds (hand-off p50 µs, contended acq/s): $a -> $b"
awk -F'\t' '{ v[$2 "\t" $1] = v[$2 "\t" $1] " " $3; seen[$2] = 1 }
  END { for (r in seen) if ((r "\ta") in v && (r "\tb") in v) print r "\t" v[r "\ta"] "\t" v[r "\tb"] }' "$rows" \
  | sort | while IFS=$'\t' read -r row va vb; do
      ma=$(median <<< "$va")
      mb=$(median <<< "$vb")
      awk -v r="$row" -v a="$ma" -v b="$mb" 'BEGIN { printf "%s: %s -> %s (%+.1f %%)\n", r, a, b, (b / a - 1) * 100 }'
    done
