#!/usr/bin/env bash
# napkinXC's defaults and hslide's defaults on the real sets, alternated: per set ROUNDS rounds of
# napkinXC then hslide, 2 threads each (bench/peers.md's quiet tables). Prints one line a run:
# napkinXC's P@1 and train seconds; hslide's P@1, its command's wall time (GNU time) less its
# final test evaluation, the seconds to the reported epoch (the epochs' and their hold-out
# scoring's, up to the kept one) and the epochs (best, run, undone).
# Usage: NXC=/path/to/nxc bench/peers_alternated.sh OUT_DIR ["SETS"] [ROUNDS]
#   SETS from bench/epochs/real_sets.sh (default "debian bibtex corel5k yeast"), ROUNDS 3.
#   HSLIDE_BIN (build/hslide), HSLIDE_DATA (../shared/data).
set -euo pipefail
out=$1 sets=${2:-"debian bibtex corel5k yeast"} rounds=${3:-3}
: "${NXC:?set NXC to the nxc binary built from napkinXC 0.7.2 (scripts/baselines/napkinxc.sh)}"
BIN=${HSLIDE_BIN:-build/hslide}
source "$(dirname "$0")/epochs/real_sets.sh"
mkdir -p "$out"
for set in $sets; do
    real_set_flags "$set"
    for round in $(seq "$rounds"); do
        run=$out/$set.$round
        scripts/baselines/napkinxc.sh --nxc "$NXC" "${data[@]}" --threads 2 --no-header \
            > "$run.nxc.csv" 2> "$run.nxc.err"
        rm -f "$run.jsonl"
        /usr/bin/time -f "%e" -o "$run.wall" "$BIN" train "${data[@]}" --threads 2 --no-progress \
            -q --metrics-out "$run.jsonl" > "$run.log" 2>&1
        python3 - "$set" "$round" "$run" <<'PY'
import json, sys
name, round_, run = sys.argv[1:]
records = [json.loads(line) for line in open(run + ".jsonl")]
final = records[-1]
wall = float(open(run + ".wall").read().split()[-1])
# The kept epoch's record is the last of that number (epochs undone at a drop are numbered again).
kept = max(i for i, r in enumerate(records[:-1]) if r["epoch"] == final["epoch"])
to_kept = sum(r["epoch_seconds"] + r.get("valid", {}).get("seconds", 0) for r in records[:kept + 1])
nxc = open(run + ".nxc.csv").read().strip().split(",")  # results.csv: train_seconds 5, p@1 10
print(f"{name} round {round_}: napkinXC P@1 {float(nxc[10]):.4f} train {float(nxc[5]):.2f} s | "
      f"hslide P@1 {final['p@1']:.4f} less test {wall - final['eval_seconds']:.2f} s "
      f"to kept {to_kept:.2f} s best {final['epoch']} run {final['epochs_run']} "
      f"undone {final.get('epochs_undone', 0)}")
PY
    done
done
