#!/usr/bin/env bash
# The rule path on a machine with many cores and no Rust toolchain (the
# device machine's host): the release benchmark (examples/bench) against the
# release daemon, with an earlier build side by side (OLD_BIN, `--also`) in
# the same interleaved rounds, then the tenant checks, then the hostile cases.
# Everything it prints goes to $OUT/rule_path.txt, the header of each part
# names the cores, the kernel and the load.
# Needs root for the tenant checks' GPU stand-ins and the hostile cases'
# cgroup (it says what it skipped otherwise).
# Env: BENCH (the bench binary, default target/release/examples/bench),
#      RXDM_BIN (the daemon), OLD_BIN (an earlier daemon build; optional),
#      ROUNDS (default 3), OUT (where the results go).
set -u
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
BENCH=${BENCH:-$REPO/target/release/examples/bench}
ROUNDS=${ROUNDS:-3}
RESULTS="$OUT/rule_path.txt"
: >"$RESULTS"
for f in "$BENCH" "$RXDM_BIN" ${OLD_BIN:+"$OLD_BIN"}; do
    [ -x "$f" ] || { echo "FAIL setup: $f is not an executable" | tee -a "$RESULTS"; exit 1; }
done
ALSO=()
[ -n "${OLD_BIN:-}" ] && ALSO=(--also "$OLD_BIN")
status=0
run() {
    echo "== bench $*" | tee -a "$RESULTS"
    "$BENCH" "$@" 2>&1 | tee -a "$RESULTS"
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "FAIL bench $*" | tee -a "$RESULTS"; status=1; }
}
nproc | sed 's/^/cores: /' | tee -a "$RESULTS"
# The rule path against the floor, 1 and 64 clients, default mode.
run --bin "$RXDM_BIN" "${ALSO[@]}" --clients 1,64 --rounds "$ROUNDS" --startups 0 --rules 0 \
    --ethtool-rules 0 --delay-requests 0 --stall-samples 0 --tenant_requests 0
# Each --tenant_isolation mode against the floor, fake and loopback flows.
run --bin "$RXDM_BIN" --tenants_only --rounds "$ROUNDS"
# One tenant flooding, new clients holding many files.
run --bin "$RXDM_BIN" "${ALSO[@]}" --hostile_only --rounds "$ROUNDS"
echo "results: $RESULTS"
exit $status
