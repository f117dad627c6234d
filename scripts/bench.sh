#!/usr/bin/env bash
# Benchmarks against a throwaway redis-server: uncontended and re-entrant cost, hand-off
# latency, contended throughput with fairness, scaling with waiters, Redis calls and CPU per
# acquisition (per script for fairlock); fairlock, the redlock crate and the naive lock, in RTTs;
# what waiting threads cost (connections, memory, hand-off with 1-256 waiters; fairlock);
# fairlock on a 3-master Redis Cluster next to one node, and over TLS next to plain TCP
# (hand-off, contended throughput); the semaphore and the read/write lock beside the mutex
# (hand-off, throughput; cost with 1-256 holders, hand-off with 1-256 waiters), and node
# redis-semaphore's Semaphore on the same server (hand-off, throughput; when node and npm are
# installed; written to <out>-redis-semaphore.json); against node redis-semaphore's barging Mutex
# (section peer: 8 worker processes, throughput, fairness, Redis server time and CPU per
# acquisition, the uncontended pair, memory per lock and per waiter; beside them the fair floor,
# the least a FIFO lock on Redis does), closed by the speed targets, PASS or FAIL against the peer
# of the same run.
#
#   scripts/bench.sh [--quick] [--out PATH] [--only SECTIONS]
#
# Writes the JSON results (default target/bench/results.json, or PATH) and prints Markdown
# tables. The full run takes about 6.5 minutes after the build; --quick (what CI runs) checks that
# everything still works in well under a minute and its numbers mean nothing.
# --only SECTIONS (comma-separated: micro, handoff, throughput, fifo, scaling, scripts, waiting,
# cluster, tls, semaphore, peer) runs those sections of the driver only, and skips the criterion micro benchmarks
# unless "micro" is among them.
# Benchmarks are not tests: nothing here fails on a slow figure, only on a broken run.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

quick=""
out="target/bench/results.json"
only=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) quick="--quick" ;;
    --out) out="${2:?--out needs a path}"; shift ;;
    --only) only=(--only "${2:?--only needs sections, e.g. handoff,cluster}"); shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

ensure_redis_server
ensure_openssl
echo "== building the benchmarks (cargo bench --all-features --no-run)" >&2
cargo bench --quiet --all-features --no-run >&2

target_dir=$(cargo metadata --format-version 1 --no-deps 2>/dev/null |
  sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
target_dir=${target_dir:-target}

# a port that had no listener can still fail to bind (an outgoing connection's local port): retry
for attempt in 1 2 3 4 5; do
  if start_redis BENCH; then break; fi
  [ "$attempt" -lt 5 ] || { echo "bench.sh: could not start redis-server" >&2; exit 1; }
done
# a Redis Cluster of 3 masters (no replicas, as the single node has none) for section "cluster"
cluster_pids=() cluster_dirs=() cluster_nodes=()
stop_all() {
  stop_redis "$BENCH_PID" "$BENCH_DIR"
  for i in "${!cluster_pids[@]}"; do stop_redis "${cluster_pids[$i]}" "${cluster_dirs[$i]}"; done
  if [ -n "${tls_pid:-}" ]; then stop_redis "$tls_pid" "$TLS_DIR"; fi
}
trap stop_all EXIT
for _ in 1 2 3; do
  # the cluster bus listens on port + 10000, which may be taken: try other ports
  for attempt in 1 2 3 4 5; do
    if start_redis NODE --cluster-enabled yes --cluster-config-file nodes.conf \
      --cluster-node-timeout 5000 2>/dev/null; then break; fi
    [ "$attempt" -lt 5 ] || { echo "bench.sh: could not start a cluster node" >&2; exit 1; }
  done
  cluster_pids+=("$NODE_PID") cluster_dirs+=("$NODE_DIR") cluster_nodes+=("127.0.0.1:$NODE_PORT")
done
redis-cli --cluster create "${cluster_nodes[@]}" --cluster-yes >/dev/null
for _ in $(seq 1 200); do
  ok=0
  for node in "${cluster_nodes[@]}"; do
    redis-cli -p "${node#*:}" cluster info | grep -q '^cluster_state:ok' && ok=$((ok + 1))
  done
  [ "$ok" -eq 3 ] && break
  sleep 0.1
done
[ "$ok" -eq 3 ] || { echo "bench.sh: the cluster did not reach cluster_state:ok" >&2; exit 1; }
export FAIRLOCK_BENCH_CLUSTER="redis+cluster://$(IFS=,; echo "${cluster_nodes[*]}")/"
# a TLS-only redis-server for section "tls"
tls_pid=""
for attempt in 1 2 3 4 5; do
  if start_tls_redis TLS; then tls_pid=$TLS_PID; break; fi
  [ "$attempt" -lt 5 ] || { echo "bench.sh: could not start a TLS redis-server" >&2; exit 1; }
done
export FAIRLOCK_BENCH_TLS="$TLS_URL" FAIRLOCK_BENCH_TLS_CA="$TLS_CA"
export FAIRLOCK_BENCH_REDIS="$BENCH_URL"
echo "== redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p') on $BENCH_URL; load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2

if [ -n "$quick" ]; then
  criterion_args=(--warm-up-time 0.1 --measurement-time 0.2 --sample-size 10)
else
  criterion_args=(--warm-up-time 1 --measurement-time 3)
fi
if [ ${#only[@]} -eq 0 ] || [[ ",${only[1]}," == *,micro,* ]]; then
  echo "== criterion micro benchmarks" >&2
  cargo bench --quiet --all-features --bench micro -- --noplot "${criterion_args[@]}" >&2
fi

# node redis-semaphore on the same server: its Mutex, the barging peer of the driver's section
# "peer" (FAIRLOCK_BENCH_NODE_PEER tells the driver where it is), and its Semaphore for the
# semaphore's tables (sections handoff and semaphore, run here before the driver so that the
# driver's targets close the output); skipped without node and npm, or when npm cannot fetch the
# packages (npm ci only when the installed ones do not match the lock file)
wants() { [ ${#only[@]} -eq 0 ] || [[ ",${only[1]}," == *,"$1",* ]]; }
peer=benches/peers/redis-semaphore
if wants handoff || wants semaphore || wants peer; then
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "== peer redis-semaphore skipped: node and npm are not installed" >&2
  elif ! (cd "$peer" && { npm ls --silent >/dev/null 2>&1 || npm ci --no-audit --no-fund --silent >&2; }); then
    echo "== peer redis-semaphore skipped: npm could not install it" >&2
  else
    export FAIRLOCK_BENCH_NODE_PEER="$PWD/$peer"
    if wants handoff || wants semaphore; then
      echo "== peer: node redis-semaphore (Semaphore)" >&2
      if [ -n "$quick" ]; then peer_args=(20 0.5); else peer_args=(200 4); fi
      mkdir -p "$(dirname "$out")"
      node "$peer/handoff.js" "$BENCH_URL" "${peer_args[@]}" "${out%.json}-redis-semaphore.json"
    fi
  fi
fi

echo "== driver${quick:+ (quick)}" >&2
mkdir -p "$(dirname "$out")"
cargo bench --quiet --all-features --bench driver -- $quick --out "$out" --criterion "$target_dir/criterion" "${only[@]}"
