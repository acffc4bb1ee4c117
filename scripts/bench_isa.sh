#!/usr/bin/env bash
# The CPU fast-path end-to-end benchmark (bench/cpu_isa.md): trains the Amazon-670K-shaped
# synthetic preset (670,091 labels, 135,909 features, the default 135909 -> 256 -> 670091
# network with an LSH output layer) once per ISA level and precision, in one run on the same
# data, and writes samples/s, seconds per epoch, peak memory and P@1 per configuration to
# bench/cpu_isa.csv and bench/cpu_isa.md (raw logs and metrics under results/).
#
# Usage: scripts/bench_isa.sh [SCALE] [EPOCHS] [THREADS] [LEVELS] [PRECISIONS]
#   defaults: 0.05 (24.5k training points), 2 epochs, 2 threads,
#             "scalar avx2 avx512 avx512bf16", "fp32 bf16"
# Levels this CPU lacks are skipped with a note.
set -euo pipefail
cd "$(dirname "$0")/.."
scale="${1:-0.05}"
epochs="${2:-2}"
threads="${3:-2}"
levels="${4:-scalar avx2 avx512 avx512bf16}"
precisions="${5:-fp32 bf16}"
./scripts/build.sh --target hslide >/dev/null
out="results/cpu-isa-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out"
best="$(./build/hslide info | sed -n 's/^cpu kernels: [a-z0-9]* (best on this cpu: \([a-z0-9]*\);.*/\1/p')"
order="scalar avx2 avx512 avx512bf16"
rank() { local i=0; for l in $order; do [[ $l == "$1" ]] && { echo $i; return; }; i=$((i + 1)); done; }

for level in $levels; do
    if (($(rank "$level") > $(rank "$best"))); then
        echo "== skipping $level: this CPU's best level is $best" >&2
        continue
    fi
    for precision in $precisions; do
        name="$level-$precision"
        echo "== $name: scale $scale, $epochs epochs, $threads threads" >&2
        ./build/hslide train --scale "$scale" --epochs "$epochs" --threads "$threads" \
            --isa "$level" --precision "$precision" --eval-every "$epochs" --no-progress \
            --metrics-out "$out/$name.jsonl" >"$out/$name.log" 2>&1
        tail -n 1 "$out/$name.log" >&2
    done
done

python3 - "$out" "$scale" "$epochs" "$threads" "$(./build/hslide info | head -n 1)" <<'PY'
import json, pathlib, statistics, sys
out, scale, epochs, threads, cpu = sys.argv[1:]
rows = []
for path in sorted(pathlib.Path(out).glob("*.jsonl")):
    level, precision = path.stem.rsplit("-", 1)
    records = [json.loads(line) for line in path.open()]
    epoch_s = [r["epoch_seconds"] for r in records]
    rows.append(dict(isa=level, precision=precision,
                     epoch_seconds=statistics.median(epoch_s),
                     samples_per_s=statistics.median(r["samples_per_s"] for r in records),
                     peak_rss_gib=max(r["peak_rss_bytes"] for r in records) / 2**30,
                     p_at_1=records[-1].get("p@1", float("nan"))))
order = ["scalar", "avx2", "avx512", "avx512bf16"]
rows.sort(key=lambda r: (r["precision"] != "fp32", order.index(r["isa"])))
base = next((r for r in rows if r["isa"] == "scalar" and r["precision"] == "fp32"), None)
with open("bench/cpu_isa.csv", "w") as f:
    f.write("isa,precision,threads,epoch_seconds,samples_per_s,speedup_vs_scalar_fp32,"
            "peak_rss_gib,p_at_1\n")
    for r in rows:
        speedup = base["epoch_seconds"] / r["epoch_seconds"] if base else float("nan")
        r["speedup"] = speedup
        f.write(f"{r['isa']},{r['precision']},{threads},{r['epoch_seconds']:.1f},"
                f"{r['samples_per_s']:.1f},{speedup:.2f},{r['peak_rss_gib']:.2f},"
                f"{r['p_at_1']:.4f}\n")
with open("bench/cpu_isa.md", "w") as f:
    f.write("# CPU fast path: every ISA level and precision on the Amazon-670K shape\n\n")
    f.write(f"Written by `scripts/bench_isa.sh {scale} {epochs} {threads}` "
            f"(raw logs in `{out}`, not committed).\n"
            f"Machine: {cpu.split(':', 1)[-1].strip()}, {threads} threads. "
            f"Synthetic amazon670k preset at --scale {scale}, {epochs} epochs, default "
            "network and LSH settings; seconds per epoch and samples/s are medians over the "
            "epochs (training only, evaluation excluded); P@1 is after the last epoch, "
            "LSH scoring.\n\n")
    f.write("| ISA | precision | s/epoch | samples/s | speedup vs scalar fp32 | peak RSS (GiB) | P@1 |\n")
    f.write("|---|---|---:|---:|---:|---:|---:|\n")
    for r in rows:
        f.write(f"| {r['isa']} | {r['precision']} | {r['epoch_seconds']:.1f} | "
                f"{r['samples_per_s']:.0f} | {r['speedup']:.2f}x | {r['peak_rss_gib']:.2f} | "
                f"{r['p_at_1']:.4f} |\n")
print(open("bench/cpu_isa.md").read())
PY
