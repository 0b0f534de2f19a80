#!/usr/bin/env bash
# GPU device check of tenant isolation against the real NVIDIA driver and
# device nodes, with CUDA pools (--gpu_backend cuda, --tenant_isolation=enforce):
#   1. the daemon takes each GPU's minor from the driver's
#      /proc/driver/nvidia/gpus/<pci>/information (as nvidia-smi reports it);
#   2. a CUDA client (cuInit first, so it holds /dev/nvidia<minor> open, as an
#      NCCL job does) gets the pool's fd, imports it and writes through it;
#   3. a GPU is a client's only while the client holds its device node open
#      for reading and writing: in a mount namespace of its own, a client is
#      refused (PERMISSION_DENIED, naming the GPU) when /dev/nvidia<minor> is a
#      regular file it holds open (with CUDA pools only the character device
#      counts), a node it made with mknod, a symlink (absolute or relative) to
#      the real node, the real node that it opened and closed again, or the
#      real node held read-only or by an O_PATH descriptor; it gets the fd
#      when it holds the real node (bind-mounted) open for reading and writing;
#   4. the refusals are counted and logged.
# Prints PASS/FAIL per check; exits 1 on any FAIL. Needs root (mount namespaces).
# Env: RXDM_BIN (daemon binary), OUT (logs), RXDM_WHEELS (fallback wheels).
set -u
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname "$0")/lib.sh"
CLIENT="$PY $GPU_DIR/rxdm_gpu.py"
LOG="$OUT/tenants.log"
: >"$LOG"
say() { echo "$@" | tee -a "$LOG"; }

# Fetches GPU $2's pool fd from folder $1 (see fetch_pool.py for the rest).
FETCH="$GPU_DIR/fetch_pool.py"

UDS=$(mktemp -d /tmp/rxdm-uds.XXXXXX)
"$RXDM_BIN" --gpu_nic_preset sim --gpu_backend cuda --uds_path "$UDS" --monitor_shutdown=false \
    --metrics_address 127.0.0.1:19468 --tenant_isolation=enforce >"$OUT/daemon-tenants.log" 2>&1 &
DPID=$!
trap 'kill -KILL "$DPID" 2>/dev/null' EXIT
t0=$SECONDS
until grep -q 'Buffer manager initialization completed.' "$OUT/daemon-tenants.log"; do
    if ! kill -0 "$DPID" 2>/dev/null || [ $((SECONDS - t0)) -gt 90 ]; then
        say "FAIL daemon-ready: log tail:"
        tail -20 "$OUT/daemon-tenants.log" | tee -a "$LOG"
        exit 1
    fi
    sleep 0.2
done
ensure_cuda_bindings 2>&1 | tee -a "$LOG"
mapfile -t GPUS < <($CLIENT list "$UDS")
gpu=${GPUS[0]}
# The driver's own record of the GPU (what nvidia-smi reads too).
want=$(sed -n 's/^Device Minor:[[:space:]]*//p' "/proc/driver/nvidia/gpus/$gpu/information" 2>/dev/null)
got=$(daemon_gpu_minors "$OUT/daemon-tenants.log" | head -1)
node=$(stat -c '%t:%T' "/dev/nvidia$want" 2>/dev/null)
if [ -n "$want" ] && [ "$want" = "$got" ] && [ "$node" = "c3:$(printf %x "$want")" ]; then
    say "PASS driver-minor: $gpu is /dev/nvidia$got (195:$got), as the driver's information file says"
else
    say "FAIL driver-minor: $gpu: daemon took minor '${got}', the driver says '${want}', /dev/nvidia$want is '$node'"
fi
minor=${want:-0}

out=$($CLIENT write "$UDS" "$gpu" 5 2>&1)
echo "$out" >>"$LOG"
if grep -q '^PASS' <<<"$out" && ! grep -q '^FAIL' <<<"$out"; then
    say "PASS own-device: a client that sees /dev/nvidia$minor imports $gpu's pool and writes it"
else
    say "FAIL own-device: $out"
fi

# A client with a /dev of its own (tmpfs): $1 plants what it wants there, with
# the host's /dev at /tmp/rxdm-dev; then the fetch runs with the rest of the arguments.
planted() {
    local setup=$1
    shift
    unshare -m --propagation private sh -c "mkdir -p /tmp/rxdm-dev && mount --bind /dev /tmp/rxdm-dev &&
        mount -t tmpfs tmpfs /dev && $setup && exec $PY $FETCH $UDS $gpu $*" 2>&1
}
node=/dev/nvidia$minor
# Each must be refused, naming the GPU.
refusals=0
expect_refused() {
    local name=$1 why=$2 got=$3
    refusals=$((refusals + 1))
    if grep -q "status 7: .*$gpu" <<<"$got"; then
        say "PASS $name: $why is refused: $got"
    else
        say "FAIL $name: $why: $got"
    fi
}
expect_refused file-is-no-device "a regular file $node, held open" "$(planted ": > $node" "$node")"
expect_refused mknod-not-held "a node made with mknod $node c 195 $minor, not opened" \
    "$(planted "mknod $node c 195 $minor")"
expect_refused absolute-link "a symlink $node -> $node (the host's node, seen from the daemon), not held" \
    "$(planted "ln -s $node $node")"
expect_refused relative-link "a symlink $node -> rxdm-real, the real node bind-mounted there, not held" \
    "$(planted ": > /dev/rxdm-real && mount --bind /tmp/rxdm-dev/nvidia$minor /dev/rxdm-real && ln -s rxdm-real $node")"
expect_refused held-and-closed "the real node bind-mounted, opened and closed again before asking" \
    "$(planted ": > $node && mount --bind /tmp/rxdm-dev/nvidia$minor $node" "$node" close)"
expect_refused held-read-only "the real node bind-mounted, held open read-only" \
    "$(planted ": > $node && mount --bind /tmp/rxdm-dev/nvidia$minor $node" "$node" ro)"
expect_refused held-by-path "the real node bind-mounted, held by an O_PATH descriptor" \
    "$(planted ": > $node && mount --bind /tmp/rxdm-dev/nvidia$minor $node" "$node" path)"

bound=$(planted ": > $node && mount --bind /tmp/rxdm-dev/nvidia$minor $node" "$node" rw)
if [ "$bound" = fd ]; then
    say "PASS bound-device: the real device node bind-mounted and held open for reading and writing gets the fd"
else
    say "FAIL bound-device: $bound"
fi

refused=$(curl -s http://127.0.0.1:19468/metrics |
    awk '/^tcpx_rxdm_requests_refused_total\{endpoint="gpu_fd",mode="enforce",reason="gpu"\}/ { print $2 }')
if [ "$refused" = "$refusals" ] && grep -q 'reason="gpu"' "$OUT/daemon-tenants.log"; then
    say "PASS counted: requests_refused_total{gpu_fd,gpu,enforce} = $refusals and logged"
else
    say "FAIL counted: '$refused'"
fi

kill -TERM "$DPID"
wait "$DPID"
rc=$?
if [ "$rc" = 0 ]; then say "PASS daemon-exit: exit 0"; else say "FAIL daemon-exit: $rc"; fi
trap - EXIT
PASSES=$(grep -c '^PASS' "$LOG")
FAILS=$(grep -c '^FAIL' "$LOG")
say "== tenant device check: $PASSES passed, $FAILS failed"
[ "$FAILS" = 0 ] && [ "$PASSES" -gt 0 ]
