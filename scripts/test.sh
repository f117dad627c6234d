#!/usr/bin/env bash
# Runs the whole test suite: formatting, lints (the library alone and everything with every
# feature; the library without features is checked by clippy, its unit tests run with every
# feature), the docs, then unit, integration and doc tests against real redis-server processes
# that the tests start and stop themselves, and last the core suites against Redis 6.2 and
# Valkey (scripts/matrix.sh). The declared MSRV's build is scripts/msrv.sh, which CI runs
# beside this (.ci/run): it installs and builds with a second toolchain, and this suite is meant
# to stay near ten minutes on two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

ensure_test_tools

# each step's header says how long the suite has run (the suite is meant to stay near ten minutes
# on two cores)
step() { echo "== [$(( SECONDS / 60 ))m$(( SECONDS % 60 ))s] $1"; }

step "cargo fmt --check"
cargo fmt --check

step "cargo clippy: the library alone, without and with its default features (-D warnings)"
cargo clippy --quiet --lib --no-default-features -- -D warnings
cargo clippy --quiet --lib -- -D warnings
step "cargo clippy: every target with every feature (-D warnings)"
cargo clippy --quiet --all-targets --all-features -- -D warnings

step "cargo doc --all-features (-D warnings)"
RUSTDOCFLAGS="-D warnings" cargo doc --quiet --no-deps --all-features

step "cargo test --all-features"
cargo test --all-features "$@"

# (crash:: not again: its restarts and kills reach the waiting code the same way in both modes,
# and the behaviour matrix runs every primitive's waits in both)
step "the core behaviour again with a connection per waiting thread (WaitMode::PerThread)"
FAIRLOCK_TEST_WAIT_MODE=per-thread cargo test --quiet --all-features --test it -- \
  basic:: fairness:: counter:: lease:: semaphore::

step "the server matrix: the core suites against Redis 6.2.14 and Valkey 8.1.8"
scripts/matrix.sh
step "done"
