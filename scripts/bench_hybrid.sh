#!/usr/bin/env bash
# Hybrid-scheduler benchmark (bench/hybrid.md): trains Bibtex with one 1-thread CPU backend, and
# with the hybrid backend over two 1-thread CPU workers, and compares samples/s (training time
# only, medians over the epochs of each run) and final P@1. Each configuration runs REPEATS
# times; the table gives medians.
# Usage: scripts/bench_hybrid.sh [EPOCHS] [REPEATS] [EXTRA HYBRID FLAGS...]
#   defaults: 30 epochs, 3 repeats; data from ../shared/data/bibtex.
set -euo pipefail
cd "$(dirname "$0")/.."
epochs="${1:-30}"
repeats="${2:-3}"
shift $(($# > 2 ? 2 : $#))
data="${HSLIDE_SHARED_DATA:-../shared/data}/bibtex"
[[ -f $data/Bibtex_data.txt ]] || { echo "no Bibtex data in $data" >&2; exit 1; }
./scripts/build.sh --target hslide >/dev/null
out="results/hybrid-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out"
common=(--train "$data/Bibtex_data.txt" --train-split "$data/bibtex_trSplit.txt"
        --test-split "$data/bibtex_tstSplit.txt" --epochs "$epochs" --eval-every "$epochs"
        --no-progress -q --loss softmax)  # the hybrid's loss (--loss auto: logistic on one cpu)
for r in $(seq "$repeats"); do
    ./build/hslide train "${common[@]}" --threads 1 --metrics-out "$out/single-$r.jsonl"
    ./build/hslide train "${common[@]}" --backend hybrid --workers cpu,cpu --worker-threads 1 \
        "$@" --metrics-out "$out/hybrid-$r.jsonl"
done >/dev/null
python3 - "$out" "$epochs" "$repeats" "$*" <<'PY'
import json, pathlib, statistics, sys
out, epochs, repeats, extra = sys.argv[1:]
def runs(kind):
    res = []
    for path in sorted(pathlib.Path(out).glob(f"{kind}-*.jsonl")):
        recs = [json.loads(l) for l in path.open()]
        # Epochs after the first (warm caches); samples/s of training only.
        res.append((statistics.median(r["samples_per_s"] for r in recs[1:] or recs),
                    recs[-1].get("p@1", float("nan")), recs[-1]))
    return res
single, hybrid = runs("single"), runs("hybrid")
s_rate = statistics.median(r[0] for r in single)
h_rate = statistics.median(r[0] for r in hybrid)
s_p1 = statistics.median(r[1] for r in single)
h_p1 = statistics.median(r[1] for r in hybrid)
print(f"single 1-thread backend: {s_rate:.0f} samples/s, P@1 {s_p1:.4f}")
print(f"hybrid 2 x 1-thread:     {h_rate:.0f} samples/s, P@1 {h_p1:.4f}  (extra flags: {extra or 'none'})")
print(f"hybrid / (2 x single):   {h_rate / (2 * s_rate):.2f}")
for w in hybrid[-1][2].get("workers", []):
    print(f"  last run, last epoch: {w['name']}: share {w['update_share']:.2f}, utilisation "
          f"{w['utilisation']:.2f}, batch mean {w['batch_mean']:.0f}, merges {w['merges']}, "
          f"merge {w['merge_seconds']:.3f} s, staleness {w['staleness_mean']:.1f}")
# Thread CPU times (robust to other processes on the cores): per batch, per merge, and the
# bound they put on the ratio, train / (train + merges), medians over workers and epochs 2..
rows = []
for path in sorted(pathlib.Path(out).glob("hybrid-*.jsonl")):
    recs = [json.loads(l) for l in path.open()]
    for r in recs[1:] or recs:
        for w in r.get("workers", []):
            if w.get("batches") and w.get("merges") and "train_cpu_seconds" in w:
                rows.append((w["train_cpu_seconds"] / w["batches"],
                             w["merge_cpu_seconds"] / w["merges"], w["merges"] / w["batches"],
                             (w["merge_wait_seconds"] / w["merges"]),
                             (w["rows_merged"] / w["merges"], w["rows_pulled"] / w["merges"]),
                             w["train_cpu_seconds"] / (w["train_cpu_seconds"] + w["merge_cpu_seconds"])))
if rows:
    med = lambda i: statistics.median(x[i] for x in rows)
    print(f"cpu time: train {1e3 * med(0):.2f} ms/batch, merge {1e3 * med(1):.3f} ms/merge "
          f"({med(2):.2f} merges/batch, lock wait {1e3 * med(3):.3f} ms/merge, rows out/in "
          f"{statistics.median(x[4][0] for x in rows):.0f}/{statistics.median(x[4][1] for x in rows):.0f}); "
          f"train / (train + merge) = {med(5):.3f}")
print(f"raw: {out}")
PY
