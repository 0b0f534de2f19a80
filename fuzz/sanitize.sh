#!/usr/bin/env bash
# The unit tests of the modules with `unsafe` code (fd passing, netlink, the
# ethtool ioctls, pidfds and peer credentials, the mapped pools, the CUDA
# wrappers) under AddressSanitizer, which on x86_64 Linux includes
# LeakSanitizer, on the stable toolchain. Tests marked "needs root" run too
# when run as root. Builds in its own target folder (default
# /tmp/tcpx-rxdm-asan: the flags differ from a normal build). Usage:
#   fuzz/sanitize.sh [EXTRA TEST FILTERS...]
# On a shared machine: nice -n 19 fuzz/sanitize.sh
set -euo pipefail
cd "$(dirname "$0")/.."

host=$(rustc -vV | sed -n 's/^host: //p')
case "$host" in
  x86_64-unknown-linux-gnu | aarch64-unknown-linux-gnu) ;;
  *) echo "fuzz/sanitize.sh: no AddressSanitizer for $host" >&2; exit 2 ;;
esac

# Every module with an unsafe block (grep -rl unsafe src), as test filters.
modules=(
  daemon::job_end doctor::host endpoint::accept_backoff gpu:: handover:: host::memory
  identity:: netlink:: nic::ethtool steering::intake wire::
)
ignored=()
[ "$(id -u)" = 0 ] && ignored=(--include-ignored)

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/tmp/tcpx-rxdm-asan}
# The explicit --target keeps the flags off build scripts and proc macros.
export RUSTC_BOOTSTRAP=1 RUSTFLAGS="-Zsanitizer=address"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:detect_stack_use_after_return=1:abort_on_error=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-}
cargo test --locked --lib --target "$host" -- "${ignored[@]}" "${modules[@]}" "$@"
