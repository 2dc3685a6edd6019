#!/usr/bin/env bash
# Runs the integer dot-product kernels' tests on aarch64 (NEON) under qemu user-mode
# emulation, through the standalone crate models/kernels-check (the same kernels.rs, without
# candle). Installs the aarch64 Rust target, a cross linker and qemu when they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=aarch64-unknown-linux-gnu
if ! rustup target list --installed | grep -qx "$TARGET"; then
  rustup target add "$TARGET"
fi
need=()
command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
if ((${#need[@]})); then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
export CARGO_TARGET_DIR="$PWD/target/kernels-check"
# The workspace's `target-cpu=native` describes this x86 machine, not the emulated one.
export RUSTFLAGS=""
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
# The aarch64-only code is invisible to the workspace's clippy run on x86.
cargo clippy --manifest-path models/kernels-check/Cargo.toml --target "$TARGET" --all-targets -- -D warnings
cargo test --manifest-path models/kernels-check/Cargo.toml --target "$TARGET"
