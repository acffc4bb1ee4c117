#!/usr/bin/env bash
# The Amazon-670K-shaped CPU benchmark of bench/training.md:
#  1. trains the default network (135909 -> 256 -> 670091, LSH output layer) on the
#     amazon670k synthetic preset at its full label and feature counts with ~50,000 training
#     points (--scale 0.102), and reports time per epoch, P@k and peak memory from the
#     metrics records;
#  2. runs bench_train_step, which times training steps of the same network with the LSH
#     output layer and with a dense output layer in one run, for the per-epoch ratio.
# Usage: scripts/bench_amazon.sh [THREADS] [EPOCHS]   (defaults: 2 threads, 2 epochs)
# Results go to results/amazon670k-<date>/ (ignored by git).
set -euo pipefail
cd "$(dirname "$0")/.."
threads="${1:-2}"
epochs="${2:-2}"
./scripts/build.sh --target hslide bench_train_step >/dev/null
out="results/amazon670k-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out"

echo "== training: amazon670k, 50k points, $threads threads, $epochs epochs" >&2
./build/hslide train --scale 0.102 --epochs "$epochs" --threads "$threads" --no-progress \
    --metrics-out "$out/train.jsonl" 2>&1 | tee "$out/train.log"
python3 - "$out/train.jsonl" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(f"epoch {r['epoch']}: {r['epoch_seconds']:.1f} s, {r['samples_per_s']:.0f} samples/s, "
          f"P@1 {r.get('p@1', float('nan')):.4f}, peak RSS {r['peak_rss_bytes'] / 2**30:.2f} GiB")
EOF

echo "== training steps: LSH output vs dense output (one run)" >&2
HSLIDE_BENCH_THREADS="$threads" ./build/bench_train_step --benchmark_repetitions=1 \
    --benchmark_out="$out/train_step.json" --benchmark_out_format=json | tee "$out/train_step.txt"
echo "results in $out" >&2
