#!/usr/bin/env bash
# One hslide run per (set, seed, hold-out fraction) with a test evaluation after every epoch
# and, with a hold-out, its validation P@1: analyse.py replays --epochs auto's stopping rules
# (patience, cap) on these records offline (with keep-best, the trajectory does not depend on
# when the run would stop). Usage: sweep.sh OUT_DIR SETS SEEDS FRACTIONS EPOCHS [extra flags]
#   e.g. sweep.sh /tmp/ep "bibtex corel5k" "1 2 3" "0 0.05 0.1" 25
set -euo pipefail
out=$1 sets=$2 seeds=$3 fractions=$4 epochs=$5
shift 5
extra=("$@")
source "$(dirname "$0")/real_sets.sh"
BIN=${HSLIDE_BIN:-build-cpu/hslide}
mkdir -p "$out"
for set in $sets; do
    real_set_flags "$set"
    for seed in $seeds; do
        for f in $fractions; do
            tag=$set-s$seed-f$f${TAG:+-$TAG}
            valid=()
            [ "$f" != 0 ] && valid=(--valid-fraction $f --keep-best p@1)
            rm -f "$out/$tag.jsonl"
            /usr/bin/time -f "%U %S" -o "$out/$tag.time" "$BIN" train "${data[@]}" --threads 2 \
                --no-progress -q --seed $seed --epochs $epochs "${valid[@]}" "${extra[@]}" \
                --metrics-out "$out/$tag.jsonl" > "$out/$tag.log" 2>&1
            echo "$tag $(cat "$out/$tag.time")"
        done
    done
done
