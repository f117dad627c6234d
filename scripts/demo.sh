#!/usr/bin/env bash
# The main job, shown end to end: a throwaway redis-server, then worker processes with several
# threads each contending for one lock (FIFO hand-offs, fencing tokens, a counter check).
# The server is stopped at the end, whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

ensure_redis_server
echo "== building the demo and the command-line tool"
cargo build --quiet --release --features cli --example demo --bin fairlock
FAIRLOCK=target/release/fairlock

start_redis DEMO
trap 'stop_redis "$DEMO_PID" "$DEMO_DIR"' EXIT
echo "== throwaway redis-server on $DEMO_URL"
echo

echo "=============== Part 1: the library ==============="
target/release/examples/demo "$DEMO_URL"

echo
echo "=============== Part 2: the command-line tool ==============="
echo "== Four 'servers' start the same cron job 200 ms apart; the lock runs them one at a time, in arrival order"
export FAIRLOCK_REDIS_URL="$DEMO_URL"
jobdir=$(mktemp -d -t fairlock-demo.XXXXXX)
trap 'stop_redis "$DEMO_PID" "$DEMO_DIR"; rm -rf "$jobdir"' EXIT
cat > "$jobdir/nightly-report" <<'JOB'
#!/bin/sh
echo "  $(date +%T.%3N) server $1 runs the job (fencing token $FAIRLOCK_TOKEN)"
exec sleep "${2:-0.5}"
JOB
chmod +x "$jobdir/nightly-report"
job="$jobdir/nightly-report"

# (wait on these PIDs only: a bare `wait` would also wait for the background redis-server)
pids=()
for server in A B C D; do
  "$FAIRLOCK" run nightly-report -- "$job" "$server" &
  pids+=($!)
  sleep 0.2
done
wait "${pids[@]}"

echo
echo "== A 'server' whose job is still running elsewhere gives up at once (cron-friendly: exit 0)"
"$FAIRLOCK" run nightly-report -- "$job" X 2 &
first=$!
sleep 0.3
"$FAIRLOCK" run nightly-report --no-wait --busy-exit-code 0 -- "$job" Y \
  && echo "  server Y: lock busy, exit code 0, the job did not run twice"
wait "$first"

echo
echo "== Server E holds the lock (lease 2 s) and is killed with SIGKILL; server F waits"
"$FAIRLOCK" run nightly-report --lease 2s -- "$job" E 60 &
e_pid=$!
sleep 0.5
"$FAIRLOCK" run nightly-report --lease 2s -- "$job" F 0 &
f_pid=$!
sleep 0.5
"$FAIRLOCK" status nightly-report | sed 's/^/  /'
echo "  $(date +%T.%3N) kill -9 server E's fairlock"
kill -9 "$e_pid"
wait "$e_pid" 2>/dev/null || true
wait "$f_pid"
echo "  (F took over within E's 2 s lease of the kill, without anyone releasing the lock)"
