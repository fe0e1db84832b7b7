#!/usr/bin/env bash
# The whole test suite, on a fresh machine of this kind (Rust stable + cargo-nextest).
# Installs what it needs first; safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! cargo nextest --version >/dev/null 2>&1; then
  echo "== installing cargo-nextest"
  cargo install --locked cargo-nextest
fi

echo "== build"
cargo build --workspace --all-targets

echo "== tests (unit, property, socket, real processes)"
cargo nextest run --workspace --no-fail-fast --profile ci

echo "== doc tests"
cargo test --workspace --doc
