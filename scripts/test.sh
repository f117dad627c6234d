#!/usr/bin/env bash
# Runs the whole test suite: formatting, lints (the library alone and everything with every
# feature; the library without features is checked by clippy, its unit tests run with every
# feature), the docs, the declared MSRV's build, then unit, integration and doc tests against
# real redis-server processes that the tests start and stop themselves, and last the core suites
# against Redis 6.2 and Valkey (scripts/matrix.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

ensure_test_tools

echo "== cargo fmt --check"
cargo fmt --check

echo "== cargo clippy: the library alone (without and with its default features), then every target with every feature (-D warnings)"
cargo clippy --quiet --lib --no-default-features -- -D warnings
cargo clippy --quiet --lib -- -D warnings
cargo clippy --quiet --all-targets --all-features -- -D warnings

echo "== cargo doc --all-features (-D warnings)"
RUSTDOCFLAGS="-D warnings" cargo doc --quiet --no-deps --all-features

echo "== the declared MSRV builds the library and the CLI"
scripts/msrv.sh

echo "== cargo test --all-features"
cargo test --all-features "$@"

echo "== the core behaviour again with a connection per waiting thread (WaitMode::PerThread)"
FAIRLOCK_TEST_WAIT_MODE=per-thread cargo test --quiet --all-features --test it -- \
  basic:: fairness:: counter:: lease:: crash:: semaphore::

echo "== the server matrix: the core suites against Redis 6.2.14 and Valkey 8.1.8"
scripts/matrix.sh
