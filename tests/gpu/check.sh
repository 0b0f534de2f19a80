#!/usr/bin/env bash
# GPU device check, for a machine with NVIDIA GPUs, CUDA's
# driver, python3 + cuda-bindings + numpy, and no Rust toolchain:
#   1. the daemon runs with sim NICs and CUDA pools (--gpu_backend cuda);
#   2. per GPU, one client process fetches fd + metadata over the sockets,
#      imports with cuMemImportFromShareableHandle, maps, writes a pattern; a
#      second process imports and reads it back equal;
#   3. the daemon holds one nv_dmabuf fd per pool (/proc/<pid>/fdinfo);
#   4. --gpu_shmem_type file serves a 64-byte IPC handle two processes share;
#   5. SIGTERM: clean exit 0, no socket files left;
#   6. doctor (sim NICs, CUDA GPUs): MIG off on every GPU (procfs and NVML,
#      compared with nvidia-smi), the driver library named, the CUDA checks
#      passing; the daemon logs that no GPU is partitioned. Nothing here
#      changes a GPU's MIG setting.
# Prints PASS/FAIL per check; exits 1 on any FAIL.
# Env: RXDM_BIN (daemon binary), OUT (logs), RXDM_WHEELS (fallback wheels).
set -u
. "$(dirname "$0")/lib.sh"
CLIENT="$PY $GPU_DIR/rxdm_gpu.py"
LOG="$OUT/check.log"
: >"$LOG"
say() { echo "$@" | tee -a "$LOG"; }
run() { "$@" 2>&1 | tee -a "$LOG"; }

DPID=
UDS=
start_daemon() { # name, extra flags...
    local name=$1
    shift
    UDS=$(mktemp -d /tmp/rxdm-uds.XXXXXX)
    "$RXDM_BIN" --gpu_nic_preset sim --gpu_backend cuda --uds_path "$UDS" --monitor_shutdown=false \
        --metrics_address 127.0.0.1:19467 --debug_endpoints=local "$@" >"$OUT/daemon-$name.log" 2>&1 &
    DPID=$!
    local t0=$SECONDS
    while ! grep -q 'Buffer manager initialization completed.' "$OUT/daemon-$name.log"; do
        if ! kill -0 "$DPID" 2>/dev/null || [ $((SECONDS - t0)) -gt 90 ]; then
            say "FAIL daemon-ready-$name: daemon not ready; log tail:"
            tail -20 "$OUT/daemon-$name.log" | tee -a "$LOG"
            kill -KILL "$DPID" 2>/dev/null
            DPID=
            return 1
        fi
        sleep 0.2
    done
    say "PASS daemon-ready-$name: pid $DPID ready in $((SECONDS - t0))s ($(grep -m1 'pools allocated' "$OUT/daemon-$name.log" | grep -o 'elapsed_ms=[0-9.]*'))"
    if grep -q 'no GPU is partitioned (MIG)' "$OUT/daemon-$name.log" && grep -q 'CUDA driver loaded' "$OUT/daemon-$name.log"; then
        say "PASS daemon-no-mig-$name: $(grep -m1 'no GPU is partitioned' "$OUT/daemon-$name.log" | sed 's/.*INFO //'); $(grep -m1 'CUDA driver loaded' "$OUT/daemon-$name.log" | sed 's/.*INFO //')"
    else
        say "FAIL daemon-no-mig-$name: no MIG verdict or no library line in the log"
    fi
}

stop_daemon() { # name
    local name=$1
    kill -TERM "$DPID"
    wait "$DPID"
    local rc=$?
    local left
    left=$(find "$UDS" -mindepth 1 -not -name '.*' | wc -l)
    if [ "$rc" = 0 ] && [ "$left" = 0 ] && ! grep -q panicked "$OUT/daemon-$name.log"; then
        say "PASS daemon-exit-$name: SIGTERM -> exit 0, sockets removed, no panic"
    else
        say "FAIL daemon-exit-$name: exit $rc, $left socket files left, panics: $(grep -c panicked "$OUT/daemon-$name.log")"
    fi
    DPID=
}
trap '[ -n "$DPID" ] && kill -KILL "$DPID" 2>/dev/null' EXIT

ensure_cuda_bindings 2>&1 | tee -a "$LOG"
say "== $(nvidia-smi -L 2>&1 | head -8 | tr '\n' ' ')"

# --- doctor: no MIG, the library named, the CUDA checks pass ----------------
DUDS=$(mktemp -d /tmp/rxdm-doctor.XXXXXX)
"$RXDM_BIN" doctor --gpu_nic_preset sim --gpu_backend cuda --uds_path "$DUDS/tcpx" --json \
    >"$OUT/doctor.json" 2>"$OUT/doctor.err"
say "   doctor exit $?"
run "$PY" - "$OUT/doctor.json" <<'PY'
import json, subprocess, sys
r = json.load(open(sys.argv[1]))
gpu = [c for c in r["checks"] if c["section"] == "GPUs"]
for c in gpu:
    print(f"   doctor {c['status']:4} {c['name']}: {c['found']}")
by = {c["name"]: c for c in gpu}
smi = subprocess.run(["nvidia-smi", "--query-gpu=pci.bus_id,mig.mode.current", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip().splitlines()
print("   nvidia-smi mig.mode.current:", "; ".join(smi))
smi_off = bool(smi) and all(l.split(",")[1].strip() in ("Disabled", "[N/A]") for l in smi)
mig = by.get("MIG", {})
ok = smi_off and mig.get("status") == "pass" and "NVML (" in mig.get("found", "") and "procfs" in mig.get("found", "")
print("PASS" if ok else "FAIL", "doctor-no-mig:", mig.get("status"), mig.get("found"), "| nvidia-smi all off:", smi_off)
drv = by.get("driver", {})
ok = drv.get("status") == "pass" and "libcuda" in drv.get("found", "")
print("PASS" if ok else "FAIL", "doctor-driver-named:", drv.get("found"))
per_gpu = [c for c in gpu if c["name"].count(":") == 2]
ok = len(per_gpu) == len(smi) and all(c["status"] in ("pass", "warn") for c in per_gpu)
print("PASS" if ok else "FAIL", "doctor-cuda-checks:", ", ".join(f"{c['name']} {c['status']}" for c in per_gpu))
PY
rm -rf "$DUDS"

# --- fd mode (VMM pools shared by POSIX fd) ---------------------------------
if start_daemon fd; then
    mapfile -t GPUS < <($CLIENT list "$UDS")
    NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
    if [ "${#GPUS[@]}" -gt 0 ] && [ "${#GPUS[@]}" = "$NGPU" ]; then
        say "PASS sim-placement: the sim topology serves the ${#GPUS[@]} CUDA GPU(s): ${GPUS[*]}"
    else
        say "FAIL sim-placement: sockets for ${#GPUS[@]} GPU(s) (${GPUS[*]:-none}), nvidia-smi lists $NGPU"
    fi
    for gpu in "${GPUS[@]}"; do
        run $CLIENT write "$UDS" "$gpu" 7
        run $CLIENT read "$UDS" "$gpu" 7
        run $CLIENT notfound "$UDS" "$gpu" 0000:ff:1f.7
    done
    run $CLIENT fdinfo "$DPID" "${#GPUS[@]}"
    run "$PY" - <<'PY'
import json, urllib.request
cfg = json.load(urllib.request.urlopen("http://127.0.0.1:19467/debug/config"))
print("   /debug/config backends:", cfg["backends"])
for p in cfg["pools"]:
    print("   pool:", p["pool"])
ok = cfg["backends"]["gpu"] == "cuda" and all("dma-buf exported" in p["pool"] for p in cfg["pools"])
print(("PASS" if ok else "FAIL"), "debug-config: gpu backend cuda, every pool exported a dma-buf")
PY
    stop_daemon fd
fi

# --- file mode (cuMemAlloc + 64-byte IPC handle) -----------------------------
if start_daemon file --gpu_shmem_type file; then
    mapfile -t GPUS < <($CLIENT list "$UDS")
    for gpu in "${GPUS[@]}"; do
        run $CLIENT ipc-write "$UDS" "$gpu" 11
        run $CLIENT ipc-read "$UDS" "$gpu" 11
        run $CLIENT notfound "$UDS" "$gpu" "$gpu" # no shareable fd in file mode
    done
    stop_daemon file
fi

PASSES=$(grep -c '^PASS' "$LOG")
FAILS=$(grep -c '^FAIL' "$LOG")
say "== device check: $PASSES passed, $FAILS failed"
[ "$FAILS" = 0 ] && [ "$PASSES" -gt 0 ]
