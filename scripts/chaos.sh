#!/usr/bin/env bash
# The long fault-injection run: worker processes contend for two locks through a TCP proxy while
# the harness SIGKILLs and SIGSTOPs them, restarts redis-server (without persistence, and with
# appendonly + appendfsync always, in alternating rounds), cuts, black-holes and slows the
# network, delivers a request of an abandoned connection late, force-unlocks holds through a
# connection whose reply is lost, and (without persistence, under libfaketime) steps the server's
# wall clock; a checker reads the histories and fails on any violation. Prints the summary, also
# written to target/chaos/summary.json (per round: target/chaos/long-NN-*/).
#
# The topology modes run the same workers against a Sentinel group (1 master, 2 replicas, 3
# sentinels; redis+sentinel:// URL) or a Redis Cluster (3 masters with a replica each, the two
# locks on different masters; redis+cluster:// URL), in rounds of a fresh topology, with master
# SIGKILLs (the killed node restarted as a replica after the promotion) and graceful failovers
# (SENTINEL FAILOVER / CLUSTER FAILOVER) besides the worker kills and pauses; no network faults
# there (clients connect to the addresses the topology announces, past any proxy). The checker
# counts what asynchronous replication explains (a grant the killed master took with it) apart,
# as no violation; everything else fails the run. Totals in target/chaos/summary-sentinel.json
# and summary-cluster.json (per round: target/chaos/sentinel-NN/, cluster-NN/).
#
#   scripts/chaos.sh [SECONDS] [MODE] [WORKLOAD]   SECONDS default 600 (per mode); MODE:
#     single    (default) one redis-server behind the proxy, the run described first
#     sentinel  a Sentinel group
#     cluster   a Redis Cluster
#     tls       a Sentinel group that speaks TLS only (rediss+sentinel:// URL)
#     all       single, sentinel, cluster and tls one after another, SECONDS each
#   WORKLOAD (or FAIRLOCK_CHAOS_WORKLOAD; default mutex) is what the workers contend for:
#     mutex     a fair lock per name (the run described above)
#     sem       a fairlock::Semaphore of capacity 3 per name, holds of 1-2 permits; checked for
#               never more than 3 permits held at once, tokens unique and rising where the
#               grant order is known, FIFO, liveness, keys, force-releases (tests/it/chaos/checker.rs, 10.)
#     rw        a fairlock::RwLock per name, a quarter of the holds writes (the counter and the
#               fenced write of the mutex workload); a write beside any other hold is a violation
#   The sem and rw runs write their totals to target/chaos/summary[-MODE]-WORKLOAD.json and their
#   rounds to target/chaos/WORKLOAD-*/.
#   FAIRLOCK_CHAOS_SEED=N           replay a fault schedule (the seed is printed per round)
#   scripts/chaos.sh short   the short mode: three scenarios that inject every kind of fault once,
#     about a minute each (one node without persistence, one with appendfsync always, a TLS
#     Sentinel group; mutex workload unless WORKLOAD is given as the second argument). The first
#     also runs in scripts/test.sh; the other two only here, to keep that suite near ten minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

usage="usage: scripts/chaos.sh [SECONDS] [single|sentinel|cluster|tls|all] [mutex|sem|rw] | scripts/chaos.sh short [mutex|sem|rw]"
if [ "${1:-}" = short ]; then
  workload=${2:-${FAIRLOCK_CHAOS_WORKLOAD:-mutex}}
  case "$workload" in
    mutex|sem|rw) export FAIRLOCK_CHAOS_WORKLOAD="$workload" ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
  ensure_test_tools
  echo "== chaos short mode, ${workload} workload: three scenarios (release build)"
  exec cargo test --release --all-features --test it -- --include-ignored chaos::chaos_short_ --nocapture
fi
seconds=${1:-600}
mode=${2:-single}
workload=${3:-${FAIRLOCK_CHAOS_WORKLOAD:-mutex}}
require_count "$seconds" "$usage"
case "$workload" in
  mutex|sem|rw) export FAIRLOCK_CHAOS_WORKLOAD="$workload" ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
case "$mode" in
  single) tests=(chaos_long) ;;
  sentinel) tests=(chaos_long_sentinel) ;;
  cluster) tests=(chaos_long_cluster) ;;
  tls) tests=(chaos_long_tls) ;;
  all) tests=(chaos_long chaos_long_sentinel chaos_long_cluster chaos_long_tls) ;;
  *) echo "$usage" >&2; exit 2 ;;
esac

ensure_test_tools
failed=()
for test in "${tests[@]}"; do
  echo "== chaos long mode ${test}, ${workload} workload, for ${seconds} s (release build)"
  FAIRLOCK_CHAOS_SECS="$seconds" run_long_mode it "chaos::$test" || failed+=("$test")
done
if [ "${#failed[@]}" -gt 0 ]; then
  echo "== chaos: failed: ${failed[*]}" >&2
  exit 1
fi
