#!/usr/bin/env bash
# The GPU check every session with a GPU machine runs: build here, test and measure there.
#
#   scripts/gpu_check.sh pack               # here: build with CUDA into build-gpu/ and pack
#                                           # the binaries, the shared libraries they need and
#                                           # the Bibtex data into gpu-pack/hslide-gpu.tar.gz
#                                           # (git-ignored; about 18 MB, the device tool
#                                           # carries at most 64 MiB)
#   scripts/gpu_check.sh all [EPOCHS] [BUDGET]
#                                           # on the GPU machine: THE check (issue 22), in
#                                           # BUDGET seconds (460): the GPU tests; Amazon-670K-
#                                           # shaped at full size, EPOCHS (3) each: gpu topk,
#                                           # topk with the fused scoring pass
#                                           # (HSLIDE_GPU_TOPK_FUSED=1), gpu-dense, gpu LSH,
#                                           # topk without the fill pool (--fill-pool 0),
#                                           # topk with --fill-correction 1, the hybrid (gpu
#                                           # topk, cpu LSH); Amazon-3M at 0.02 and
#                                           # WikiLSHTC-325K at 0.25 (2 epochs: topk, topk
#                                           # corrected, dense, LSH); memcheck and racecheck;
#                                           # an Nsight Compute table of LSH, top-k (cuBLAS
#                                           # and fused) and dense steps; PyTorch bf16, then
#                                           # fp32, as time is left. Each part runs only while
#                                           # its estimate fits; one summary.md.
#   scripts/gpu_check.sh tests              # on the GPU machine: the GPU tests, then
#                                           # compute-sanitizer memcheck and racecheck on the
#                                           # LSH and top-k kernels' tests (where it exists)
#   scripts/gpu_check.sh bench [SCALE] [EPOCHS] [PRESETS]
#                                           # on the GPU machine: the presets (comma separated;
#                                           # default amazon670k,wikilshtc325k,amazon3m) at full
#                                           # label and feature counts, SCALE x the points
#                                           # (default 0.1), EPOCHS each (default 2), with the
#                                           # preset's network (scripts/presets.sh): gpu fp32
#                                           # and bf16 (the preset's top-k output layer), gpu
#                                           # LSH bf16, gpu-dense bf16 and cpu (all cores),
#                                           # PyTorch on the GPU in fp32 and bf16 autocast on
#                                           # amazon670k (where python3 has torch with CUDA),
#                                           # the preset's batch; on amazon670k also gpu bf16
#                                           # at batch 1024, gpu LSH with --gpu-async-rebuild,
#                                           # and hybrid cpu+gpu (adaptive; hogbatch); gpu,
#                                           # gpu LSH and gpu-dense bf16 only on amazon3m
#                                           # (2,000 test points scored).
#                                           # A PRESETS entry NAME@S takes scale S instead.
#   scripts/gpu_check.sh topk [EPOCHS]      # on the GPU machine: issue 19's checks, EPOCHS (3)
#                                           # each: gpu topk bf16 (without and with
#                                           # --fill-correction 1), gpu-dense bf16 and gpu (LSH)
#                                           # bf16 on amazon670k at full size, wikilshtc325k at
#                                           # scale 0.25 and amazon3m at scale 0.02 (2,000 test
#                                           # points scored there), and on amazon670k a hybrid
#                                           # of a top-k GPU worker and an LSH CPU worker;
#                                           # bench's summary
#   scripts/gpu_check.sh peers              # on the GPU machine: the hardware comparison a
#                                           # user would make (issue 30): napkinXC's default
#                                           # label trees on all the host's cores beside hslide
#                                           # --backend gpu with its defaults, on Debian-recs,
#                                           # Bibtex and Corel5k; P@1, train seconds and
#                                           # hslide's time to napkinXC's P@1 (the pack carries
#                                           # napkinXC when packed with NAPKINXC=/path/to/nxc;
#                                           # `all` ends with it)
#   scripts/gpu_check.sh reproduce [SCALE] [EPOCHS] [PRESET] [REPRODUCE OPTIONS...]
#                                           # on the GPU machine: scripts/reproduce.sh with its
#                                           # default configurations (every CPU one, the GPU,
#                                           # hybrid and dense GPU ones, PyTorch on CPU and GPU)
#                                           # on PRESET (amazon670k) at SCALE (0.01), EPOCHS (2);
#                                           # further options go to reproduce.sh (--configs,
#                                           # --eval-max, --target-p1, ...)
#
# With the device tool: run `scripts/gpu_check.sh pack` here, then (one call, about 7 minutes)
#   run(command="scripts/gpu_check.sh all", carry=["gpu-pack"], timeout_s=540)
# or one call per step, each well inside the tool's 10 minutes a call:
#   run(command="scripts/gpu_check.sh tests", carry=["gpu-pack"])
#   run(command="scripts/gpu_check.sh topk 3", carry=["gpu-pack"])
#   run(command="scripts/gpu_check.sh bench 0.1 2 amazon670k", carry=["gpu-pack"])
#   run(command="scripts/gpu_check.sh bench 0.1 2 wikilshtc325k,amazon3m", carry=["gpu-pack"])
#   run(command="scripts/gpu_check.sh reproduce 0.01 2", carry=["gpu-pack"])
#   run(command="scripts/gpu_check.sh reproduce 0.01 2 amazon3m --configs 'gpu:bf16 gpu-dense:bf16' --eval-max 2000", carry=["gpu-pack"])
#     (time to a P@1 of the LSH path against the dense bf16 output layer, issue 4's check)
# Each step works in results/gpu-<step>/ and puts at most 8 files in $OUT (the tool returns no
# more): its summary or report, machine.txt, and its logs as one .tar.gz, refreshed after each
# run so that a step cut off at its limit still returns what it finished. Without $OUT the
# files stay in the work folder.
# The GPU machine has no Debian packages: the pack carries libfmt, libspdlog, libxxhash,
# libgomp, libopenblas and libstdc++ beside the binaries; the CUDA runtime is linked statically
# and cuBLAS (gpu-dense only) is loaded from the machine's CUDA or PyTorch (set HSLIDE_CUBLAS).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/presets.sh

pack_file=gpu-pack/hslide-gpu.tar.gz
# The GPU test binaries (tests/test_gpu_*.cpp and the device hash's host-device test).
gpu_tests="test_device_hash test_gpu_fill test_gpu_kernels test_gpu_topk test_gpu_backend test_gpu_catch_up test_gpu_hybrid"
mode=${1:-}

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d' >&2
    exit 2
}

case "$mode" in
pack)
    ./scripts/setup.sh
    cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DHSLIDE_CUDA=ON \
        -DHSLIDE_BUILD_BENCH=OFF >/dev/null
    cmake --build build-gpu -j "$(nproc)" --target hslide $gpu_tests
    stage=build-gpu/pack
    rm -rf "$stage" gpu-pack
    mkdir -p "$stage/bin" "$stage/lib" "$stage/data" gpu-pack
    cp build-gpu/hslide $(printf 'build-gpu/%s ' $gpu_tests) "$stage/bin/"
    for lib in $(ldd "$stage"/bin/* | awk '/=>/ {print $3}' | sort -u); do
        case "$(basename "$lib")" in
        libc.so* | libm.so* | ld-linux* | libdl.so* | libpthread.so* | librt.so*) ;;
        *) cp -L "$lib" "$stage/lib/" ;;
        esac
    done
    shared=${HSLIDE_SHARED_DATA:-../shared/data}
    for set in bibtex debian-recs corel5k; do
        if [[ -d $shared/$set ]]; then cp -r "$shared/$set" "$stage/data/"; fi
    done
    # The peer (the `peers` step): napkinXC's CLI as built outside the repository, and GNU time
    # for its peak memory (the GPU machine has no Debian packages).
    if [[ -n ${NAPKINXC:-} ]]; then
        "$NAPKINXC" version | grep -q '^napkinXC ' ||
            { echo "gpu_check.sh: $NAPKINXC is not napkinXC's nxc" >&2; exit 2; }
        cp "$NAPKINXC" "$stage/bin/nxc"
        cp /usr/bin/time "$stage/bin/time"
    fi
    # Compressed: the libraries (OpenBLAS alone is 35 MB) shrink to a third, and the tool
    # carries at most 64 MiB with the working tree.
    tar -C "$stage" -czf "$pack_file" .
    du -h "$pack_file"
    ;;
tests | bench | topk | all | peers | reproduce)
    [[ -f $pack_file ]] || { echo "gpu_check.sh: no $pack_file: run '$0 pack' first and carry gpu-pack" >&2; exit 1; }
    # Unpacked once per machine (again when the pack is newer).
    root=gpu-pack/unpacked
    if [[ ! -f $root/.done || $pack_file -nt $root/.done ]]; then
        rm -rf "$root"
        mkdir -p "$root"
        tar -C "$root" -xzf "$pack_file"
        touch "$root/.done"
    fi
    root="$PWD/$root"
    work="$PWD/results/gpu-$mode"
    out=${OUT:-$work}
    mkdir -p "$work" "$out"
    export LD_LIBRARY_PATH="$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export HSLIDE_SHARED_DATA="$root/data"
    export HSLIDE_BINARY="$root/bin/hslide"  # the tests' CLI runs use the packed binary
    # Where PyTorch brings its own cuBLAS, gpu-dense can use it.
    if [[ -z ${HSLIDE_CUBLAS:-} ]]; then
        # The newest libcublas.so.N under the nvidia wheels' folders (cu12: nvidia/cublas/lib,
        # cu13 wheels may differ).
        torch_cublas=$(python3 -c '
import glob, os, re, nvidia
found = [p for d in nvidia.__path__ for p in glob.glob(os.path.join(d, "**", "libcublas.so.*"), recursive=True)
         if re.search(r"libcublas\.so\.[0-9]+$", p)]
print(max(found, key=lambda p: int(p.rsplit(".", 1)[1])) if found else "")' 2>/dev/null || true)
        if [[ -n $torch_cublas && -f $torch_cublas ]]; then export HSLIDE_CUBLAS=$torch_cublas; fi
    fi
    { nvidia-smi || true; "$root/bin/hslide" info; } >"$out/machine.txt" 2>&1
    cat "$out/machine.txt"
    ;;
*) usage ;;
esac

# The logs of a step (everything in its work folder but generated data) as one file in $OUT.
ship_logs() {
    tar -C "$work" --exclude='./data-*' --exclude='./data' --exclude='*.hscache' \
        -czf "$out/$mode-logs.tar.gz.part" . && mv "$out/$mode-logs.tar.gz.part" "$out/$mode-logs.tar.gz"
}

# Whether python3 has PyTorch with a CUDA device (the PyTorch baseline's rows).
have_torch_cuda() {
    python3 -c 'import torch, numpy, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null
}

# The summary table's head.
summary_head() {
    echo "Per epoch: training seconds (median over epochs), P@1 after each evaluated epoch, and"
    echo "the stage seconds of the last epoch (hashing, active sets, forward, backward, update,"
    echo "table rebuilds, host-device transfer). $1"
    echo
    echo "dropped: top-k rows, the mean softmax mass outside the sets in the last epoch (issue 19)."
    echo "rows: the share of the output rows a step's update touched in the last epoch."
    echo
    echo "| preset | backend | precision | s/epoch | P@1 | hash | sets | fwd | bwd | update | rebuild | transfer | dropped | rows |"
    echo "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
}

# prepare_preset NAME[@SCALE]: sets preset, preset_scale, data and network, generating the data
# (in $work, once) if needed.
prepare_preset() {
    preset=${1%@*}
    preset_scale=$scale
    [[ $1 == *@* ]] && preset_scale=${1##*@}
    data="$work/data-$preset-s$preset_scale"
    # The papers' network and LSH settings, as reproduce.sh trains them.
    preset_settings "$preset" || { echo "gpu_check.sh: unknown preset $preset" >&2; exit 2; }
    [[ -f $data/test.txt ]] ||
        "$root/bin/hslide" gen --preset "$preset" --scale "$preset_scale" --out "$data" -q
    network=(--hidden "$p_hidden" --K "$p_K" --L "$p_L" --bits "$p_bits"
             --bucket-capacity "$p_capacity" --min-active "$p_min_active")
}

# run_config "BACKEND PRECISION [BATCH [VARIANT]]": trains the prepared preset for $epochs and
# appends its row (and a hybrid's worker rows) to $summary.
run_config() {
    local backend precision batch variant name label extra run_env=() started=$SECONDS
    read -r backend precision batch variant <<<"$1"
    batch=${batch:-$p_batch}
    name="$preset-s$preset_scale-$backend-$precision-b$batch${variant:+-$variant}"
    label=$backend
    [[ $batch == "$p_batch" ]] || label="$backend (batch $batch)"
    # No variant: the preset's output layer (top-k, with the --fill-pool default).
    extra=(--output-sparsity "$p_sparsity")
    [[ $variant == topk ]] && { extra=(--output-sparsity topk); label="$label topk"; }
    # topk-nopool: the fill drawn from the whole layer, as before --fill-pool (the 2026-11-26
    # H200 figures).
    [[ $variant == topk-nopool ]] &&
        { extra=(--output-sparsity topk --fill-pool 0); label="$label topk (no fill pool)"; }
    [[ $variant == lsh ]] && { extra=(--output-sparsity lsh); label="$label lsh"; }
    # topk-fused: the fused scoring pass (gpu_topk.cuh), its variable set for this run only.
    [[ $variant == topk-fused ]] && {
        extra=(--output-sparsity topk)
        run_env=(HSLIDE_GPU_TOPK_FUSED=1)
        label="$label topk (fused scoring)"
    }
    [[ $variant == topk-fc ]] &&
        { extra=(--output-sparsity topk --fill-correction 1); label="$label topk (fill correction 1)"; }
    [[ $variant == async ]] &&
        { extra=(--output-sparsity lsh --gpu-async-rebuild); label="$label lsh (async rebuild)"; }
    if [[ $backend == hybrid && $variant == topk-gpu ]]; then
        extra+=(--workers gpu,cpu --schedule adaptive --worker-output-sparsity topk,lsh)
        label="$label (gpu topk, cpu lsh)"
    elif [[ $backend == hybrid && $variant == hog ]]; then
        extra+=(--workers cpu,gpu --schedule hogbatch --worker-batch "$((batch / 4)),$batch")
        label="$label (hogbatch $((batch / 4)),$batch)"
    elif [[ $backend == hybrid ]]; then
        extra+=(--workers cpu,gpu --schedule adaptive)
    fi
    [[ $preset == amazon3m ]] && extra+=(--eval-max 2000)
    [[ $mode == bench ]] || extra+=(--eval-every 1)  # P@1 after each epoch
    local failed="| $preset@$preset_scale | $label | $precision | failed: see $name.log in $mode-logs.tar.gz |"
    if [[ $backend == torch ]]; then
        rm -f "$work/$name.jsonl"  # torch_dense.py appends
        python3 scripts/baselines/torch_dense.py --train "$data/train.txt" \
            --test "$data/test.txt" --device cuda --hidden "$p_hidden" --epochs "$epochs" \
            --batch-size "$batch" --precision "$precision" --metrics-out "$work/$name.jsonl" \
            >"$work/$name.log" 2>&1 || echo "$failed" >>"$summary"
    else
        env ${run_env[@]+"${run_env[@]}"} "$root/bin/hslide" train --train "$data/train.txt" \
            --test "$data/test.txt" --backend "$backend" --precision "$precision" --epochs "$epochs" "${network[@]}" \
            --batch-size "$batch" --no-progress --metrics-out "$work/$name.jsonl" "${extra[@]}" \
            >"$work/$name.log" 2>&1 || echo "$failed" >>"$summary"
    fi
    echo "$name: $((SECONDS - started)) s"
    if [[ -s $work/$name.jsonl ]]; then
        python3 - "$work/$name.jsonl" "$preset@$preset_scale" "$label" "$precision" >>"$summary" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
last = rows[-1]
st = last.get("stage_seconds", {})
stages = " | ".join(f"{st.get(k, 0):.2f}" for k in
                    ("hashing", "active_sets", "forward", "backward", "update", "rebuild",
                     "transfer"))
p1 = ", ".join(f"{r['p@1']:.4f}" for r in rows if "p@1" in r) or "nan"
dropped = f"{last['dropped_mass']:.4f}" if "dropped_mass" in last else ""
touched = f"{100 * last['touched_share']:.0f}%" if "touched_share" in last else ""
print(f"| {sys.argv[2]} | {sys.argv[3]} | {sys.argv[4]} | "
      f"{statistics.median(r['epoch_seconds'] for r in rows):.2f} | "
      f"{p1} | {stages} | {dropped} | {touched} |")
# Hybrid: each worker's share of samples and updates, utilisation and parked time, per epoch.
for r in rows:
    for w in r.get("workers", []):
        wall = w["wall_seconds"] or 1
        print(f"|  | epoch {r['epoch']}: {w['name']} | | "
              f"{w['samples']} samples, {100 * w['update_share']:.0f}% of updates | "
              f"busy {100 * w['utilisation']:.0f}% | "
              f"parked {100 * w['parked_seconds'] / wall:.0f}% | | | | | | | | |")
EOF
    fi
    # What is done so far comes back even if the call is cut off at its limit.
    [[ $out == "$work" ]] || { cp "$summary" "$out/"; ship_logs; }
}

# run_tests: the GPU tests. Here a skipped GPU test is a broken setup (no device seen, no
# cuBLAS), so it fails instead. Returns non-zero if any failed.
run_tests() {
    local t status=0
    for t in $gpu_tests; do
        HSLIDE_EXPECT_GPU=1 "$root/bin/$t" --gtest_output="xml:$work/$t.xml" >"$work/$t.log" 2>&1 ||
            status=1
        grep -E '^\[  (PASSED|FAILED)  \]|tests ran' "$work/$t.log" | sed "s/^/$t: /"
    done
    return $status
}

# run_sanitizers SECONDS: compute-sanitizer memcheck and racecheck, each at most SECONDS, on the
# kernels with shared-memory hash sets, warp shuffles, block-wide picks and the row updates,
# where the machine's CUDA has it. Returns non-zero on a finding.
run_sanitizers() {
    local sanitizer tool rc status=0
    sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1 || true)
    if [[ -z $sanitizer ]]; then
        echo "no compute-sanitizer on this machine: kernels not sanitized"
        return 0
    fi
    for tool in memcheck racecheck; do
        rc=0
        # racecheck is slow: the kernels' own tests only, the heavy top-k ones left to memcheck.
        filter='GpuLsh.*:GpuTopK.*:GpuLayers.*:GpuDenseSoftmax.*:GpuBackend.InputCatchUp*-GpuTopK.FusedScoringPassAtScale*'
        [[ $tool == racecheck ]] &&
            filter='GpuLayers.*:GpuDenseSoftmax.*:GpuTopK.Fill*:GpuTopK.Sets*:GpuTopK.ChunkedSelectionIsExact*:GpuLsh.*:GpuTopK.FusedScoringPassMatches*'
        # The kernels' tests are in three binaries; the filter picks in each (none: no test).
        timeout "$1" bash -c 'for t in test_gpu_kernels test_gpu_topk test_gpu_backend; do
                "$0" --tool "$1" --error-exitcode 3 "$2/bin/$t" --gtest_filter="$3" || exit $?
            done' "$sanitizer" "$tool" "$root" "$filter" \
            >"$work/sanitizer-$tool.log" 2>&1 || rc=$?
        if ((rc == 124)); then
            echo "compute-sanitizer $tool: out of time after $1 s (not a finding; see sanitizer-$tool.log)"
        elif ((rc != 0)); then
            status=1
            echo "compute-sanitizer $tool: exit $rc, see sanitizer-$tool.log"
        fi
        grep -E 'ERROR SUMMARY|tests ran' "$work/sanitizer-$tool.log" | sed "s/^/$tool: /"
    done
    return $status
}

# profile_step LABEL LAUNCHES TRAIN-OPTIONS...: Nsight Compute on LAUNCHES kernel launches of
# training on the prepared preset (past the table builds and the first steps), then a table per
# kernel of its launches, time, DRAM bytes and bandwidth per step, appended to $summary. A step
# begins with first_layer_forward_kernel, which every GPU step launches once; only whole steps
# count.
profile_step() {
    local label=$1 count=$2 ncu run_env=()
    shift 2
    # Leading NAME=VALUE arguments: the environment of this profile only.
    while [[ ${1:-} == [A-Z]*=* ]]; do run_env+=("$1"); shift; done
    ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || true)
    [[ -n $ncu ]] || { echo "no ncu on this machine: no step profile"; return 0; }
    timeout 90 env ${run_env[@]+"${run_env[@]}"} "$ncu" --csv --launch-skip 300 --launch-count "$count" --clock-control none \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
        "$root/bin/hslide" train --train "$data/train.txt" --test "$data/test.txt" \
        --epochs 2 --eval-every 0 --no-progress "${network[@]}" --batch-size "$p_batch" "$@" \
        >"$work/ncu-$label.csv" 2>"$work/ncu-$label.log" || echo "ncu $label: exit $? (see ncu-$label.log)"
    python3 - "$work/ncu-$label.csv" "$label" "$preset_scale" >>"$summary" <<'EOF'
import collections, csv, re, sys
rows = [l for l in open(sys.argv[1]) if l.startswith('"')]
launches = collections.defaultdict(dict)
for r in csv.DictReader(rows):
    name = re.sub(r"^void |<unnamed>::|\(anonymous namespace\)::|hslide::", "", r["Kernel Name"])
    name = name.split("(")[0].split("<")[0]
    launches[(int(r["ID"]), name)][r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
# Whole steps only: from the first step's first kernel to the last step's start.
marks = sorted(i for i, name in launches if name == "first_layer_forward_kernel")
steps = max(len(marks) - 1, 1)
if len(marks) > 1:
    launches = {k: v for k, v in launches.items() if marks[0] <= k[0] < marks[-1]}
per = collections.defaultdict(lambda: [0, 0.0, 0.0])
for (_, name), m in launches.items():
    per[name][0] += 1
    per[name][1] += m.get("gpu__time_duration.sum", 0) * 1e-9
    per[name][2] += m.get("dram__bytes_read.sum", 0) + m.get("dram__bytes_write.sum", 0)
total = sum(v[1] for v in per.values()) or 1
print(f"\nNsight Compute, Amazon-670K-shaped at scale {sys.argv[3]}, {sys.argv[2]}: "
      f"{len(launches)} launches over {steps} steps; kernel time {1e3 * total / steps:.3f} ms a step\n")
print("| kernel | launches/step | share | us/step | MB/step | TB/s |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for name, (n, t, b) in sorted(per.items(), key=lambda kv: -kv[1][1]):
    print(f"| {name} | {n / steps:.1f} | {100 * t / total:.1f}% | {1e6 * t / steps:.1f} | "
          f"{b / steps / 1e6:.1f} | {b / t / 1e12 if t else 0:.2f} |")
EOF
    [[ $out == "$work" ]] || { cp "$summary" "$out/"; ship_logs; }
}


# run_peers: napkinXC (default settings, all cores) and hslide on the GPU (its defaults) on the
# real sets in the pack, appended to $summary as one table.
run_peers() {
    local threads set args=() started
    threads=$(nproc)
    printf '\n## Beside napkinXC (issue 30: the GPU row)\n\n' >>"$summary"
    if [[ ! -x $root/bin/nxc ]]; then
        echo "no napkinXC in the pack: run 'NAPKINXC=/path/to/nxc $0 pack'" >>"$summary"
        return 0
    fi
    {
        echo "napkinXC 0.7.2's defaults with -t $threads; hslide --backend gpu with its defaults and"
        echo "a test evaluation after every epoch (to napkinXC's P@1: hslide's epochs' training"
        echo "seconds until the first epoch at or above it)."
        echo
        echo "| data | napkinXC P@1 | napkinXC train s | hslide P@1 | hslide train s | hslide s to napkinXC's P@1 | speedup |"
        echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
    } >>"$summary"
    for set in debian-recs bibtex corel5k; do
        case $set in
        debian-recs) args=(--train "$root/data/$set/train.txt" --test "$root/data/$set/test.txt") ;;
        bibtex) args=(--train "$root/data/$set/Bibtex_data.txt"
            --train-split "$root/data/$set/bibtex_trSplit.txt"
            --test-split "$root/data/$set/bibtex_tstSplit.txt") ;;
        corel5k) args=(--train "$root/data/$set/corel5k_train.txt"
            --test "$root/data/$set/corel5k_test.txt") ;;
        esac
        [[ -f ${args[1]} ]] || continue
        started=$SECONDS
        rm -f "$work/peers-$set-nxc.jsonl" "$work/peers-$set-hslide.jsonl"
        TIME_BIN="$root/bin/time" scripts/baselines/napkinxc.sh --nxc "$root/bin/nxc" \
            --threads "$threads" "${args[@]}" --metrics-out "$work/peers-$set-nxc.jsonl" \
            >"$work/peers-$set-nxc.csv" 2>"$work/peers-$set-nxc.log" ||
            echo "| $set | napkinXC failed: see peers-$set-nxc.log |" >>"$summary"
        "$root/bin/hslide" train "${args[@]}" --backend gpu --eval-every 1 --no-progress \
            --metrics-out "$work/peers-$set-hslide.jsonl" >"$work/peers-$set-hslide.log" 2>&1 ||
            echo "| $set | hslide failed: see peers-$set-hslide.log |" >>"$summary"
        python3 - "$set" "$work/peers-$set-nxc.jsonl" "$work/peers-$set-hslide.jsonl" \
            >>"$summary" <<'EOF'
import json, os, sys
name, nxc_file, hs_file = sys.argv[1:4]
if not (os.path.exists(nxc_file) and os.path.exists(hs_file)):
    sys.exit(0)
nxc = [json.loads(l) for l in open(nxc_file) if l.strip()][-1]
hs = [json.loads(l) for l in open(hs_file) if l.strip()]
target, nxc_s = nxc["p@1"], nxc["epoch_seconds"]
spent, to_target = 0.0, None
for r in hs:
    spent += r["epoch_seconds"]
    if to_target is None and r.get("p@1", 0) >= target:
        to_target = spent
reached = f"{to_target:.2f}" if to_target is not None else "not reached"
speedup = f"{nxc_s / to_target:.1f}x" if to_target else ""
print(f"| {name} | {target:.4f} | {nxc_s:.2f} | {hs[-1].get('p@1', float('nan')):.4f} | "
      f"{sum(r['epoch_seconds'] for r in hs):.2f} | {reached} | {speedup} |")
EOF
        echo "peers $set: $((SECONDS - started)) s"
        [[ $out == "$work" ]] || { cp "$summary" "$out/"; ship_logs; }
    done
}

case "$mode" in
peers)
    summary="$work/summary.md"
    echo "# gpu_check.sh peers ($(date -u +%FT%TZ))" >"$summary"
    run_peers
    cat "$summary"
    ;;
tests)
    status=0
    run_tests >"$work/tests.txt" || status=1
    cat "$work/tests.txt"
    # The logs so far come back even if the sanitizers below outlast the call's time limit.
    [[ $out == "$work" ]] || ship_logs
    run_sanitizers 150 || status=1
    [[ $out == "$work" ]] || ship_logs
    exit $status
    ;;
bench | topk)
    if [[ $mode == topk ]]; then
        # Issue 19: top-k against dense (and LSH) at the issue's sizes, top-k first.
        scale=1
        epochs=${2:-3}
        presets=amazon670k@1,wikilshtc325k@0.25,amazon3m@0.02
    else
        scale=${2:-0.1}
        epochs=${3:-2}
        presets=${4:-amazon670k,wikilshtc325k,amazon3m}
    fi
    summary="$work/summary.md"
    summary_head "Scale $scale (NAME@S: S), $epochs epochs." >"$summary"
    for spec in ${presets//,/ }; do
        prepare_preset "$spec"
        # BACKEND PRECISION [BATCH [VARIANT]] (default: the preset's batch). On amazon670k, gpu
        # bf16 at 1024 too:
        # how much of a step at 256 is per-step overhead (launches, the wait for the set sizes)
        # tells whether CUDA graphs and a wait-free step are worth building; and with the table
        # rebuilds on a side stream (--gpu-async-rebuild), to decide its default; and the hybrid
        # both adaptive (its default: equal update shares, so the GPU worker's batches grow
        # far past the single backend's) and hogbatch with the GPU worker at the single
        # backend's batch (a quarter of it on the CPU), to see which reaches a P@1 sooner.
        configs=("gpu fp32" "gpu bf16" "gpu bf16 $p_batch lsh" "gpu-dense bf16" "cpu fp32")
        [[ $preset == amazon670k ]] &&
            configs+=("gpu bf16 1024" "gpu bf16 $p_batch async" "hybrid fp32" "hybrid fp32 $p_batch hog")
        # The PyTorch baseline in fp32 and in bf16 autocast (the fastest dense baseline the
        # sparse paths are measured against, issue 22).
        [[ $preset == amazon670k ]] && have_torch_cuda && configs+=("torch fp32" "torch bf16")
        # 2.8M labels: exact scores of every test point would dominate the run.
        [[ $preset == amazon3m ]] && configs=("gpu bf16" "gpu bf16 $p_batch lsh" "gpu-dense bf16")
        [[ $mode == topk ]] && configs=("gpu bf16 $p_batch topk" "gpu bf16 $p_batch topk-fc"
            "gpu-dense bf16" "gpu bf16 $p_batch lsh")
        # Issue 19's hybrid: top-k on the GPU worker beside LSH on a CPU worker.
        [[ $mode == topk && $preset == amazon670k ]] && configs+=("hybrid bf16 $p_batch topk-gpu")
        for config in "${configs[@]}"; do run_config "$config"; done
    done
    cat "$summary"
    ;;
all)
    # Issue 22's one check. Its parts run in order of what matters most, each only while the
    # budget (seconds, default 460: inside 8 minutes with the unpacking) leaves room for its
    # estimate, so that a slow machine loses the last parts, not the whole summary.
    epochs=${2:-3}
    budget=${3:-460}
    summary="$work/summary.md"
    status=0
    fits() { ((budget - SECONDS > $1)); }
    {
        echo "# gpu_check.sh all ($(date -u +%FT%TZ))"
        echo
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || true
        echo
        echo "## GPU tests"
        echo
    } >"$summary"
    # The datasets are generated on the CPU while the GPU tests run.
    scale=1
    (for spec in amazon670k@1 wikilshtc325k@0.25 amazon3m@0.02 amazon670k@0.02; do
        prepare_preset "$spec"
    done) >"$work/gen.log" 2>&1 &
    gen_pid=$!
    run_tests >>"$summary" || status=1
    wait "$gen_pid" || { cat "$work/gen.log" "$summary"; echo "gpu_check.sh: data generation failed" >&2; exit 1; }
    echo "data ready at $SECONDS s"
    {
        echo
        summary_head "Amazon-670K-shaped at full size, $epochs epochs; WikiLSHTC-325K-shaped at scale 0.25 and Amazon-3M-shaped at scale 0.02, 2 epochs."
    } >>"$summary"
    # "CONFIG:ESTIMATED SECONDS" (2026-11-26's H200 run, rounded up), run while the estimate
    # fits: what issues 19 and 22 check first, PyTorch (2 minutes a precision) last.
    prepare_preset amazon670k@1
    parts=("gpu bf16 $p_batch topk:30" "gpu bf16 $p_batch topk-fused:30" "gpu-dense bf16:45"
        "gpu bf16 $p_batch lsh:25" "gpu bf16 $p_batch topk-nopool:30" "gpu bf16 $p_batch topk-fc:30"
        "hybrid bf16 $p_batch topk-gpu:30")
    for part in "${parts[@]}"; do fits "${part##*:}" && run_config "${part%:*}"; done
    epochs=2
    for spec in amazon3m@0.02 wikilshtc325k@0.25; do
        prepare_preset "$spec"
        for part in "gpu bf16 $p_batch topk:20" "gpu bf16 $p_batch topk-fc:20" "gpu-dense bf16:20" \
            "gpu bf16 $p_batch lsh:20"; do
            fits "${part##*:}" && run_config "${part%:*}"
        done
    done
    if fits 60; then
        { echo; echo "## compute-sanitizer"; echo; } >>"$summary"
        run_sanitizers 40 >>"$summary" || status=1
    fi
    # One step's kernels, on a slice of Amazon-670K with its full label and feature counts.
    prepare_preset amazon670k@0.02
    # About 0.2 s a profiled launch; a step launches about 40 (LSH), 90 (top-k), 15 (dense).
    fits 40 && profile_step lsh-bf16 130 --backend gpu --precision bf16 --output-sparsity lsh
    fits 50 && profile_step topk-bf16 200 --backend gpu --precision bf16 --output-sparsity topk
    fits 30 && profile_step topk-fused-bf16 120 HSLIDE_GPU_TOPK_FUSED=1 --backend gpu \
        --precision bf16 --output-sparsity topk
    fits 30 && profile_step dense-bf16 70 --backend gpu-dense --precision bf16
    prepare_preset amazon670k@1
    epochs=${2:-3}
    have_torch_cuda && fits 130 && run_config "torch bf16"
    fits 60 && run_peers
    have_torch_cuda && fits 150 && run_config "torch fp32"
    printf '\ndone in %s s\n' "$SECONDS" >>"$summary"
    [[ $out == "$work" ]] || { cp "$summary" "$out/"; ship_logs; }
    cat "$summary"
    exit $status
    ;;
reproduce)
    scale=${2:-0.01}
    epochs=${3:-2}
    preset=${4:-amazon670k}
    shift $(($# < 4 ? $# : 4))
    # The python with PyTorch and matplotlib: the PATH's python3 on the GPU machine (a venv),
    # Debian's elsewhere.
    if [[ -z ${PYTHON:-} ]]; then
        for candidate in "$(command -v python3)" /usr/bin/python3; do
            if "$candidate" -c 'import torch, matplotlib' 2>/dev/null; then
                export PYTHON=$candidate
                break
            fi
        done
    fi
    status=0
    scripts/reproduce.sh --preset "$preset" --scale "$scale" --epochs "$epochs" \
        --hslide "$root/bin/hslide" --out "$work/report" --data-cache "$work/data" "$@" \
        2>&1 | tee "$work/reproduce.log" || status=1
    if [[ $out != "$work" ]]; then
        for f in report.md results.csv hardware.json p1_vs_time.png stages.png; do
            [[ -f $work/report/$f ]] && cp "$work/report/$f" "$out/"
        done
        ship_logs
    fi
    exit $status
    ;;
esac
