#!/usr/bin/env bash
# Pool setup time per GPU, ours (examples/pool_bench.rs through CudaAllocator)
# vs the same bare driver calls from Python (rxdm_gpu.py bench), in one run;
# two rounds in opposite order so neither side always runs on a warmer GPU.
# Env: SIZES (default 64M,1G,4G), ITERS (default 5), POOL_BENCH, OUT.
set -u
. "$(dirname "$0")/lib.sh"
SIZES=${SIZES:-64M,1G,4G}
ITERS=${ITERS:-5}
ensure_cuda_bindings || exit 1
: >"$OUT/bench_rust.jsonl"
: >"$OUT/bench_python.jsonl"
"$POOL_BENCH" --sizes "$SIZES" --iters "$ITERS" >>"$OUT/bench_rust.jsonl" || echo "FAIL pool_bench (rust) round 1"
"$PY" "$GPU_DIR/rxdm_gpu.py" bench "$SIZES" "$ITERS" >>"$OUT/bench_python.jsonl"
"$PY" "$GPU_DIR/rxdm_gpu.py" bench "$SIZES" "$ITERS" >>"$OUT/bench_python.jsonl"
"$POOL_BENCH" --sizes "$SIZES" --iters "$ITERS" >>"$OUT/bench_rust.jsonl" || echo "FAIL pool_bench (rust) round 2"
cat "$OUT/bench_rust.jsonl" "$OUT/bench_python.jsonl"
"$PY" "$GPU_DIR/rxdm_gpu.py" compare "$OUT/bench_rust.jsonl" "$OUT/bench_python.jsonl"
