#!/usr/bin/env bash
# The main job, shown end to end: a throwaway redis-server, then worker processes with several
# threads each contending for one lock (FIFO hand-offs, fencing tokens, a counter check).
# The server is stopped at the end, whatever happens.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

ensure_redis_server
echo "== building the demo"
cargo build --quiet --release --example demo

start_redis DEMO
trap 'stop_redis "$DEMO_PID" "$DEMO_DIR"' EXIT
echo "== throwaway redis-server on $DEMO_URL"
echo

target/release/examples/demo "$DEMO_URL"
