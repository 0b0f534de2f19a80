#!/usr/bin/env bash
# GPU device check of the takeover, against the real driver, with CUDA pools:
#   1. in one process (examples/pool_adopt): a pool adopted from dups of its
#      fds keeps the same files and memory after the original is dropped;
#      dropping an adoption frees only its own; IPC pools and wrong sizes are
#      refused;
#   2. daemon A (sim NICs, --gpu_backend cuda) serves its pools; a client
#      imports each pool's fd and writes a pattern; A's dma-bufs are noted
#      (/proc/<A>/fdinfo: exp_name, inode);
#   3. daemon B starts with the same flags and --takeover: A logs
#      "handed over to pid <B>" and exits 0, B logs "took over from pid <A>"
#      and then its ready line;
#   4. a new client imports each pool from B and reads the pattern back;
#   5. B holds the same dma-bufs (same inodes) as A did, and /debug/config
#      shows its pools as taken over;
#   6. SIGTERM: B exits 0.
# Prints PASS/FAIL per check; exits 1 on any FAIL.
# Env: RXDM_BIN (daemon binary), POOL_ADOPT (examples/pool_adopt binary),
# SIZES (pool_adopt's sizes, default 64M,1G,4G), OUT (logs), RXDM_WHEELS.
set -u
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
POOL_ADOPT=${POOL_ADOPT:-$REPO/target/release/examples/pool_adopt}
CLIENT="$PY $GPU_DIR/rxdm_gpu.py"
LOG="$OUT/takeover.log"
: >"$LOG"
say() { echo "$@" | tee -a "$LOG"; }
run() { "$@" 2>&1 | tee -a "$LOG"; }
METRICS=127.0.0.1:19469
READY='Buffer manager initialization completed.'

APID=
BPID=
cleanup() {
    local p
    for p in $APID $BPID; do kill -KILL "$p" 2>/dev/null; done
}
trap cleanup EXIT

ensure_cuda_bindings 2>&1 | tee -a "$LOG"
say "== $(nvidia-smi -L 2>&1 | head -8 | tr '\n' ' ')"

# --- 1. adopt in one process ---------------------------------------------------
if [ -x "$POOL_ADOPT" ]; then
    "$POOL_ADOPT" --sizes "${SIZES:-64M,1G,4G}" --iters 3 2>&1 | tee -a "$LOG"
    rc=${PIPESTATUS[0]}
    [ "$rc" = 0 ] || say "FAIL pool-adopt: exit $rc"
else
    say "FAIL pool-adopt: no binary at $POOL_ADOPT (set POOL_ADOPT)"
fi

# --- 2.-6. one daemon takes over from another ----------------------------------
# Prints "<exp_name>:<inode>" per dma-buf fd process $1 holds, sorted.
dmabufs() {
    local fd info
    for fd in /proc/"$1"/fd/*; do
        info=$(cat "/proc/$1/fdinfo/${fd##*/}" 2>/dev/null) || continue
        local exp
        exp=$(sed -n 's/^exp_name:[[:space:]]*//p' <<<"$info")
        [ -n "$exp" ] && echo "$exp:$(stat -L -c %i "$fd")"
    done | sort
}

# Waits up to 90 s for line $2 in log $1 while pid $3 lives.
await() {
    local t0=$SECONDS
    until grep -qF "$2" "$1"; do
        if ! kill -0 "$3" 2>/dev/null || [ $((SECONDS - t0)) -gt 90 ]; then
            return 1
        fi
        sleep 0.2
    done
}

UDS=$(mktemp -d /tmp/rxdm-uds.XXXXXX)
FLAGS=(--gpu_nic_preset sim --gpu_backend cuda --uds_path "$UDS" --monitor_shutdown=false --metrics_address "$METRICS" --debug_endpoints=local)
"$RXDM_BIN" "${FLAGS[@]}" >"$OUT/daemon-A.log" 2>&1 &
APID=$!
if ! await "$OUT/daemon-A.log" "$READY" "$APID"; then
    say "FAIL daemon-A-ready: log tail:"
    tail -20 "$OUT/daemon-A.log" | tee -a "$LOG"
else
    say "PASS daemon-A-ready: pid $APID"
    mapfile -t GPUS < <($CLIENT list "$UDS")
    [ "${#GPUS[@]}" -gt 0 ] || say "FAIL pools: no get_gpu_fd_ socket under $UDS"
    for gpu in "${GPUS[@]}"; do
        run $CLIENT write "$UDS" "$gpu" 13
    done
    A_BUFS=$(dmabufs "$APID")
    say "   A's dma-bufs: $(tr '\n' ' ' <<<"$A_BUFS")"

    t0=$(date +%s%N)
    "$RXDM_BIN" "${FLAGS[@]}" --takeover >"$OUT/daemon-B.log" 2>&1 &
    BPID=$!
    # A hands over and exits.
    for _ in $(seq 450); do kill -0 "$APID" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$APID" 2>/dev/null; then
        say "FAIL A-exits: A (pid $APID) still runs 90 s after B started"
        kill -KILL "$APID"
    fi
    wait "$APID"
    arc=$?
    APID_WAS=$APID
    APID=
    if [ "$arc" = 0 ] && grep -q "handed over to pid $BPID" "$OUT/daemon-A.log"; then
        say "PASS A-hands-over: A exited 0 after logging 'handed over to pid $BPID'"
    else
        say "FAIL A-hands-over: A exited $arc; log tail:"
        tail -10 "$OUT/daemon-A.log" | tee -a "$LOG"
    fi
    if await "$OUT/daemon-B.log" "$READY" "$BPID"; then
        ms=$((($(date +%s%N) - t0) / 1000000))
        took=$(grep -n "took over from pid $APID_WAS" "$OUT/daemon-B.log" | head -1 | cut -d: -f1)
        ready=$(grep -nF "$READY" "$OUT/daemon-B.log" | head -1 | cut -d: -f1)
        if [ -n "$took" ] && [ "$took" -lt "$ready" ]; then
            say "PASS B-takes-over: B logged 'took over from pid $APID_WAS', then ready, ${ms} ms after it started"
        else
            say "FAIL B-takes-over: no 'took over from pid $APID_WAS' before the ready line; log tail:"
            tail -10 "$OUT/daemon-B.log" | tee -a "$LOG"
        fi
        for gpu in "${GPUS[@]}"; do
            run $CLIENT read "$UDS" "$gpu" 13
        done
        B_BUFS=$(dmabufs "$BPID")
        if [ -n "$A_BUFS" ] && [ "$A_BUFS" = "$B_BUFS" ]; then
            say "PASS same-dmabufs: B holds A's dma-bufs: $(tr '\n' ' ' <<<"$B_BUFS")"
        else
            say "FAIL same-dmabufs: A held '$(tr '\n' ' ' <<<"$A_BUFS")', B holds '$(tr '\n' ' ' <<<"$B_BUFS")'"
        fi
        run "$PY" - "$METRICS" <<'PY'
import json, sys, urllib.request
cfg = json.load(urllib.request.urlopen(f"http://{sys.argv[1]}/debug/config"))
pools = [p["pool"] for p in cfg["pools"]]
for p in pools:
    print("   pool:", p)
ok = bool(pools) and all("taken over, dma-buf kept" in p for p in pools)
print(("PASS" if ok else "FAIL"), "debug-config: every pool of B is taken over with its dma-buf kept")
PY
        kill -TERM "$BPID"
        wait "$BPID"
        rc=$?
        if [ "$rc" = 0 ] && ! grep -q panicked "$OUT/daemon-A.log" "$OUT/daemon-B.log"; then
            say "PASS B-exit: SIGTERM -> exit 0, no panic in either log"
        else
            say "FAIL B-exit: exit $rc, panics: $(cat "$OUT/daemon-A.log" "$OUT/daemon-B.log" | grep -c panicked)"
        fi
        BPID=
    else
        say "FAIL B-ready: B not ready; log tail:"
        tail -20 "$OUT/daemon-B.log" | tee -a "$LOG"
    fi
fi

PASSES=$(grep -c '^PASS' "$LOG")
FAILS=$(grep -c '^FAIL' "$LOG")
say "== takeover device check: $PASSES passed, $FAILS failed"
[ "$FAILS" = 0 ] && [ "$PASSES" -gt 0 ]
