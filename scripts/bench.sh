#!/usr/bin/env bash
# Benchmarks against a throwaway redis-server: uncontended and re-entrant cost, hand-off
# latency, contended throughput with fairness, scaling with waiters, Redis calls and CPU per
# acquisition (per script for fairlock); fairlock, the redlock crate and the naive lock, in RTTs;
# what waiting threads cost (connections, memory, hand-off with 1-256 waiters; fairlock).
#
#   scripts/bench.sh [--quick] [--out PATH]
#
# Writes the JSON results (default target/bench/results.json, or PATH) and prints Markdown
# tables. The full run takes about 4.5 minutes after the build; --quick (what CI runs) checks that
# everything still works in well under a minute and its numbers mean nothing.
# Benchmarks are not tests: nothing here fails on a slow figure, only on a broken run.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

quick=""
out="target/bench/results.json"
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick="--quick" ;;
    --out) out="${2:?--out needs a path}"; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

ensure_redis_server
echo "== building the benchmarks (cargo bench --no-run)" >&2
cargo bench --quiet --no-run >&2

target_dir=$(cargo metadata --format-version 1 --no-deps 2>/dev/null |
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
target_dir=${target_dir:-target}

# a port that had no listener can still fail to bind (an outgoing connection's local port): retry
for attempt in 1 2 3 4 5; do
  if start_redis BENCH; then break; fi
  [ "$attempt" -lt 5 ] || { echo "bench.sh: could not start redis-server" >&2; exit 1; }
done
trap 'stop_redis "$BENCH_PID" "$BENCH_DIR"' EXIT
export FAIRLOCK_BENCH_REDIS="$BENCH_URL"
echo "== redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p') on $BENCH_URL; load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2

if [ -n "$quick" ]; then
  criterion_args=(--warm-up-time 0.1 --measurement-time 0.2 --sample-size 10)
else
  criterion_args=(--warm-up-time 1 --measurement-time 3)
fi
echo "== criterion micro benchmarks" >&2
cargo bench --quiet --bench micro -- --noplot "${criterion_args[@]}" >&2

echo "== driver${quick:+ (quick)}" >&2
mkdir -p "$(dirname "$out")"
cargo bench --quiet --bench driver -- $quick --out "$out" --criterion "$target_dir/criterion"
