#!/usr/bin/env bash
# Runs napkinXC (mwydmuch/napkinXC: probabilistic label trees with LIBLINEAR nodes), the tool an
# extreme-classification user on a CPU already has, on the data `hslide train` reads, and prints
# one CSV row in the columns of scripts/reproduce.sh's results.csv: P@1/3/5, train seconds,
# test seconds and peak memory. bench/peers.md has measured runs beside hslide.
#
# Nothing of napkinXC is part of hslide: pass the CLI (`nxc`) you built from your own clone
# with --nxc. The figures in bench/peers.md are of napkinXC 0.7.2, commit
# e95fb3fd505c164366d373f3f526b00d7b3e4165 (its tag 0.7.2), built with its own CMakeLists.txt
# (Release: -O3 -DNDEBUG; the CLI needs only a C++17 compiler and pthreads, nothing is
# downloaded; only its Python binding fetches pybind11). The script checks `nxc version` says
# 0.7.2 (--any-version runs another), and with --napkinxc-dir that the clone is at that commit.
#
# Usage:
#   scripts/baselines/napkinxc.sh --nxc BIN --train FILE (--test FILE | --test-split FILE)
#       [--train-split FILE] [--split-column K] [options] [-- extra `nxc train` flags]
# Data: XC files ("N D L" header, then "l1,l2 f:v ..."; CRLF line ends and points without labels
#   as in ../shared/data) or LibSVM files (no header), as `hslide train` takes them, split files
#   included (rows 1-based into --train's points, --split-column's column; --test defaults to
#   --train with --test-split). napkinXC reads one file per command and takes a first line of
#   2 or 3 fields as a header, so split rows, headerless files (whose first point could be
#   misread as one), CRLF line ends and blank lines are rewritten into --work-dir first
#   (outside the timings); clean XC files are read where they are. Feature and label ids are
#   kept as they are (napkinXC shifts features by 2 and adds its bias feature itself).
# Options:
#   --threads N (2)       `nxc -t`, for training and testing
#   --seed N (1)          `nxc --seed` (napkinXC's default seed is the clock: its k-means tree
#                         would differ run to run)
#   --eval-max N (0)      test on the first N test points only (0 = all)
#   --label NAME          the config column (default napkinxc)
#   --metrics-out FILE    also append the run as one record of hslide's --metrics-out schema
#                         (what scripts/reproduce.sh's report reads; loss null, epoch 1)
#   --work-dir DIR        model, logs and rewritten data (default: a temp dir, removed)
#   --napkinxc-dir DIR    the clone --nxc was built from: its HEAD must be the pinned commit
#   --any-version         run a napkinXC other than 0.7.2 (the revision column says which)
#   --no-header           no CSV header line
#   --prepare-only DIR    only write the files napkinXC would read into DIR and print
#                         "train|test PATH POINTS" (no --nxc needed; the tests use it)
#   -- FLAGS              passed to `nxc train` (the tuned setting in bench/peers.md:
#                         -- --arity 16 -C 16)
# Output (stdout): the results.csv columns (config,backend,precision,isa,epoch,train_seconds,
#   wall_seconds,epoch_seconds,samples_per_s,loss,p@1,p@3,p@5,peak_rss_bytes,peak_gpu_bytes,
#   stage_*,eval_seconds,eval_points,cpu,gpu,revision): train_seconds = epoch_seconds =
#   napkinXC's "Train real time" (its clock from the data read to the model saved: reading the
#   file excluded, as hslide's epoch time excludes parsing); wall_seconds = the whole `nxc train`
#   command; eval_seconds = napkinXC's "Test real time" (test file read and prediction, model
#   load excluded); peak_rss_bytes = the larger of the two commands' peak RSS (/usr/bin/time -v,
#   or the GNU time $TIME_BIN names).
#   stderr's summary line (and --metrics-out's train_cpu_seconds) adds napkinXC's "Train CPU
#   time": on a loaded machine the steadier figure.
# Exit code 2 for bad input, with a message naming the file and the reason.
set -euo pipefail

die() { echo "napkinxc.sh: $*" >&2; exit 2; }

time_bin=${TIME_BIN:-/usr/bin/time}  # GNU time (gpu_check.sh packs one for the GPU machine)

pinned_version=0.7.2
pinned_commit=e95fb3fd505c164366d373f3f526b00d7b3e4165

nxc="" train="" test="" train_split="" test_split="" split_column=1 threads=2 seed=1 eval_max=0
label=napkinxc metrics_out="" work_dir="" napkinxc_dir="" any_version=0 header=1 prepare_only=""
extra=()

while [[ $# -gt 0 ]]; do
    opt="$1"
    case "$opt" in
        --no-header) header=0; shift; continue ;;
        --any-version) any_version=1; shift; continue ;;
        --) shift; extra=("$@"); break ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    esac
    [[ $# -ge 2 && -n "$2" ]] || die "$opt needs a value"
    val="$2"; shift 2
    case "$opt" in
        --nxc) nxc="$val" ;;                      --train) train="$val" ;;
        --test) test="$val" ;;                    --train-split) train_split="$val" ;;
        --test-split) test_split="$val" ;;        --split-column) split_column="$val" ;;
        --threads) threads="$val" ;;              --seed) seed="$val" ;;
        --eval-max) eval_max="$val" ;;            --label) label="$val" ;;
        --metrics-out) metrics_out="$val" ;;      --work-dir) work_dir="$val" ;;
        --napkinxc-dir) napkinxc_dir="$val" ;;
        --prepare-only) prepare_only="$val" ;;    # tests: write the files napkinXC would read
        *) die "unknown option $opt (see --help)" ;;
    esac
done

for v in threads split_column; do
    [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "--${v//_/-} must be a positive integer (got '${!v}')"
done
for v in seed eval_max; do
    [[ "${!v}" =~ ^[0-9]+$ ]] || die "--${v//_/-} must be a non-negative integer (got '${!v}')"
done
[[ -n "$train" ]] || die "missing --train FILE"
[[ -f "$train" ]] || die "$train: no such file (--train)"
[[ -n "$test" || -n "$test_split" ]] || die "missing --test FILE (or --test-split FILE)"
[[ -n "$test" ]] || test="$train"
[[ -f "$test" ]] || die "$test: no such file (--test)"
for f in "$train_split" "$test_split"; do [[ -z "$f" || -f "$f" ]] || die "$f: no such split file"; done
[[ "$label" =~ ^[A-Za-z0-9_.:@+-]+$ ]] || die "--label must be a plain name (got '$label')"

if [[ -z "$prepare_only" ]]; then
    [[ -n "$nxc" ]] || die "missing --nxc BIN (napkinXC's CLI, built from your clone; see --help)"
    [[ -x "$nxc" ]] || die "$nxc: not an executable (--nxc)"
    [[ -x $time_bin ]] || die "$time_bin not found (Debian package 'time'; \$TIME_BIN names another GNU time): needed for the peak RSS"
    version="$("$nxc" version 2>/dev/null | sed -n 's/^napkinXC \([^ ]*\)$/\1/p')"
    [[ -n "$version" ]] || die "$nxc: 'nxc version' did not print 'napkinXC <version>': not napkinXC's CLI?"
    [[ "$version" == "$pinned_version" || $any_version == 1 ]] ||
        die "$nxc is napkinXC $version; the pinned one is $pinned_version (commit $pinned_commit); --any-version runs it anyway"
    revision="napkinXC $version"
    if [[ -n "$napkinxc_dir" ]]; then
        head="$(git -C "$napkinxc_dir" rev-parse HEAD 2>/dev/null)" || die "$napkinxc_dir: not a git clone (--napkinxc-dir)"
        [[ "$head" == "$pinned_commit" || $any_version == 1 ]] ||
            die "$napkinxc_dir is at $head, not the pinned commit $pinned_commit (napkinXC $pinned_version)"
        revision+=" ${head:0:12}"
    fi
fi

tmp_root="$(mktemp -d "${TMPDIR:-/tmp}/napkinxc-sh.XXXXXX")"
trap 'rm -rf "$tmp_root"' EXIT
[[ -n "$prepare_only" ]] && work_dir="$prepare_only"
[[ -n "$work_dir" ]] || work_dir="$tmp_root/work"
mkdir -p "$work_dir"
work_dir="$(cd "$work_dir" && pwd)"

# --- data --------------------------------------------------------------------------------------
# prepare IN OUT [SPLIT] [MAX]: prints the path napkinXC should read and its point count. One
# awk pass checks every line (bad ids stop with file, line and reason), reads the split rows
# first (file 1) and writes the selected points to OUT.body; the header "N D L" goes in front
# (D and L: the largest ids + 1, or the header's if larger). IN itself is read where it is a
# clean XC file used whole (header with the right count, LF, no blank lines).
prepare() {
    local in="$1" out="$2" split="${3:-}" max="${4:-0}"
    local first has_header=0
    first="$(head -n 1 "$in" | tr -d '\r')"
    [[ "$first" =~ ^[0-9]+\ [0-9]+\ [0-9]+$ ]] && has_header=1
    awk -v out="$out.body" -v hdr="$has_header" -v col="$split_column" -v max="$max" \
        -v split_name="$split" -v data_name="$in" '
        function fail(msg) { print "napkinxc.sh: " msg > "/dev/stderr"; bad = 1; exit 2 }
        FNR == 1 { file++ }
        split_name != "" && file == 1 {
            sub(/\r$/, "")
            if ($0 ~ /^[ \t]*$/) next
            if (NF < col) fail(split_name ": line " FNR ": " NF " columns, --split-column is " col)
            if ($col !~ /^[0-9]+$/ || $col < 1) fail(split_name ": line " FNR ": row \"" $col "\" is not a 1-based row number")
            want[$col + 0] = ++nwant; order[nwant] = $col + 0; next }
        {   if (sub(/\r$/, "")) crlf = 1
            if (FNR == 1 && hdr) { N = $1; D = $2; L = $3; next }
            if ($0 ~ /^[ \t]*$/) { blank = 1; next }
            row++
            if (split_name != "" && !(row in want)) next
            if (split_name == "" && max > 0 && kept >= max) next
            # ids: labels are the first field when it has no ":"; features are "id:value".
            start = 1
            if ($0 !~ /^[ \t]/ && $1 !~ /:/) {
                m = split($1, ls, ",")
                for (i = 1; i <= m; i++) {
                    if (ls[i] !~ /^[0-9]+$/) fail(data_name ": line " FNR ": label \"" ls[i] "\" is not a non-negative integer")
                    if (ls[i] + 1 > L) L = ls[i] + 1 }
                start = 2 }
            for (i = start; i <= NF; i++) {
                if (split($i, a, ":") != 2 || a[1] !~ /^[0-9]+$/) fail(data_name ": line " FNR ": \"" $i "\" is not a feature id:value pair")
                if (a[1] + 1 > D) D = a[1] + 1 }
            kept++
            if (split_name != "") lines[want[row]] = $0; else print > out }
        END {
            if (bad) exit 2
            if (split_name != "") {
                for (i = 1; i <= nwant; i++) {
                    if (!(i in lines)) { print "napkinxc.sh: " split_name ": row " order[i] " is past the " row " points of " data_name > "/dev/stderr"; exit 2 }
                    if (max > 0 && i > max) break
                    print lines[i] > out }
                kept = (max > 0 && nwant > max) ? max : nwant }
            close(out)
            clean = hdr && !crlf && !blank && split_name == "" && kept == row && N == kept
            print kept, D + 0, L + 0, clean + 0 }' ${split:+"$split"} "$in" >"$out.counts" ||
        { rm -f "$out.body" "$out.counts"; exit 2; }
    local n d l clean
    read -r n d l clean <"$out.counts"
    rm -f "$out.counts"
    (( n > 0 )) || die "$in: no points${split:+ selected by $split}"
    if [[ $clean == 1 ]]; then rm -f "$out.body"; echo "$in $n"; return; fi
    { echo "$n $d $l"; cat "$out.body"; } >"$out"
    rm -f "$out.body"
    echo "$out $n"
}
read -r train_used n_train < <(prepare "$train" "$work_dir/train.txt" "$train_split" 0) || exit 2
[[ -n "${n_train:-}" ]] || exit 2
read -r test_used n_test < <(prepare "$test" "$work_dir/test.txt" "$test_split" "$eval_max") || exit 2
[[ -n "${n_test:-}" ]] || exit 2
if [[ -n "$prepare_only" ]]; then
    echo "train $train_used $n_train"
    echo "test $test_used $n_test"
    exit 0
fi

# --- train and test ----------------------------------------------------------------------------
model="$work_dir/model"
rm -rf "$model"
echo "napkinxc.sh: $label: napkinXC $version, $n_train train / $n_test test points, -t $threads --seed $seed ${extra[*]}" >&2
run_timed() {  # run_timed NAME CMD...: stdout+stderr to NAME.log, /usr/bin/time -v to NAME.time
    local name="$1"; shift
    local t0 t1
    t0=$(date +%s.%N)
    if ! "$time_bin" -v -o "$work_dir/$name.time" "$@" >"$work_dir/$name.log" 2>&1; then
        tail -n 15 "$work_dir/$name.log" >&2
        trap - EXIT
        die "nxc $name failed (logs in $work_dir)"
    fi
    t1=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f\n", b - a }' >"$work_dir/$name.wall"
}
run_timed train "$nxc" train -i "$train_used" -o "$model" -t "$threads" --seed "$seed" "${extra[@]}"
# --metricsPrecision: 0.7.2 leaves it uninitialised (its help says 5; the metrics came out
# rounded to 1 digit here), and the test times after it are printed at the same precision.
run_timed test "$nxc" test -i "$test_used" -o "$model" -t "$threads" --metrics p@1,p@3,p@5 \
    --metricsPrecision 6

field() {  # field FILE 'label text': the number after "label text: "
    sed -n "s/^[[:space:]]*$2: *\([-0-9.eE+naif]*\)[[:space:]]*\$/\1/p" "$1" | tail -n 1
}
train_s="$(field "$work_dir/train.log" 'Train real time (s)')"
test_s="$(field "$work_dir/test.log" 'Test real time (s)')"
train_cpu="$(field "$work_dir/train.log" 'Train CPU time (s)')"
p1="$(field "$work_dir/test.log" 'P@1')" p3="$(field "$work_dir/test.log" 'P@3')" p5="$(field "$work_dir/test.log" 'P@5')"
for v in train_s test_s train_cpu p1 p3 p5; do
    [[ -n "${!v}" ]] || { trap - EXIT; die "no $v in napkinXC's output (logs in $work_dir): another napkinXC version?"; }
done
rss_train=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$work_dir/train.time")
rss_test=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$work_dir/test.time")
peak_rss=$(( (rss_train > rss_test ? rss_train : rss_test) * 1024 ))
wall_train="$(cat "$work_dir/train.wall")"
cpu="$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"
samples_per_s="$(awk -v n="$n_train" -v s="$train_s" 'BEGIN { printf "%.1f", (s > 0 ? n / s : 0) }')"

csv_quote() { local s="${1//\"/\"\"}"; [[ "$s" == *[,\"]* ]] && s="\"$s\""; printf '%s' "$s"; }
if [[ $header == 1 ]]; then
    echo "config,backend,precision,isa,epoch,train_seconds,wall_seconds,epoch_seconds,samples_per_s,loss,p@1,p@3,p@5,peak_rss_bytes,peak_gpu_bytes,stage_hashing,stage_rebuild,stage_active_sets,stage_forward,stage_backward,stage_update,stage_transfer,eval_seconds,eval_points,cpu,gpu,revision"
fi
echo "$label,napkinxc,,,1,$train_s,$wall_train,$train_s,$samples_per_s,,$p1,$p3,$p5,$peak_rss,,,,,,,,,$test_s,$n_test,$(csv_quote "$cpu"),none,$(csv_quote "$revision")"
echo "napkinxc.sh: $label: P@1 $p1 P@3 $p3 P@5 $p5, train $train_s s (command $wall_train s, CPU $train_cpu s), test $test_s s, peak RSS $((peak_rss / 1048576)) MiB" >&2
if [[ -n "$metrics_out" ]]; then
    printf '{"backend":"napkinxc","epoch":1,"seconds":%s,"epoch_seconds":%s,"samples_per_s":%s,"loss":null,"train_cpu_seconds":%s,"peak_rss_bytes":%s,"stage_seconds":{},"p@1":%s,"p@3":%s,"p@5":%s,"eval_seconds":%s,"eval_points":%s,"revision":"%s","args":"%s"}\n' \
        "$wall_train" "$train_s" "$samples_per_s" "$train_cpu" "$peak_rss" "$p1" "$p3" "$p5" "$test_s" "$n_test" \
        "$revision" "-t $threads --seed $seed ${extra[*]}" >>"$metrics_out"
fi
