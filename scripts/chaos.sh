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
case "$seconds" in
  ''|*[!0-9]*) echo "usage: scripts/chaos.sh [SECONDS]" >&2; exit 2 ;;
esac

# libfaketime steps the server's wall clock (tests/fuzz/faketime.rs)
if ! declare -F ensure_faketime >/dev/null; then
  ensure_faketime() {
    if compgen -G "/usr/lib/*/faketime/libfaketime.so.1" >/dev/null \
       || [ -e /usr/lib/faketime/libfaketime.so.1 ]; then
      return 0
    fi
    echo "libfaketime not found: installing Debian's faketime package" >&2
    local sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq faketime >/dev/null
    compgen -G "/usr/lib/*/faketime/libfaketime.so.1" >/dev/null \
      || { echo "could not install faketime" >&2; return 1; }
  }
fi

ensure_redis_server
ensure_faketime
echo "== redis-server: $(redis-server --version | head -n1)"
echo "== chaos long mode for ${seconds} s (release build)"
FAIRLOCK_CHAOS_SECS="$seconds" cargo test --release --test chaos -- \
  --ignored --exact chaos_long --nocapture
