# Shared by check.sh, bench.sh, tenants.sh and takeover.sh (sourced). Finds the
# binaries and a python3 with cuda-bindings; installs carried wheels
# (RXDM_WHEELS) if it lacks them; reads what the daemon logs.

GPU_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$GPU_DIR/../.." && pwd)
PY=${PYTHON:-python3}
RXDM_BIN=${RXDM_BIN:-$REPO/target/release/tcpx-rxdm}
POOL_BENCH=${POOL_BENCH:-$REPO/target/release/examples/pool_bench}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

ensure_cuda_bindings() {
    if "$PY" -c 'from cuda.bindings import driver' 2>/dev/null; then
        return 0
    fi
    if [ -n "${RXDM_WHEELS:-}" ] && ls "$RXDM_WHEELS"/*.whl >/dev/null 2>&1; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/rxdm-site "$RXDM_WHEELS"/*.whl &&
            export PYTHONPATH=/tmp/rxdm-site${PYTHONPATH:+:$PYTHONPATH}
    fi
    "$PY" -c 'from cuda.bindings import driver' || { echo "FAIL setup: python3 has no cuda.bindings"; return 1; }
}

# The device minor the daemon took for each GPU, one a line, in topology order,
# from its "tenant isolation" log line in file $1 (field `gpu_minors=0, 1, 2`;
# tests/gpu_scripts.rs checks this against the sim daemon's own line).
daemon_gpu_minors() {
    grep -m1 'tenant isolation' "$1" |
        sed -n 's/.* gpu_minors=\([0-9][0-9]*\(, [0-9][0-9]*\)*\)\( .*\)\{0,1\}$/\1/p' |
        tr -d ' ' | tr ',' '\n'
}
