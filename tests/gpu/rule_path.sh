#!/usr/bin/env bash
# The rule path on a machine with many cores and no Rust toolchain (the
# device machine's host): the release benchmark (examples/bench) against the
# release daemon, with an earlier build side by side (OLD_BIN, `--also`) in
# the same interleaved rounds, then the tenant checks, then the hostile cases.
# Everything it prints goes to $OUT/rule_path.txt; the header names the cores,
# the kernel and the load.
# Needs root for the tenant checks' GPU stand-ins and the hostile cases'
# cgroups and network namespaces (the bench says what it skipped otherwise).
# Exits 1 only when a part failed (a request got a wrong answer, a daemon did
# not start, a binary is missing); numbers are reported, never judged here.
# Env: BENCH (the bench binary, default target/release/examples/bench),
#      RXDM_BIN (the daemon), OLD_BIN (an earlier daemon build; optional),
#      ROUNDS (default 3), REQUESTS (per client count and round, default 20000),
#      FLOOD_SECONDS (the plain flood's, default 3), HOSTILE_SECONDS (the
#      garbled-IPv6 flood's, default 14; 0 skips it), OUT (where the results go).
#      A quick look: ROUNDS=1 REQUESTS=2000 FLOOD_SECONDS=1 HOSTILE_SECONDS=0.
set -u
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
BENCH=${BENCH:-$REPO/target/release/examples/bench}
ROUNDS=${ROUNDS:-3}
REQUESTS=${REQUESTS:-20000}
FLOOD_SECONDS=${FLOOD_SECONDS:-3}
HOSTILE_SECONDS=${HOSTILE_SECONDS:-14}
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
{
    echo "cores: $(nproc) (of $(nproc --all))"
    echo "kernel: $(uname -r)"
    echo "load: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "daemon: $RXDM_BIN${OLD_BIN:+, side by side with $OLD_BIN}"
} | tee -a "$RESULTS"
# The rule path against the floor, 1 and 64 clients, default mode.
run --bin "$RXDM_BIN" ${ALSO[@]+"${ALSO[@]}"} --clients 1,64 --rounds "$ROUNDS" --requests "$REQUESTS" \
    --startups 0 --rules 0 --ethtool-rules 0 --delay-requests 0 --stall-samples 0 --tenant_requests 0 \
    --hostile_seconds 0 --flood_seconds 0
# Each --tenant_isolation mode against the floor, fake and loopback flows.
run --bin "$RXDM_BIN" --tenants_only --rounds "$ROUNDS"
# Hostile tenants: a plain flood, new clients holding many files, a garbled-IPv6 flood.
run --bin "$RXDM_BIN" ${ALSO[@]+"${ALSO[@]}"} --hostile_only --rounds "$ROUNDS" \
    --flood_seconds "$FLOOD_SECONDS" --hostile_seconds "$HOSTILE_SECONDS"
echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$RESULTS"
echo "results: $RESULTS"
exit $status
