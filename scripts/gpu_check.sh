#!/usr/bin/env bash
# The GPU check every session with a GPU machine runs: build here, test and measure there.
#
#   scripts/gpu_check.sh pack               # here: build with CUDA into build-gpu/ and pack
#                                           # the binaries, the shared libraries they need and
#                                           # the Bibtex data into gpu-pack/ (git-ignored)
#   scripts/gpu_check.sh tests              # on the GPU machine: the GPU tests, then
#                                           # compute-sanitizer memcheck and racecheck on the
#                                           # LSH and top-k kernels' tests (where it exists)
#   scripts/gpu_check.sh bench [SCALE] [EPOCHS]
#                                           # on the GPU machine: Amazon-670K- and
#                                           # WikiLSHTC-325K-shaped presets (full label and
#                                           # feature counts, SCALE x the points, default 0.1)
#                                           # with the gpu, gpu bf16, gpu-dense bf16 and cpu
#                                           # (all cores) backends, EPOCHS each (default 2),
#                                           # and on Amazon-670K hybrid cpu+gpu (adaptive);
#                                           # then the 3M-label preset (amazon3m) with gpu and
#                                           # gpu-dense in bf16 (2,000 test points scored)
#
# With the device tool: run `scripts/gpu_check.sh pack` here, then
#   run(command="scripts/gpu_check.sh tests", carry=["gpu-pack"])
#   run(command="scripts/gpu_check.sh bench 0.1 2", carry=["gpu-pack"])
# Results (logs, JSONL metrics, nvidia-smi, a summary.md) go to $OUT (default results/gpu).
# The GPU machine has no Debian packages: the pack carries libfmt, libspdlog, libxxhash,
# libgomp and libstdc++ beside the binaries; the CUDA runtime is linked statically and cuBLAS
# (gpu-dense only) is loaded from the machine's CUDA or PyTorch (set HSLIDE_CUBLAS).
set -euo pipefail
cd "$(dirname "$0")/.."

pack=gpu-pack
mode=${1:-}

case "$mode" in
pack)
    ./scripts/setup.sh
    cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DHSLIDE_CUDA=ON \
        -DHSLIDE_BUILD_BENCH=OFF >/dev/null
    cmake --build build-gpu -j "$(nproc)" --target hslide test_gpu_backend test_device_hash
    rm -rf "$pack"
    mkdir -p "$pack/bin" "$pack/lib" "$pack/data"
    cp build-gpu/hslide build-gpu/test_gpu_backend build-gpu/test_device_hash "$pack/bin/"
    for lib in $(ldd "$pack"/bin/* | awk '/=>/ {print $3}' | sort -u); do
        case "$(basename "$lib")" in
        libc.so* | libm.so* | ld-linux* | libdl.so* | libpthread.so* | librt.so*) ;;
        *) cp -L "$lib" "$pack/lib/" ;;
        esac
    done
    shared=${HSLIDE_SHARED_DATA:-../shared/data}
    if [[ -d $shared/bibtex ]]; then cp -r "$shared/bibtex" "$pack/data/"; fi
    du -sh "$pack"
    ;;
tests | bench)
    [[ -x $pack/bin/hslide ]] || { echo "gpu_check.sh: no $pack/bin/hslide: run '$0 pack' first and carry $pack" >&2; exit 1; }
    out=${OUT:-results/gpu}
    mkdir -p "$out"
    export LD_LIBRARY_PATH="$PWD/$pack/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export HSLIDE_SHARED_DATA="$PWD/$pack/data"
    export HSLIDE_BINARY="$PWD/$pack/bin/hslide"  # the tests' CLI runs use the packed binary
    # Where PyTorch brings its own cuBLAS, gpu-dense can use it.
    if [[ -z ${HSLIDE_CUBLAS:-} ]]; then
        torch_cublas=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(nvidia.cublas.__path__[0], "lib", "libcublas.so.12"))' 2>/dev/null || true)
        if [[ -n $torch_cublas && -f $torch_cublas ]]; then export HSLIDE_CUBLAS=$torch_cublas; fi
    fi
    { nvidia-smi || true; "$pack/bin/hslide" info; } >"$out/machine.txt" 2>&1
    cat "$out/machine.txt"
    if [[ $mode == tests ]]; then
        status=0
        for t in test_device_hash test_gpu_backend; do
            "$pack/bin/$t" --gtest_output="xml:$out/$t.xml" 2>&1 | tee "$out/$t.log" || status=1
        done
        # The kernels with shared-memory hash sets, warp shuffles and block-wide picks, under
        # compute-sanitizer where the machine's CUDA has it (a few minutes at most).
        sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1 || true)
        if [[ -n $sanitizer ]]; then
            for tool in memcheck racecheck; do
                timeout 300 "$sanitizer" --tool "$tool" --error-exitcode 3 \
                    "$pack/bin/test_gpu_backend" --gtest_filter='GpuLsh.*:GpuTopK.*' \
                    >"$out/sanitizer-$tool.log" 2>&1 || { status=1; echo "compute-sanitizer $tool: see sanitizer-$tool.log"; }
                tail -3 "$out/sanitizer-$tool.log"
            done
        else
            echo "no compute-sanitizer on this machine: kernels not sanitized"
        fi
        exit $status
    fi
    scale=${2:-0.1}
    epochs=${3:-2}
    summary="$out/summary.md"
    {
        echo "Per epoch: training seconds (median over epochs), P@1 after the last epoch, and the"
        echo "stage seconds of the last epoch (hashing, active sets, forward, backward, update,"
        echo "table rebuilds, host-device transfer)."
        echo
        echo "| preset | backend | precision | s/epoch | P@1 | hash | sets | fwd | bwd | update | rebuild | transfer |"
        echo "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    } >"$summary"
    for preset in amazon670k wikilshtc325k amazon3m; do
        data="$out/data-$preset"
        "$pack/bin/hslide" gen --preset "$preset" --scale "$scale" --out "$data" -q
        configs=("gpu fp32" "gpu bf16" "gpu-dense bf16" "cpu fp32")
        [[ $preset == amazon670k ]] && configs+=("hybrid fp32")
        # 2.8M labels: exact scores of every test point would dominate the run.
        [[ $preset == amazon3m ]] && configs=("gpu bf16" "gpu-dense bf16")
        for config in "${configs[@]}"; do
            read -r backend precision <<<"$config"
            name="$preset-$backend-$precision"
            extra=()
            [[ $backend == hybrid ]] && extra=(--workers cpu,gpu --schedule adaptive)
            [[ $preset == amazon3m ]] && extra+=(--eval-max 2000)
            "$pack/bin/hslide" train --train "$data/train.txt" --test "$data/test.txt" \
                --backend "$backend" --precision "$precision" --epochs "$epochs" \
                --batch-size 256 --no-progress --metrics-out "$out/$name.jsonl" "${extra[@]}" \
                >"$out/$name.log" 2>&1 || echo "($name failed: see $name.log)" >>"$summary"
            if [[ -s $out/$name.jsonl ]]; then
                python3 - "$out/$name.jsonl" "$preset" "$backend" "$precision" >>"$summary" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
last = rows[-1]
st = last.get("stage_seconds", {})
stages = " | ".join(f"{st.get(k, 0):.2f}" for k in
                    ("hashing", "active_sets", "forward", "backward", "update", "rebuild",
                     "transfer"))
print(f"| {sys.argv[2]} | {sys.argv[3]} | {sys.argv[4]} | "
      f"{statistics.median(r['epoch_seconds'] for r in rows):.2f} | "
      f"{last.get('p@1', float('nan')):.4f} | {stages} |")
# Hybrid: each worker's share of samples and updates, utilisation and parked time, per epoch.
for r in rows:
    for w in r.get("workers", []):
        wall = w["wall_seconds"] or 1
        print(f"|  | epoch {r['epoch']}: {w['name']} | | "
              f"{w['samples']} samples, {100 * w['update_share']:.0f}% of updates | "
              f"busy {100 * w['utilisation']:.0f}% | "
              f"parked {100 * w['parked_seconds'] / wall:.0f}% | | | | | | |")
EOF
            fi
        done
    done
    cat "$summary"
    ;;
*)
    sed -n '2,26p' "$0" >&2
    exit 2
    ;;
esac
