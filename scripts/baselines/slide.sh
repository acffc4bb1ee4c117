#!/usr/bin/env bash
# Runs the public SLIDE code -- the original (keroro824/HashingDeepLearning, folder SLIDE/) or
# Intel's optimized version (IntelLabs/SLIDE_opt_ia, folder SLIDE/) -- on XC-format files (what
# `hslide gen` writes), with a given network / LSH setting, and prints one CSV line per epoch:
# training seconds (SLIDE's own clock around its training step, data parsing and evaluation
# excluded), samples/s, P@1 on the test file and peak RSS. bench/slide.md has measured runs.
#
# Nothing of SLIDE is part of hslide: pass your own clones. Both variants also need cnpy
# (https://github.com/rogersce/cnpy: cnpy.h + cnpy.cpp, built here with the system zlib).
#
# What each variant needs:
#   original   g++ and make; its Makefile (SLIDE/Makefile) is used as is, with the compiler
#              names (g++-7/gcc-7) mapped to the host's g++/gcc through a shim directory and
#              the cnpy paths (/slide/cnpy) replaced on the make command line. Its flags:
#              -fno-strict-aliasing -g -O3 -fopenmp -mtune=intel -mavx2 (AVX2 CPU).
#   optimized  an AVX-512 CPU (avx512f/bw/vl; avx512_bf16 for --bf16's native conversions).
#              Its CMakeLists.txt downloads zlib and cnpy with git (ExternalProject) and sets
#              optimisation flags only for icpc (-O2 -DNDEBUG -xHost -qopt-zmm-usage=high);
#              here its SLIDE/*.cpp are compiled directly with the GCC equivalents
#              -std=c++14 -O2 -DNDEBUG -march=native -mprefer-vector-width=512 -fopenmp
#              -DOPT_IA=1 -DOPT_AVX512=1 (its AVX-512 paths; without them it builds scalar code)
#              (+ -DOPT_CPX_BF16=1 -flax-vector-conversions where the CPU has avx512_bf16:
#              its OPT_CPX_BF16 option; GCC types _mm512_cvtneps_pbh as __m256bh).
#              GCC-only adaptations, none for ICC: (1) a force-included header that
#              defines _mm512_mask_exp_ps (an SVML intrinsic that only Intel's compilers
#              provide) lane by lane with expf, and maps their aligned AVX-512 loads and
#              stores to the unaligned forms (they reach new[] arrays; GCC's aligned
#              instructions fault there, ICC emits unaligned ones); (2) in the build copy,
#              `sed` turns the out-of-class definitions `int *X::getHash<T>(...)` /
#              `getHashEasy<T>(...)` (DensifiedWtaHash.cpp, WtaHash.cpp), which ICC accepts
#              and GCC rejects as "partial specialization", into `X::getHash(...)`. And three
#              slips of prv_opt_ia HEAD 4f8993e that no compiler accepts (below). The source
#              tree is not touched.
#
# SLIDE settings that are compile-time constants in its Config.h and stay at their defaults:
# DWTA hashing (HashFunction 2), bucket size 128 (FIFO), Mode 4 (LSH candidates, labels
# added in training, random fill up to 1000 neurons when fewer than 1500 are found), bin
# size 8. The output layer's table code width is RangePow (--range-pow, 18 in Config_amz.csv).
#
# Usage:
#   scripts/baselines/slide.sh --slide-dir DIR --variant original|optimized \
#       --cnpy-dir DIR --train FILE --test FILE [options]
# Options (defaults = SLIDE's Config_amz.csv): --hidden 128 --K 6 --L 50 --range-pow 18
#   --batch 128 --lr 0.0001 --epochs 2 --threads 2 --hash dwta --sparsity 0.005
#   --rehash 6400 (samples between table rebuilds; SLIDE's "Rehash")
#   --rebuild 128000 (samples between new hash functions; SLIDE's "Rebuild")
#   --eval lsh|exact (default lsh: test points scored on their LSH-retrieved neurons, SLIDE's
#       inference Sparsity = --sparsity; exact = every label, Sparsity 1 as in Config_amz.csv,
#       ~50 s per 128 test points for the original on 2 cores at 670K labels)
#   --bf16 (optimized only: Bfloat16Opt=true) --build-dir DIR (default: a temp dir; an existing
#   build is reused) --work-dir DIR (config, logs, saved weights; default: a temp dir)
#   --label NAME (first CSV column; default the variant) --no-header
# Output (stdout): label,epoch,train_seconds,epoch_seconds,samples_per_s,p_at_1,eval_points,peak_rss_mib
# SLIDE's clock is summed in whole milliseconds and logged in whole seconds, so epoch_seconds
# has a resolution of 1 s. SLIDE evaluates after every epoch on the first 50 batches of the
# test file (the whole file, in whole batches, after the last epoch) and once before training
# on 20 batches, so the test file needs at least 50 x batch points.
set -euo pipefail

die() { echo "slide.sh: $*" >&2; exit 2; }

slide_dir="" variant="" cnpy_dir="${SLIDE_CNPY_DIR:-}" train="" test=""
hidden=128 K=6 L=50 range_pow=18 batch=128 lr=0.0001 epochs=2 threads=2 hash=dwta
sparsity=0.005 rehash=6400 rebuild=128000 eval_mode=lsh bf16=0
build_dir="" work_dir="" label="" header=1

while [[ $# -gt 0 ]]; do
    opt="$1"
    case "$opt" in
        --bf16) bf16=1; shift; continue ;;
        --no-header) header=0; shift; continue ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    esac
    [[ $# -ge 2 ]] || die "$opt needs a value"
    val="$2"; shift 2
    case "$opt" in
        --slide-dir) slide_dir="$val" ;;   --variant) variant="$val" ;;
        --cnpy-dir) cnpy_dir="$val" ;;     --train) train="$val" ;;
        --test) test="$val" ;;             --hidden) hidden="$val" ;;
        --K) K="$val" ;;                   --L) L="$val" ;;
        --range-pow) range_pow="$val" ;;   --batch) batch="$val" ;;
        --lr) lr="$val" ;;                 --epochs) epochs="$val" ;;
        --threads) threads="$val" ;;       --hash) hash="$val" ;;
        --sparsity) sparsity="$val" ;;     --rehash) rehash="$val" ;;
        --rebuild) rebuild="$val" ;;       --eval) eval_mode="$val" ;;
        --build-dir) build_dir="$val" ;;   --work-dir) work_dir="$val" ;;
        --label) label="$val" ;;
        *) die "unknown option $opt (see --help)" ;;
    esac
done

[[ -n "$slide_dir" ]] || die "missing --slide-dir (a clone of keroro824/HashingDeepLearning or IntelLabs/SLIDE_opt_ia)"
[[ "$variant" == original || "$variant" == optimized ]] || die "--variant must be original or optimized"
[[ -n "$train" && -f "$train" ]] || die "missing --train FILE (or it does not exist: '$train')"
[[ -n "$test" && -f "$test" ]] || die "missing --test FILE (or it does not exist: '$test')"
[[ -n "$cnpy_dir" ]] || die "missing --cnpy-dir (a clone of rogersce/cnpy, or set SLIDE_CNPY_DIR)"
[[ -f "$cnpy_dir/cnpy.h" && -f "$cnpy_dir/cnpy.cpp" ]] || die "no cnpy.h/cnpy.cpp in --cnpy-dir $cnpy_dir"
[[ "$hash" == dwta ]] || die "--hash $hash: SLIDE fixes the hash family at compile time (Config.h HashFunction 2 = DWTA); only dwta is supported here"
[[ "$eval_mode" == lsh || "$eval_mode" == exact ]] || die "--eval must be lsh or exact"
[[ $bf16 == 0 || "$variant" == optimized ]] || die "--bf16 needs --variant optimized"
for v in hidden K L range_pow batch epochs threads rehash rebuild; do
    [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "--${v//_/-} must be a positive integer (got '${!v}')"
done
[[ -n "$label" ]] || label="$variant$([[ $bf16 == 1 ]] && echo -bf16 || true)"
[[ -d "$slide_dir/SLIDE" ]] && src="$slide_dir/SLIDE" || src="$slide_dir"
for f in main.cpp Network.cpp Layer.cpp Config.h; do
    [[ -f "$src/$f" ]] || die "no $f in $src: --slide-dir must be the repository root (with SLIDE/) or its SLIDE folder"
done
if [[ "$variant" == optimized ]]; then
    [[ -f "$src/DataLayerOpt.h" ]] || die "$src has no DataLayerOpt.h: not IntelLabs/SLIDE_opt_ia (use --variant original?)"
    for flag in avx512f avx512bw avx512vl; do
        grep -qw "$flag" /proc/cpuinfo || die "--variant optimized needs an AVX-512 CPU ($flag missing in /proc/cpuinfo)"
    done
else
    [[ -f "$src/Makefile" ]] || die "no Makefile in $src (the original SLIDE builds with make)"
    [[ ! -f "$src/DataLayerOpt.h" ]] || die "$src is the optimized SLIDE (DataLayerOpt.h): use --variant optimized"
fi
command -v g++ >/dev/null || die "g++ not found"
[[ -x /usr/bin/time ]] || die "/usr/bin/time not found (Debian package 'time'): needed for the peak RSS"
grep -q 'zlib' <(echo '#include <zlib.h>' | g++ -E -x c++ - 2>/dev/null) || die "zlib.h not found (Debian package zlib1g-dev)"

tmp_root="$(mktemp -d "${TMPDIR:-/tmp}/slide-sh.XXXXXX")"
trap 'rm -rf "$tmp_root"' EXIT
[[ -n "$build_dir" ]] || build_dir="$tmp_root/build"
[[ -n "$work_dir" ]] || work_dir="$tmp_root/work"
mkdir -p "$build_dir" "$work_dir"
build_dir="$(cd "$build_dir" && pwd)" work_dir="$(cd "$work_dir" && pwd)"

# --- data: SLIDE reads the XC layout ("N D L" header, then "l1,l2 f:v f:v ...", 0-based ids;
# the original skips the header, the optimized parses N from it). A point without labels
# would be misread by both (the first feature taken as the label list), and LibSVM files
# have no header (and 1-based features): such files are rewritten into $work_dir.
prepare() {  # prepare IN OUT -> prints "N D L" of the file SLIDE will read
    local in="$1" out="$2"
    awk -v out="$out" '
        NR == 1 && NF == 3 && $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ && $3 ~ /^[0-9]+$/ {
            hdr = 1; D = $2; Lb = $3; next }
        NR == 1 { one = 1 }
        { sub(/\r$/, "") }
        /^[ \t]*$/ { next }
        $1 ~ /:/ || /^[ \t]/ { empty++; next }
        !one { lines[++n] = $0; next }
        {   # LibSVM: 1-based features (as hslide reads them) -> SLIDE 0-based
            line = $1; m = split($1, ls, ","); for (i = 1; i <= m; i++) if (ls[i] + 1 > Lb) Lb = ls[i] + 1
            for (i = 2; i <= NF; i++) { split($i, a, ":"); if (a[1] > D) D = a[1]; line = line " " (a[1] - 1) ":" a[2] }
            lines[++n] = line }
        END {
            if (!hdr && !one) { print "ERR empty file"; exit }
            rewrite = (!hdr || empty > 0)
            if (rewrite) { print n, D, Lb > out; for (i = 1; i <= n; i++) print lines[i] > out }
            printf "%d %d %d %d %d\n", n, D, Lb, rewrite, empty + 0
        }' "$in"
}
read -r n_train d_train l_train rw_train empty_train < <(prepare "$train" "$work_dir/train.txt")
read -r n_test d_test l_test rw_test empty_test < <(prepare "$test" "$work_dir/test.txt")
[[ "$n_train" =~ ^[0-9]+$ && "$n_test" =~ ^[0-9]+$ ]] || die "could not read $train / $test as XC or LibSVM files"
[[ $rw_train == 1 ]] && train_used="$work_dir/train.txt" || train_used="$(cd "$(dirname "$train")" && pwd)/$(basename "$train")"
[[ $rw_test == 1 ]] && test_used="$work_dir/test.txt" || test_used="$(cd "$(dirname "$test")" && pwd)/$(basename "$test")"
(( empty_train + empty_test == 0 )) || echo "slide.sh: dropped points without labels: $empty_train train, $empty_test test" >&2
in_dim=$(( d_train > d_test ? d_train : d_test ))
n_labels=$(( l_train > l_test ? l_train : l_test ))
(( n_train >= batch )) || die "$train has $n_train points, fewer than one batch ($batch)"
(( n_test >= 50 * batch )) || die "$test has $n_test points; SLIDE's per-epoch evaluation reads 50 batches (needs >= $((50 * batch))): use a larger test file or a smaller --batch"
batches=$(( n_train / batch ))

# --- build -------------------------------------------------------------------------------
exe="$build_dir/runme-$variant"
if [[ ! -x "$exe" ]]; then
    echo "slide.sh: building the $variant SLIDE from $src into $build_dir" >&2
    mkdir -p "$build_dir/cnpy"
    g++ -O3 -fPIC -std=c++11 -c "$cnpy_dir/cnpy.cpp" -o "$build_dir/cnpy/cnpy.o"
    ar rcs "$build_dir/cnpy/libcnpy.a" "$build_dir/cnpy/cnpy.o"
    rm -rf "$build_dir/src-$variant"
    mkdir -p "$build_dir/src-$variant"
    cp "$src"/*.cpp "$src"/*.h "$build_dir/src-$variant/"
    if [[ "$variant" == original ]]; then
        cp "$src/Makefile" "$build_dir/src-$variant/"
        mkdir -p "$build_dir/shim"
        ln -sf "$(command -v g++)" "$build_dir/shim/g++-7"
        ln -sf "$(command -v gcc)" "$build_dir/shim/gcc-7"
        # Their flags (Makefile OPT_FLAGS etc.); only the cnpy paths differ. LIBRARY_PATH is
        # emptied because the Makefile pastes it into the link line.
        (cd "$build_dir/src-$variant" && PATH="$build_dir/shim:$PATH" make -j2 LIBRARY_PATH= \
            CXXFLAGS="-m64 -DUNIX -I$cnpy_dir -std=c++11 -fno-strict-aliasing -g -O3 -fopenmp -mtune=intel -mavx2 -I/usr/include/" \
            LIB="-fPIC -fopenmp -L$build_dir/cnpy -lcnpy -lz" >"$build_dir/build-$variant.log" 2>&1) \
            || { tail -20 "$build_dir/build-$variant.log" >&2; die "make failed (log: $build_dir/build-$variant.log)"; }
        cp "$build_dir/src-$variant/runme" "$exe"
    else
        sed -i 's/::getHashEasy<T>(/::getHashEasy(/; s/::getHash<T>(/::getHash(/' \
            "$build_dir/src-$variant"/*.cpp
        # Three slips of the prv_opt_ia HEAD (4f8993e) that no compiler accepts: a constructor
        # without the ':' before its initialiser list (DataLayerOpt.h), main.cpp's
        # MAX_BUFFER_SIZE (a cap on numLayer, defined nowhere; 16 here) and srp.cpp's memset
        # without <cstring> (the -include below). None changes what runs.
        sed -i 's/DataLayerOpt() numRecords_/DataLayerOpt() : numRecords_/' \
            "$build_dir/src-$variant/DataLayerOpt.h"
        cat >"$build_dir/svml_compat.h" <<'EOF'
/* slide.sh: _mm512_mask_exp_ps is an SVML intrinsic (Intel compilers only); lane-wise expf. */
#include <immintrin.h>
#include <math.h>
static inline __m512 _mm512_mask_exp_ps(__m512 src, __mmask16 k, __m512 a) {
  float in[16], out[16];
  _mm512_storeu_ps(in, a); _mm512_storeu_ps(out, src);
  for (int i = 0; i < 16; i++) if (k & (1u << i)) out[i] = expf(in[i]);
  return _mm512_loadu_ps(out);
}
/* slide.sh: their aligned loads and stores reach arrays from plain new[] (16-byte aligned),
   e.g. DensifiedWtaHash's _indices: GCC emits the aligned instruction, which faults there
   (Intel's compilers emit the unaligned form, which is as fast on aligned data). */
#define _mm512_load_ps(p) _mm512_loadu_ps(p)
#define _mm512_maskz_load_ps(k, p) _mm512_maskz_loadu_ps(k, p)
#define _mm512_store_ps(p, v) _mm512_storeu_ps(p, v)
#define _mm512_load_epi32(p) _mm512_loadu_si512(p)
EOF
        # OPT_IA / OPT_AVX512: without them the current prv_opt_ia HEAD builds its scalar
        # paths only (issue 20 found the earlier runs measured that).
        flags=(-std=c++14 -O2 -DNDEBUG -march=native -mprefer-vector-width=512 -fopenmp
               -DOPT_IA=1 -DOPT_AVX512=1 -DMAX_BUFFER_SIZE=16 -include cstring)
        # OPT_CPX_BF16: native fp32->bf16 conversion; GCC's _mm512_cvtneps_pbh returns
        # __m256bh where their code expects __m256i, hence -flax-vector-conversions.
        grep -qw avx512_bf16 /proc/cpuinfo && flags+=(-DOPT_CPX_BF16=1 -flax-vector-conversions)
        mkdir -p "$build_dir/obj-$variant"
        for f in "$build_dir/src-$variant"/*.cpp; do
            g++ "${flags[@]}" -I"$build_dir/src-$variant" -I"$cnpy_dir" -include "$build_dir/svml_compat.h" \
                -c "$f" -o "$build_dir/obj-$variant/$(basename "$f" .cpp).o" \
                >"$build_dir/obj-$variant/$(basename "$f" .cpp).log" 2>&1 &
            (( $(jobs -rp | wc -l) < 2 )) || wait -n || true
        done
        wait
        for f in "$build_dir/src-$variant"/*.cpp; do
            o="$build_dir/obj-$variant/$(basename "$f" .cpp)"
            [[ -f "$o.o" ]] || { grep -A3 'error' "$o.log" | head -20 >&2; die "compiling $(basename "$f") failed (log: $o.log)"; }
        done
        g++ -fopenmp -o "$exe" "$build_dir/obj-$variant"/*.o "$build_dir/cnpy/libcnpy.a" -lz \
            >"$build_dir/build-$variant.log" 2>&1 || { cat "$build_dir/build-$variant.log" >&2; die "link failed"; }
    fi
fi

# --- config (keys as in SLIDE's Config_amz.csv) ------------------------------------------
# Stepsize (batches between extra evaluations during training; 1000 in Config_amz.csv) is set
# out of reach: those evaluations are outside SLIDE's training clock and only cost wall time.
eval_sparsity=1
[[ "$eval_mode" == lsh ]] && eval_sparsity="$sparsity"
cfg="$work_dir/config.csv"
cat >"$cfg" <<EOF
RangePow = 6,$range_pow
K = 2,$K
L = 20,$L
Sparsity = 1,$sparsity,1,$eval_sparsity

Batchsize=$batch
Rehash=$rehash
Rebuild=$rebuild
InputDim=$in_dim
totRecords=$n_train
totRecordsTest=$n_test

Lr=$lr
Epoch=$epochs
Stepsize=1000000000

sizesOfLayers=$hidden,$n_labels
numLayer=2

trainData=$train_used
testData=$test_used

weight=$work_dir/savedWeight.npz
savedweight=$work_dir/savedWeight.npz

logFile=$work_dir/log.txt
EOF
# The optimized SLIDE's HEAD trains in bf16 unless told otherwise: fp32 unless --bf16.
if [[ $variant == optimized ]]; then
    if [[ $bf16 == 1 ]]; then echo "Bfloat16Opt=true" >>"$cfg"; else echo "Bfloat16Opt=0" >>"$cfg"; fi
fi
rm -f "$work_dir/log.txt"

echo "slide.sh: $label: $n_train train / $n_test test points, $in_dim -> $hidden -> $n_labels, K=$K L=$L RangePow=$range_pow batch=$batch lr=$lr epochs=$epochs threads=$threads eval=$eval_mode" >&2
# A failed run stands only if every epoch's evaluation was logged before it ended (the awk
# below counts them): prv_opt_ia HEAD aborts in its teardown ("malloc_consolidate(): unaligned
# fastbin chunk detected", after its last evaluation and weight save).
if ! (cd "$work_dir" && OMP_NUM_THREADS="$threads" /usr/bin/time -v "$exe" "$cfg" \
    >"$work_dir/stdout.txt" 2>"$work_dir/time.txt"); then
    tail -n 5 "$work_dir/stdout.txt" "$work_dir/time.txt" >&2
    echo "slide.sh: SLIDE exited abnormally (logs in $work_dir); its figures stand only if every epoch was evaluated" >&2
    trap - EXIT  # keep the logs
fi
rm -f "$work_dir/savedWeight.npz"

# --- results: log.txt has "Epoch e" and, after each evaluation, "<batches so far> <training
# seconds so far> <P@1>"; the evaluation after epoch e is the line with (e+1)*batches.
rss_kb=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$work_dir/time.txt")
[[ $header == 1 ]] && echo "label,epoch,train_seconds,epoch_seconds,samples_per_s,p_at_1,eval_points,peak_rss_mib"
awk -v label="$label" -v nb="$batches" -v bs="$batch" -v ep="$epochs" -v ntest="$n_test" -v rss="${rss_kb:-0}" '
    $1 == "Epoch" { next }
    NF == 3 && $1 > 0 && $1 % nb == 0 {
        e = $1 / nb; secs = $2 + 0; d = secs - prev; prev = secs
        pts = (e == ep) ? int(ntest / bs) * bs : 50 * bs
        printf "%s,%d,%d,%d,%.1f,%.4f,%d,%.0f\n", label, e, secs, d, (d > 0 ? nb * bs / d : 0), $3, pts, rss / 1024
        found++ }
    END { if (found != ep) { print "slide.sh: expected " ep " epoch records in log.txt, found " found + 0 > "/dev/stderr"; exit 1 } }
' "$work_dir/log.txt"
