#!/usr/bin/env bash
# Runs the whole test suite: formatting, lints, unit, integration and doc tests against real
# redis-server processes that the tests start and stop themselves.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

ensure_test_tools

echo "== cargo fmt --check"
cargo fmt --check

echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --quiet --all-targets -- -D warnings

echo "== cargo test"
cargo test "$@"
