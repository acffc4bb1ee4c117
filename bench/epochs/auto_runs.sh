#!/usr/bin/env bash
# hslide train with --epochs auto (the default) on the real sets, one run per (set, seed),
# with the given extra flags: prints set, seed, the final line's P@1/P@3/P@5, the best epoch,
# the epochs run, the epochs' training seconds and the whole command's CPU seconds.
# Usage: auto_runs.sh OUT_DIR TAG "SETS" "SEEDS" [extra flags]
set -euo pipefail
out=$1 tag=$2 sets=$3 seeds=$4
shift 4
extra=("$@")
source "$(dirname "$0")/real_sets.sh"
BIN=${HSLIDE_BIN:-build-cpu/hslide}
mkdir -p "$out"
for set in $sets; do
    real_set_flags "$set"
    for seed in $seeds; do
        name=$set-s$seed-$tag
        rm -f "$out/$name.jsonl"
        /usr/bin/time -f "%U %S" -o "$out/$name.time" "$BIN" train "${data[@]}" --threads 2 \
            --no-progress -q --seed $seed "${extra[@]}" --metrics-out "$out/$name.jsonl" \
            > "$out/$name.log" 2>&1
        python3 - "$out/$name.jsonl" "$out/$name.time" "$set" "$seed" "$tag" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
final = recs[-1]
train_s = sum(r["epoch_seconds"] for r in recs if not r.get("final"))
u, s = map(float, open(sys.argv[2]).read().split()[-2:])
print(f"{sys.argv[5]} {sys.argv[3]} seed {sys.argv[4]}: P@1 {final['p@1']:.4f} P@3 {final['p@3']:.4f} "
      f"P@5 {final['p@5']:.4f} best {final.get('best_epoch', final['epoch'])} "
      f"run {final.get('epochs_run', final['epoch'])} train_s {train_s:.2f} cpu_s {u + s:.2f}")
PY
    done
done
