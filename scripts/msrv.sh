#!/usr/bin/env bash
# Check that the library and the command-line tool build with the oldest Rust the crate
# declares (Cargo.toml's rust-version), as a user on that compiler would build them: a copy of
# the working tree, its dependencies resolved by cargo's MSRV-aware resolver, checked with that
# toolchain (installed by rustup when missing).
#
#   scripts/msrv.sh
#
# One pin is needed, and the README says so: r2d2's scheduled-thread-pool 0.2.8 moved to
# parking_lot 0.13, which needs Rust 1.95, while 0.2.7 works with the same r2d2. When rustup
# cannot fetch the toolchain (no network), the check is skipped with a message; clippy's
# incompatible_msrv lint (in scripts/test.sh) still checks the standard library items our code
# uses against the declared version.
set -euo pipefail
cd "$(dirname "$0")/.."

msrv=$(sed -n 's/^rust-version = "\(.*\)"$/\1/p' Cargo.toml)
[ -n "$msrv" ] || { echo "msrv.sh: Cargo.toml declares no rust-version" >&2; exit 1; }
if ! rustup run "$msrv" rustc --version >/dev/null 2>&1; then
  if ! timeout 300 rustup toolchain install "$msrv" --profile minimal >/dev/null 2>&1; then
    echo "msrv.sh: cannot install Rust $msrv with rustup (offline?): MSRV build skipped" >&2
    exit 0
  fi
fi

copy=target/msrv/crate
rm -rf "$copy"
mkdir -p "$copy"
git ls-files -z --cached --others --exclude-standard |
  while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
  xargs -0 cp --parents -t "$copy"
cd "$copy"
CARGO_RESOLVER_INCOMPATIBLE_RUST_VERSIONS=fallback cargo "+$msrv" generate-lockfile --quiet
cargo "+$msrv" update --quiet scheduled-thread-pool --precise 0.2.7
CARGO_TARGET_DIR=../target cargo "+$msrv" check --quiet --all-features --lib --bins
echo "msrv.sh: the library and the CLI build with Rust $msrv"
