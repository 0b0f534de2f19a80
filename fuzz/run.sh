#!/usr/bin/env bash
# Runs one fuzz target under libFuzzer (cargo-fuzz) on the stable toolchain,
# with AddressSanitizer where the host supports it. Installs the pinned
# cargo-fuzz when it is missing. New inputs go to fuzz/target/corpus/TARGET
# (kept between runs, not committed); the committed seeds in
# fuzz/corpus/TARGET are read too. Usage:
#   fuzz/run.sh TARGET SECONDS [LIBFUZZER OPTIONS...]
#   fuzz/run.sh --list        the targets, one a line
#   fuzz/run.sh --build       builds every target (nothing run)
# Exit status: 0 no crash; 1 a crash (its input is named on the last line);
# 2 bad usage. On a shared machine: nice -n 19 fuzz/run.sh ...
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_FUZZ_VERSION=0.13.2

targets() {
  awk '/^\[\[bin\]\]/ { bin = 1; next } bin && /^name = / { gsub(/"/, "", $3); print $3; bin = 0 }' fuzz/Cargo.toml
}

usage() {
  echo "usage: fuzz/run.sh TARGET SECONDS [LIBFUZZER OPTIONS...] | --list | --build" >&2
  echo "targets: $(targets | tr '\n' ' ')" >&2
  exit 2
}

# Longest input per target: the Kubernetes ones take whole manifests.
max_len() {
  case "$1" in
    webhook | inject) echo 16384 ;;
    http | envfile) echo 8192 ;;
    status) echo 512 ;;
    argv) echo 2048 ;;
    *) echo 4096 ;;
  esac
}

ensure_cargo_fuzz() {
  if [ "$(cargo fuzz --version 2>/dev/null)" != "cargo-fuzz $CARGO_FUZZ_VERSION" ]; then
    echo "fuzz/run.sh: installing cargo-fuzz $CARGO_FUZZ_VERSION" >&2
    cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
  fi
}

# AddressSanitizer (LeakSanitizer with it) where rustc supports it for the host.
sanitizer() {
  case "$(rustc -vV | sed -n 's/^host: //p')" in
    x86_64-unknown-linux-gnu | aarch64-unknown-linux-gnu) echo address ;;
    *) echo none ;;
  esac
}

[ $# -ge 1 ] || usage
case "$1" in
  --list)
    targets
    exit 0
    ;;
  --build)
    ensure_cargo_fuzz
    RUSTC_BOOTSTRAP=1 cargo fuzz build --sanitizer "$(sanitizer)"
    exit 0
    ;;
  -*) usage ;;
esac
[ $# -ge 2 ] || usage
target=$1
seconds=$2
shift 2
targets | grep -qx -- "$target" || { echo "fuzz/run.sh: no target $target" >&2; usage; }
[[ "$seconds" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz/run.sh: SECONDS must be a positive whole number" >&2; usage; }

ensure_cargo_fuzz
scratch=fuzz/target/corpus/$target
mkdir -p "$scratch"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# cargo-fuzz's default build: optimised, with debug assertions and overflow
# checks. RUSTC_BOOTSTRAP lets stable rustc take the sanitizer and coverage flags.
status=0
RUSTC_BOOTSTRAP=1 cargo fuzz run --sanitizer "$(sanitizer)" "$target" "$scratch" "fuzz/corpus/$target" -- \
  -max_total_time="$seconds" -max_len="$(max_len "$target")" -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 "$@" 2>&1 | tee "$log" || status=$?

runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
edges=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | cut -d' ' -f2)
if [ "$status" -ne 0 ]; then
  input=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
  echo "fuzz/run.sh: $target FAILED after ${runs:-?} runs (exit $status); input: ${input:-none written, see the log above}" >&2
  echo "replay: RUSTC_BOOTSTRAP=1 cargo fuzz run --sanitizer $(sanitizer) $target ${input:-FILE}" >&2
  exit 1
fi
echo "fuzz/run.sh: $target: ${runs:-?} runs in ${seconds} s, ${edges:-?} edges covered, no crash"
