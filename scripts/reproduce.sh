#!/usr/bin/env bash
# Reproduction and hardware-comparison harness: trains one workload with several backend and
# precision configurations (and a dense PyTorch baseline) on the same data, and writes a
# results folder with every evaluation (results.csv, results.jsonl), a Markdown report
# (seconds per epoch and speedups as in the G-SLIDE paper's table, per-stage breakdown,
# time to a target P@1), plots (p1_vs_time.png, stages.png) and the hardware (hardware.json).
# See "Reproducing the papers' comparisons" in README.md.
#
# Usage: scripts/reproduce.sh [--preset NAME --scale S | --train FILE --test FILE] [options]
#                             [-- extra flags for every `hslide train`]
#   --preset NAME       amazon670k (default), wikilshtc325k, delicious200k, amazon3m, tiny
#   --scale S           synthetic point-count factor (default 0.01)
#   --labels N, --features N, --data-seed N (2024)   synthetic data overrides
#   --train FILE, --test FILE, --train-split FILE, --test-split FILE, --split-column K
#                       real data (XC or LibSVM files, as `hslide train` reads them) instead of
#                       synthetic; the network and LSH settings are still the preset's
#   --configs "LIST"    configurations, space or comma separated (default: every CPU one, and
#                       the GPU ones where a GPU and a CUDA build are present; see below);
#                       also from $HSLIDE_REPRO_CONFIGS
#   --epochs N (2), --threads N (all cores), --target-p1 X (auto), --eval-max N (0 = all)
#   --hidden, --K, --L, --bits, --bucket-capacity, --batch-size, --lr, --min-active
#                       override the preset's settings (scripts/presets.sh)
#   --scoring exact|auto (exact: every label scored in every evaluation, so configurations
#                       compare on the same footing; auto: LSH scoring for sparse layers)
#   --out DIR           results folder (default results/reproduce-<preset>-<date>)
#   --data-cache DIR    where synthetic data is generated once and reused (results/data)
#   --hslide PATH       the binary (default build/hslide, built by scripts/build.sh if missing)
#   --napkinxc BIN      napkinXC's CLI (`nxc`, built from your clone) for the napkinxc
#                       configurations (default: $NAPKINXC)
#
#   --reuse             keep the runs already complete in --out (same configuration and epoch
#                       count; the settings are not compared): run only the missing ones
# A configuration is BACKEND[:PRECISION[:ISA]][@EPOCHS] (@EPOCHS: this one's epoch count):
#   cpu         hslide's CPU backend, the preset's output layer (top-k, found by the IVF search
#               on a CPU; tiny: LSH)                           (cpu, cpu:bf16, cpu:fp32:avx2)
#   cpu-lsh     the same backend with SLIDE's LSH output layer (--output-sparsity lsh)
#   cpu-nolsh   the same backend and kernels, dense output layer (--output-sparsity dense)
#   cpu-dense   hslide's full-softmax OpenBLAS backend (--backend cpu-dense)
#   hybrid-cpu  --backend hybrid --workers cpu,cpu (the threads shared between the workers)
#   gpu, gpu-dense, hybrid-gpu (--workers gpu,cpu)   the CUDA backends (gpu: the preset's
#               output layer, exact top-k on a GPU), gpu-lsh (SLIDE's LSH, as cpu-lsh)
#   cpu-topk, gpu-topk   the cpu / gpu backend with an exact top-k output layer
#               (--output-sparsity topk --top-k-search exact; --top-k from the extra flags,
#               default 64)
#   torch-cpu, torch-gpu   scripts/baselines/torch_dense.py: PyTorch, full softmax (torch-gpu:bf16:
#               autocast mixed precision, the fastest dense baseline on a GPU)
#   napkinxc, napkinxc-tuned   scripts/baselines/napkinxc.sh: napkinXC's label trees (PLT,
#               LIBLINEAR nodes) with its defaults, or with --arity 16 -C 16; --threads
#               threads; one record (its train time as one "epoch"); needs --napkinxc;
#               never in the default list; no PRECISION, ISA or @EPOCHS
# PRECISION is fp32 (default) or bf16; ISA is an `--isa` level (default auto).
# Environment: PYTHON (default /usr/bin/python3: Debian's python3-torch/-matplotlib).
#
# Usage: scripts/reproduce.sh --compare DIR DIR ... [--names "A B ..."] [--target-p1 X] [--out OUT]
#   puts results folders of one workload from different machines (or builds) side by side:
#   OUT/compare.md (s/epoch and time to one common target P@1 per configuration and machine,
#   each machine's speedup over the first, each machine's fastest configuration),
#   OUT/compare.csv and OUT/compare_p1_vs_time.png (default OUT: results/compare-<date>);
#   machines are named by --names or by their folders' names.
set -euo pipefail
here="$PWD"
cd "$(dirname "$0")/.."

die() { echo "reproduce.sh: error: $*" >&2; exit 2; }
note() { echo "reproduce.sh: $*" >&2; }

python="${PYTHON:-/usr/bin/python3}"
invocation="scripts/reproduce.sh $*"
preset=amazon670k
scale=0.01
labels=""
features=""
data_seed=2024
train=""
test=""
train_split=""
test_split=""
split_column=1
configs="${HSLIDE_REPRO_CONFIGS:-}"
epochs=2
threads=""
target_p1=""
eval_max=0
scoring=exact
out=""
data_cache=results/data
hslide=build/hslide
napkinxc="${NAPKINXC:-}"
reuse=0
hidden="" K="" L="" bits="" batch="" lr="" min_active="" capacity=""
extra=()

need() { if (($# < 2)) || [[ -z $2 ]]; then die "$1 needs a value"; fi; }

if [[ ${1:-} == --compare ]]; then
    shift
    dirs=() names="" cmp_out="results/compare-$(date -u +%Y%m%d-%H%M%S)" cmp_target=()
    while (($#)); do
        case $1 in
            --names) need "$@"; names=$2; shift 2 ;;
            --out) need "$@"; cmp_out=$2; shift 2 ;;
            --target-p1) need "$@"; cmp_target=(--target-p1 "$2"); shift 2 ;;
            -*) die "unknown argument '$1' for --compare (--help lists them)" ;;
            *) dir=$1; [[ $dir == /* ]] || dir="$here/$dir"
               [[ -f $dir/results.jsonl || -f $dir/results.csv ]] ||
                   die "$1 is not a results folder (no results.jsonl or results.csv)"
               dirs+=("$dir"); shift ;;
        esac
    done
    ((${#dirs[@]} >= 2)) || die "--compare needs at least two results folders"
    [[ $cmp_out == /* ]] || cmp_out="$here/$cmp_out"
    if [[ -z $names ]]; then
        # Default names: the folders' names, which reproduce.sh makes from preset and date.
        for d in "${dirs[@]}"; do names+="$(basename "$d") "; done
    fi
    "$python" scripts/report.py compare --out "$cmp_out" --names "$names" "${cmp_target[@]}" \
        "${dirs[@]}" || exit $?
    note "comparison in $cmp_out (compare.md, compare.csv, compare_p1_vs_time.png)"
    exit 0
fi
while (($#)); do
    case $1 in
        --preset) need "$@"; preset=$2; shift 2 ;;
        --scale) need "$@"; scale=$2; shift 2 ;;
        --labels) need "$@"; labels=$2; shift 2 ;;
        --features) need "$@"; features=$2; shift 2 ;;
        --data-seed) need "$@"; data_seed=$2; shift 2 ;;
        --train) need "$@"; train=$2; shift 2 ;;
        --test) need "$@"; test=$2; shift 2 ;;
        --train-split) need "$@"; train_split=$2; shift 2 ;;
        --test-split) need "$@"; test_split=$2; shift 2 ;;
        --split-column) need "$@"; split_column=$2; shift 2 ;;
        --configs) need "$@"; configs=$2; shift 2 ;;
        --epochs) need "$@"; epochs=$2; shift 2 ;;
        --threads) need "$@"; threads=$2; shift 2 ;;
        --target-p1) need "$@"; target_p1=$2; shift 2 ;;
        --eval-max) need "$@"; eval_max=$2; shift 2 ;;
        --scoring) need "$@"; scoring=$2; shift 2 ;;
        --out) need "$@"; out=$2; shift 2 ;;
        --data-cache) need "$@"; data_cache=$2; shift 2 ;;
        --hslide) need "$@"; hslide=$2; shift 2 ;;
        --napkinxc) need "$@"; napkinxc=$2; shift 2 ;;
        --reuse) reuse=1; shift ;;
        --hidden) need "$@"; hidden=$2; shift 2 ;;
        --K) need "$@"; K=$2; shift 2 ;;
        --L) need "$@"; L=$2; shift 2 ;;
        --bits) need "$@"; bits=$2; shift 2 ;;
        --batch-size) need "$@"; batch=$2; shift 2 ;;
        --lr) need "$@"; lr=$2; shift 2 ;;
        --min-active) need "$@"; min_active=$2; shift 2 ;;
        --bucket-capacity) need "$@"; capacity=$2; shift 2 ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        --) shift; extra=("$@"); break ;;
        *) die "unknown argument '$1' (--help lists them)" ;;
    esac
done

# --- the preset: the papers' network and hyperparameters (scripts/presets.sh) ---------------------
# The learning rate is 0.002 (hslide's default until 2026-11-29, kept so that the reports stay
# comparable), not the papers' 1e-4: at a small --scale there
# are too few steps for 1e-4 to learn in a few epochs (--lr 0.0001 for theirs).
source scripts/presets.sh
preset_settings "$preset" ||
    die "unknown preset '$preset' (valid: amazon670k, wikilshtc325k, delicious200k, amazon3m, tiny)"
sparsity=$p_sparsity
hidden=${hidden:-$p_hidden} K=${K:-$p_K} L=${L:-$p_L} bits=${bits:-$p_bits} batch=${batch:-$p_batch}
min_active=${min_active:-$p_min_active} capacity=${capacity:-$p_capacity} lr=${lr:-0.002}
[[ $scoring == exact || $scoring == auto ]] || die "--scoring must be exact or auto"
[[ $epochs =~ ^[1-9][0-9]*$ ]] || die "--epochs must be a positive integer"
[[ -z $target_p1 || $target_p1 =~ ^(0?\.[0-9]+|[01](\.[0-9]*)?)$ ]] || die "--target-p1 must be in [0, 1]"
threads=${threads:-$(nproc)}
# Paths given relative to where the command was run (this script works from the repository root).
abspath() { if [[ -z $1 || $1 == /* ]]; then echo "$1"; else echo "$here/$1"; fi; }
train=$(abspath "$train") test=$(abspath "$test") out=$(abspath "$out")
train_split=$(abspath "$train_split") test_split=$(abspath "$test_split")
[[ $data_cache == results/data ]] || data_cache=$(abspath "$data_cache")
[[ $hslide == build/hslide ]] || hslide=$(abspath "$hslide")
[[ -z $napkinxc ]] || napkinxc=$(abspath "$napkinxc")

# --- the binary -----------------------------------------------------------------------------------
if [[ ! -x $hslide ]]; then
    [[ $hslide == build/hslide ]] || die "no executable hslide at $hslide"
    note "building build/hslide"
    ./scripts/build.sh --target hslide >/dev/null
fi
info="$("$hslide" info)"
# A backend this hslide accepts: its flag parser takes the name (--print-config stops after parsing).
has_backend() { "$hslide" train --backend "$1" --print-config >/dev/null 2>&1; }
best_isa="$(sed -n 's/^cpu kernels: [a-z0-9]* (best on this cpu: \([a-z0-9]*\);.*/\1/p' <<<"$info")"
has_gpu=0
if grep -q '^cuda backend in this build: yes' <<<"$info" && command -v nvidia-smi >/dev/null &&
    nvidia-smi -L >/dev/null 2>&1; then
    has_gpu=1
fi
has_torch=0
"$python" -c 'import torch, numpy' 2>/dev/null && has_torch=1

# --- configurations -------------------------------------------------------------------------------
notes=()
if [[ -z $configs ]]; then
    # cpu@(4 x epochs): a sparse epoch costs a small fraction of a dense one, so the sparse path
    # trained longer, still in less time, shows when it reaches the dense runs' accuracy.
    configs="cpu cpu@$((epochs * 4)) cpu-lsh cpu:bf16"
    [[ $best_isa == avx512* ]] && configs+=" cpu:fp32:avx2"
    configs+=" hybrid-cpu"
    if has_backend cpu-dense; then
        configs+=" cpu-dense"
    else
        configs+=" cpu-nolsh"
        notes+=("this build has no cpu-dense backend: cpu-nolsh (the CPU backend with a dense output layer) stands in as hslide's dense CPU baseline")
    fi
    if ((has_torch)); then configs+=" torch-cpu"; else notes+=("PyTorch missing for $python: no torch-cpu baseline"); fi
    if ((has_gpu)); then
        configs+=" gpu gpu:bf16 gpu-lsh:bf16 hybrid-gpu"
        has_backend gpu-dense && configs+=" gpu-dense"
        "$python" -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null &&
            configs+=" torch-gpu torch-gpu:bf16"
    fi
fi
configs="${configs//,/ }"
read -r -a config_list <<<"$configs"
((${#config_list[@]})) || die "no configurations"

# Checks every configuration before anything runs.
declare -A seen=()
for c in "${config_list[@]}"; do
    spec="${c%@*}"
    if [[ $c == *@* ]]; then
        [[ ${c##*@} =~ ^[1-9][0-9]*$ ]] || die "configuration '$c': @EPOCHS must be a positive integer"
    fi
    IFS=: read -r backend precision isa rest <<<"$spec"
    [[ -z ${rest:-} ]] || die "configuration '$c': expected BACKEND[:PRECISION[:ISA]][@EPOCHS]"
    case $backend in
        cpu | cpu-lsh | cpu-nolsh | cpu-dense | cpu-topk | gpu | gpu-lsh | gpu-dense | gpu-topk | hybrid-cpu | hybrid-gpu) ;;
        torch-cpu | torch-gpu)
            [[ -z $isa ]] || die "configuration '$c': the PyTorch baseline takes a precision, not an ISA"
            ((has_torch)) || die "configuration '$c': $python cannot import torch and numpy (scripts/setup.sh installs python3-torch)" ;;
        napkinxc | napkinxc-tuned)
            [[ $spec == "$c" && $spec == "$backend" ]] ||
                die "configuration '$c': napkinXC takes no precision, ISA or @EPOCHS"
            [[ -n $napkinxc ]] || die "configuration '$c' needs --napkinxc BIN (napkinXC's nxc; or set \$NAPKINXC)"
            [[ -x $napkinxc ]] || die "configuration '$c': $napkinxc is not an executable (--napkinxc)" ;;
        *) die "unknown configuration '$c' (backends: cpu cpu-lsh cpu-nolsh cpu-dense cpu-topk hybrid-cpu gpu gpu-lsh gpu-dense gpu-topk hybrid-gpu torch-cpu torch-gpu napkinxc napkinxc-tuned)" ;;
    esac
    [[ -z $precision || $precision == fp32 || $precision == bf16 ]] ||
        die "configuration '$c': precision must be fp32 or bf16"
    [[ -z $isa || $isa =~ ^(auto|scalar|avx2|avx512|avx512bf16)$ ]] ||
        die "configuration '$c': unknown ISA level '$isa'"
    case $backend in
        cpu-dense | gpu | gpu-dense) has_backend "$backend" || die "configuration '$c': this hslide has no --backend $backend" ;;
        gpu-topk | gpu-lsh) has_backend gpu || die "configuration '$c': this hslide has no --backend gpu" ;;
    esac
    [[ -z ${seen[$c]:-} ]] || die "configuration '$c' given twice"
    seen[$c]=1
done

# --- data: generated once per preset/scale/seed, or the user's files ------------------------------
data_args=()
torch_data_args=()
if [[ -n $train ]]; then
    [[ -f $train ]] || die "no training file $train"
    [[ -n $test || -n $test_split ]] || die "--train needs --test (or --test-split)"
    [[ -z $test || -f $test ]] || die "no test file $test"
    for f in "$train_split" "$test_split"; do [[ -z $f || -f $f ]] || die "no split file $f"; done
    data_args=(--train "$train")
    [[ -n $test ]] && data_args+=(--test "$test")
    [[ -n $train_split ]] && data_args+=(--train-split "$train_split")
    [[ -n $test_split ]] && data_args+=(--test-split "$test_split" --split-column "$split_column")
    [[ -n $train_split ]] && data_args+=(--split-column "$split_column")
    torch_data_args=("${data_args[@]}")
    workload="files: $train${test:+ / $test}"
else
    name="$preset-s$scale-seed$data_seed${labels:+-l$labels}${features:+-f$features}"
    data_dir="$data_cache/$name"
    if [[ ! -f $data_dir/.complete ]]; then
        note "generating $preset at --scale $scale into $data_dir"
        mkdir -p "$data_dir"
        "$hslide" gen --preset "$preset" --scale "$scale" --seed "$data_seed" \
            ${labels:+--labels "$labels"} ${features:+--features "$features"} \
            --out "$data_dir" --no-progress -q
        touch "$data_dir/.complete"
    else
        note "reusing $data_dir"
    fi
    data_args=(--train "$data_dir/train.txt" --test "$data_dir/test.txt")
    torch_data_args=("${data_args[@]}")
    workload="synthetic $preset, --scale $scale, --data-seed $data_seed${labels:+, $labels labels}${features:+, $features features}"
fi

out="${out:-results/reproduce-$preset-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$out/runs"
"$python" scripts/report.py hardware --hslide "$hslide" --out "$out/hardware.json"

# --label-rows all: a row for every label, as the papers' networks and the dense baselines have.
model_args=(--hidden "$hidden" --K "$K" --L "$L" --bits "$bits" --bucket-capacity "$capacity"
            --min-active "$min_active" --fill-correction "$p_fill_correction" --label-rows all)
# The papers' softmax (and PyTorch's, and every backend's: the CPU rows' --loss auto would be
# logistic, the GPU rows' softmax).
common=(--batch-size "$batch" --lr "$lr" --loss softmax --eval-every 1 --scoring "$scoring"
        --eval-max "$eval_max" --no-progress)

# --- the runs -------------------------------------------------------------------------------------
failed=()
for c in "${config_list[@]}"; do
    spec="${c%@*}"
    IFS=: read -r backend precision isa _ <<<"$spec"
    n_epochs=$epochs
    [[ $c == *@* ]] && n_epochs=${c##*@}
    [[ $backend == napkinxc* ]] && n_epochs=1
    file="${c//:/_}"
    log="$out/runs/$file.log"
    metrics="$out/runs/$file.jsonl"
    if ((reuse)) && [[ -f $metrics ]] && (($(wc -l <"$metrics") == n_epochs)); then
        note "== $c: reusing $metrics"
        continue
    fi
    case $backend in
        torch-cpu | torch-gpu)
            device=cpu
            [[ $backend == torch-gpu ]] && device=cuda
            cmd=("$python" scripts/baselines/torch_dense.py "${torch_data_args[@]}" --device "$device"
                 --hidden "$hidden" --epochs "$n_epochs" --batch-size "$batch" --lr "$lr"
                 --threads "$threads" --eval-max "$eval_max" --precision "${precision:-fp32}"
                 --metrics-out "$metrics") ;;
        napkinxc | napkinxc-tuned)
            cmd=(scripts/baselines/napkinxc.sh --nxc "$napkinxc" "${torch_data_args[@]}"
                 --threads "$threads" --eval-max "$eval_max" --label "$c" --no-header
                 --metrics-out "$metrics")
            [[ $backend == napkinxc-tuned ]] && cmd+=(-- --arity 16 -C 16) ;;
        *)
            cmd=("$hslide" train "${data_args[@]}" "${model_args[@]}" --epochs "$n_epochs" "${common[@]}"
                 --threads "$threads" --precision "${precision:-fp32}" --isa "${isa:-auto}")
            case $backend in
                cpu-nolsh) cmd+=(--backend cpu --output-sparsity dense) ;;
                cpu-dense | gpu-dense) cmd+=(--backend "$backend" --output-sparsity dense) ;;
                cpu-topk | gpu-topk)
                    cmd+=(--backend "${backend%-topk}" --output-sparsity topk --top-k-search exact) ;;
                cpu-lsh | gpu-lsh) cmd+=(--backend "${backend%-lsh}" --output-sparsity lsh) ;;
                hybrid-cpu) cmd+=(--backend hybrid --workers "cpu,cpu" --output-sparsity "$sparsity") ;;
                hybrid-gpu) cmd+=(--backend hybrid --workers "gpu,cpu" --output-sparsity "$sparsity") ;;
                *) cmd+=(--backend "$backend" --output-sparsity "$sparsity") ;;
            esac
            cmd+=("${extra[@]}" --metrics-out "$metrics") ;;
    esac
    note "== $c"
    rm -f "$metrics"  # hslide appends to --metrics-out
    printf '%q ' "${cmd[@]}" >"$log"
    printf '\n' >>"$log"
    if "${cmd[@]}" >>"$log" 2>&1; then
        grep -E '^(epoch|final)' "$log" | tail -n 1 >&2 || true
    else
        note "$c failed (exit $?); see $log"
        failed+=("$c")
    fi
done

# --- results, report and plots --------------------------------------------------------------------
{
    printf 'workload\t%s\n' "$workload"
    printf 'settings\thidden %s, K %s, L %s, bits %s, bucket capacity %s, min-active %s, batch %s, lr %s, %s epochs, %s threads, %s scoring, output sparsity %s\n' \
        "$hidden" "$K" "$L" "$bits" "$capacity" "$min_active" "$batch" "$lr" "$epochs" "$threads" "$scoring" "$sparsity"
    printf 'command\t%s\n' "$invocation"
    for n in "${notes[@]}"; do printf 'note\t%s\n' "$n"; done
    for c in "${failed[@]}"; do printf 'failed\t%s\n' "$c"; done
} >"$out/run_info.tsv"
report_args=(report --dir "$out" --configs "${config_list[*]}")
[[ -n $target_p1 ]] && report_args+=(--target-p1 "$target_p1")
"$python" scripts/report.py "${report_args[@]}"
note "results in $out (report.md, results.csv, results.jsonl, p1_vs_time.png, stages.png, hardware.json)"
if ((${#failed[@]})); then
    note "failed configurations: ${failed[*]}"
    exit 1
fi
