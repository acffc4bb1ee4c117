#!/usr/bin/env bash
# ctest `mpi_ranks`: `hslide train` under mpirun with its output layer sharded across 2 ranks
# (issue 32), against one process: on the tiny synthetic preset (always) and on Bibtex (when
# ../shared/data has it), dense and top-k searched exactly, the same P@1 to four digits and the
# same losses (1e-5 relative) every epoch, the replicated layers' checksums the same on both
# ranks (the backend compares them at every epoch's end; --log-level debug shows it), unequal
# shares (--shard-weights 3,1); only rank 0 writes --metrics-out and prints epochs, its records
# holding every rank's output-layer bytes (half the one process's each), peak memory and
# communication. Failures:
# one rank given a missing file, or ranks given different seeds, make both exit non-zero within
# 10 s, naming the rank or the setting; other backends and catch-up Adam of an LSH output layer
# are refused by name. IVF (an index per rank over its rows) and LSH (tables per rank): the last
# epoch's P@1 within 0.01 of one process's on Bibtex. Sharded
# checkpoints (--save: a file per rank and a manifest) resume under 2 ranks to the
# uninterrupted run's epoch, bit for bit; under 3 ranks, in one process, or from files of
# different saves they are refused. `hslide eval|predict` score a sharded checkpoint alike under
# 2 ranks, 3 ranks and in one process; one rank given a missing model makes both exit.
# In-process tests of the same code (weights, bytes per rank): tests/test_shard.cpp.
#
# Usage: tests/test_mpi.sh HSLIDE_BINARY HAVE_MPI(ON|OFF) SHARED_DATA_DIR
# Exit 77 (skipped) when hslide was built without MPI or mpirun is missing.
set -euo pipefail
hslide="$(realpath "${1:?usage: test_mpi.sh HSLIDE_BINARY HAVE_MPI SHARED_DATA_DIR}")"
have_mpi="${2:?}"
shared="${3:-}"
if [[ $have_mpi != ON ]]; then
    echo "mpi_ranks skipped: hslide was built without MPI (HSLIDE_MPI; needs libopenmpi-dev)"
    exit 77
fi
if ! command -v mpirun >/dev/null; then
    echo "mpi_ranks skipped: no mpirun on PATH (Debian's openmpi-bin)"
    exit 77
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
fail() {
    echo "FAIL: $*"
    exit 1
}
# Two ranks on a shared machine: one thread each, and ranks that yield while they wait.
export OMPI_MCA_mpi_yield_when_idle=1
mpi2=(mpirun --oversubscribe -np 2)

# epochs_of FILE: "epoch p@1 loss" per record of a --metrics-out file.
epochs_of() {
    python3 -c '
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(r["epoch"], "%.4f" % r["p@1"], repr(r["loss"]))' "$1"
}

# same_run NAME ARGS...: trains with ARGS as one process and as 2 ranks; the epochs' P@1 must
# agree to four digits and the losses within 1e-5 relative (each scores its weight average, the
# default, as ranks keep it too).
same_run() {
    local name=$1
    shift
    timeout 300 "$hslide" train "$@" --metrics-out "one_$name.jsonl" >"one_$name.log" 2>&1 ||
        fail "$name: one process failed: $(tail -5 "one_$name.log")"
    timeout 300 "${mpi2[@]}" "$hslide" train "$@" --log-level debug \
        --metrics-out "two_$name.jsonl" >"two_$name.log" 2>&1 ||
        fail "$name: 2 ranks failed: $(tail -20 "two_$name.log")"
    grep -q "2 ranks (MPI" "two_$name.log" || fail "$name: the run did not say it had 2 MPI ranks"
    grep -q "the replicated layers are the same on all 2 ranks (checksum" "two_$name.log" ||
        fail "$name: no checksum comparison in the log"
    local epochs
    epochs=$(grep -c '^epoch ' "two_$name.log")
    [[ $epochs -eq 3 ]] || fail "$name: $epochs epoch lines printed (rank 0 alone prints 3)"
    [[ $(wc -l <"two_$name.jsonl") -eq 3 ]] || fail "$name: --metrics-out has other than 3 records"
    paste <(epochs_of "one_$name.jsonl") <(epochs_of "two_$name.jsonl") | while read -r e1 p1 l1 e2 p2 l2; do
        [[ $e1 == "$e2" && $p1 == "$p2" ]] ||
            fail "$name: epoch $e1: P@1 $p1 with one process, $p2 with 2 ranks"
        python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(abs(a - b) > 1e-5 * abs(a))" "$l1" "$l2" ||
            fail "$name: epoch $e1: loss $l1 with one process, $l2 with 2 ranks"
    done
    # Rank 0's records hold every rank's memory and traffic: each rank's output-layer bytes are
    # its rows' share of the one process's (equal shares: half, within a row's), and both ranks
    # received the same bytes.
    python3 - "one_$name.jsonl" "two_$name.jsonl" <<'PY' || fail "$name: the records' per-rank figures"
import json, sys
one = [json.loads(l) for l in open(sys.argv[1])]
two = [json.loads(l) for l in open(sys.argv[2])]
whole = one[-1]["output_layer_bytes"]
for r in two:
    ranks = r["ranks"]
    assert len(ranks) == 2, ranks
    rows = ranks[1]["output_rows"][1]
    row_bytes = whole // rows
    equal = abs(ranks[0]["output_rows"][1] - rows / 2) <= 1
    for f in ranks:
        share = f["output_layer_bytes"]
        first, end = f["output_rows"]
        assert share == row_bytes * (end - first), (share, whole, f)
        assert not equal or abs(share - whole / 2) <= row_bytes, (share, whole, row_bytes)
        assert f["peak_rss_bytes"] > 0
        c = f["communication"]
        assert c["bytes"] > 0 and c["steps"] > 0 and c["seconds"] >= 0, c
        assert abs(c["bytes_per_step"] - c["bytes"] / c["steps"]) < 1e-6, c
    assert ranks[0]["communication"]["bytes"] == ranks[1]["communication"]["bytes"]
    assert sum(f["output_layer_bytes"] for f in ranks) == whole
    assert "ranks" not in one[-1] and "communication" not in one[-1]
PY
    echo "ok: $name: $(epochs_of "two_$name.jsonl" | tr '\n' ' ')"
}

# close_run NAME WITHIN ARGS...: trains with ARGS as one process and as 2 ranks (an approximate
# selection: IVF, LSH); the last epoch's P@1 must agree within WITHIN, the replicas' checksums too.
close_run() {
    local name=$1 within=$2
    shift 2
    timeout 300 "$hslide" train "$@" --metrics-out "one_$name.jsonl" >"one_$name.log" 2>&1 ||
        fail "$name: one process failed: $(tail -5 "one_$name.log")"
    timeout 300 "${mpi2[@]}" "$hslide" train "$@" --log-level debug \
        --metrics-out "two_$name.jsonl" >"two_$name.log" 2>&1 ||
        fail "$name: 2 ranks failed: $(tail -20 "two_$name.log")"
    grep -q "the replicated layers are the same on all 2 ranks (checksum" "two_$name.log" ||
        fail "$name: no checksum comparison in the log"
    local p1 p2
    p1=$(epochs_of "one_$name.jsonl" | tail -1 | cut -d' ' -f2)
    p2=$(epochs_of "two_$name.jsonl" | tail -1 | cut -d' ' -f2)
    python3 -c "import sys; sys.exit(abs(float(sys.argv[1]) - float(sys.argv[2])) > float(sys.argv[3]))" \
        "$p1" "$p2" "$within" ||
        fail "$name: P@1 $p1 with one process, $p2 with 2 ranks (more than $within apart)"
    echo "ok: $name: P@1 $p1 with one process, $p2 with 2 ranks"
}

"$hslide" gen --preset tiny --out tiny --no-progress -q
# Most runs here train the softmax, the loss these checks were first set at; --loss auto (the
# logistic loss on cpu ranks, as in one process) has its own runs.
tiny_logistic=(--train tiny/train.txt --test tiny/test.txt --hidden 64 --threads 1 --seed 5 --no-progress
    --label-rows all)
tiny=("${tiny_logistic[@]}" --loss softmax)
sparse=(--output-sparsity topk --top-k-search exact --top-k 16 --min-active 64)
same_run tiny_logistic_topk "${tiny_logistic[@]}" --epochs 3 "${sparse[@]}"
grep -q "logistic loss" two_tiny_logistic_topk.log ||
    fail "--loss auto on 2 cpu ranks did not train the logistic loss: $(grep 'backend:' two_tiny_logistic_topk.log)"
same_run tiny_logistic_dense "${tiny_logistic[@]}" --epochs 3 --output-sparsity dense
same_run tiny_dense "${tiny[@]}" --epochs 3 --output-sparsity dense
same_run tiny_topk "${tiny[@]}" --epochs 3 "${sparse[@]}"
same_run tiny_topk_3_1 "${tiny[@]}" --epochs 3 "${sparse[@]}" --shard-weights 3,1
grep -q "output rows per rank \[0, 375) \[375, 500)" two_tiny_topk_3_1.log ||
    fail "--shard-weights 3,1 did not give rank 0 rows [0, 375) of 500"
# auto: ranks of 2 and 1 threads (MPMD) split by their measured rates; exact top-k trains the
# one-process model whatever the split.
tiny_auto=(--train tiny/train.txt --test tiny/test.txt --hidden 64 --seed 5 --no-progress --epochs 3 --label-rows all --loss softmax
    "${sparse[@]}" --shard-weights auto)
timeout 300 mpirun --oversubscribe -np 1 "$hslide" train "${tiny_auto[@]}" --threads 2 \
    --metrics-out two_auto.jsonl : -np 1 "$hslide" train "${tiny_auto[@]}" --threads 1 \
    >two_auto.log 2>&1 ||
    fail "--shard-weights auto failed: $(tail -20 two_auto.log)"
for r in 0 1; do
    grep -q "shard-weights auto: rank $r (.*) scores .* rows a second and can spare" two_auto.log ||
        fail "--shard-weights auto: no line for rank $r in: $(cat two_auto.log)"
done
[[ $(epochs_of two_auto.jsonl | cut -d' ' -f1-2) == "$(epochs_of one_tiny_topk.jsonl | cut -d' ' -f1-2)" ]] ||
    fail "auto: P@1 $(epochs_of two_auto.jsonl | tr '\n' ' '), one process: $(epochs_of one_tiny_topk.jsonl | tr '\n' ' ')"
echo "ok: tiny_topk_auto: $(grep -o 'output rows per rank.*' two_auto.log)"
# Ranks that round differently (the scalar kernels beside this CPU's best, as a CPU rank beside a
# GPU rank): rank 0's replicated layers are copied to every rank at each epoch's end, so the
# replicas' check passes, and P@1 is one process's up to roundings.
timeout 300 mpirun --oversubscribe -np 1 "$hslide" train "${tiny[@]}" --epochs 3 "${sparse[@]}" \
    --isa scalar --log-level debug --metrics-out two_mixed.jsonl : -np 1 "$hslide" train \
    "${tiny[@]}" --epochs 3 "${sparse[@]}" >two_mixed.log 2>&1 ||
    fail "ranks of different kernels failed: $(tail -20 two_mixed.log)"
grep -q "the ranks compute the replicated layers differently (rank 0: cpu scalar fp32" two_mixed.log ||
    fail "no line saying the ranks round differently in: $(head -20 two_mixed.log)"
[[ $(grep -c "the replicated layers are the same on all 2 ranks" two_mixed.log) -ge 3 ]] ||
    fail "ranks of different kernels: the replicas were not checked every epoch"
python3 -c "import sys; sys.exit(abs(float(sys.argv[1]) - float(sys.argv[2])) > 0.02)" \
    "$(epochs_of two_mixed.jsonl | tail -1 | cut -d' ' -f2)" \
    "$(epochs_of one_tiny_topk.jsonl | tail -1 | cut -d' ' -f2)" ||
    fail "ranks of different kernels: P@1 $(epochs_of two_mixed.jsonl | tail -1), one process: $(epochs_of one_tiny_topk.jsonl | tail -1)"
echo "ok: tiny_topk_mixed_kernels: $(epochs_of two_mixed.jsonl | tr '\n' ' ')"
# Such a run saved after 2 epochs and resumed to 3 ends as the uninterrupted one, bit for bit
# (the checkpoint holds the replicas as copied at the epoch's end).
mixed() { # mixed EPOCHS ARGS...: the scalar rank beside the best one
    local epochs=$1
    shift
    timeout 300 mpirun --oversubscribe -np 1 "$hslide" train "${tiny[@]}" --epochs "$epochs" \
        "${sparse[@]}" --isa scalar "$@" : -np 1 "$hslide" train "${tiny[@]}" --epochs "$epochs" \
        "${sparse[@]}" "$@"
}
mixed 2 --save mixed_ck >mixed_save.log 2>&1 || fail "the mixed save failed: $(tail -5 mixed_save.log)"
mixed 3 --resume mixed_ck --metrics-out mixed_resumed.jsonl >mixed_resume.log 2>&1 ||
    fail "the mixed resume failed: $(tail -5 mixed_resume.log)"
[[ $(epochs_of mixed_resumed.jsonl) == "$(epochs_of two_mixed.jsonl | tail -1)" ]] ||
    fail "mixed, resumed: $(epochs_of mixed_resumed.jsonl), uninterrupted: $(epochs_of two_mixed.jsonl | tail -1)"
echo "ok: the mixed run resumed: $(epochs_of mixed_resumed.jsonl)"
# The tiny preset's P@1 climbs 0.3 in 3 epochs: a looser bound there; Bibtex's is the issue's.
close_run tiny_lsh 0.05 "${tiny[@]}" --epochs 3 --output-sparsity lsh --min-active 64
# IVF: each rank's index is another selection, which moves 3 epochs' P@1 by up to 0.2 either way
# (seeds 1-6, 2 of 8 clusters probed); at 8 epochs, near the plateau, by at most 0.018.
close_run tiny_ivf 0.05 "${tiny[@]}" --epochs 8 --output-sparsity topk --top-k-search ivf --top-k 16 \
    --min-active 64 --ivf-clusters 8 --ivf-probes 2

if [[ -n $shared && -f $shared/bibtex/Bibtex_data.txt ]]; then
    b=$shared/bibtex
    # Hidden 256, the width issue 32's check was set at (--hidden auto is 512 at 159 labels:
    # there the sums' other order across ranks flipped one of the 2,515 test points by epoch 3).
    bibtex=(--train "$b/Bibtex_data.txt" --train-split "$b/bibtex_trSplit.txt"
        --test-split "$b/bibtex_tstSplit.txt" --epochs 3 --threads 1 --seed 1 --no-progress
        --loss softmax --hidden 256)
    same_run bibtex_dense "${bibtex[@]}" --output-sparsity dense
    same_run bibtex_topk "${bibtex[@]}" --output-sparsity topk --top-k-search exact --top-k 16 \
        --min-active 48
    close_run bibtex_lsh 0.01 "${bibtex[@]}" --output-sparsity lsh --min-active 48
    close_run bibtex_ivf 0.01 "${bibtex[@]}" --output-sparsity topk --top-k-search ivf --top-k 16 \
        --min-active 48 --ivf-clusters 8 --ivf-probes 2
else
    echo "note: Bibtex runs skipped: $shared/bibtex not found"
fi

# Sharded checkpoints: 2 epochs saved, then resumed to 3, end where 3 epochs in one run end (bit
# for bit: the same loss and P@1 to the last digit).
"${mpi2[@]}" "$hslide" train "${tiny[@]}" "${sparse[@]}" --epochs 2 --save ck >save.log 2>&1 ||
    fail "the sharded save failed: $(tail -5 save.log)"
for f in ck ck.rank0-of-2 ck.rank1-of-2; do [[ -s $f ]] || fail "--save wrote no $f"; done
grep -q '"hslide_sharded_checkpoint"' ck || fail "ck is not a manifest: $(head -c 200 ck)"
cp ck.rank1-of-2 epoch2.rank1
"${mpi2[@]}" "$hslide" train "${tiny[@]}" "${sparse[@]}" --epochs 3 --resume ck \
    --metrics-out resumed.jsonl >resume.log 2>&1 || fail "the sharded resume failed: $(tail -5 resume.log)"
[[ $(wc -l <resumed.jsonl) -eq 1 ]] || fail "the resumed run has other than one epoch's record"
[[ $(epochs_of resumed.jsonl) == "$(epochs_of two_tiny_topk.jsonl | tail -1)" ]] ||
    fail "resumed: $(epochs_of resumed.jsonl), uninterrupted: $(epochs_of two_tiny_topk.jsonl | tail -1)"
echo "ok: sharded checkpoint resumed: $(epochs_of resumed.jsonl)"

# Scoring the sharded checkpoint (2 epochs): `hslide eval` under 2 ranks (each its own file), 3
# ranks (equal shares, read across the files) and one process (the model assembled whole) prints
# the same metrics, rank 0 alone, those the run printed after epoch 2; `predict` writes the same
# labels and scores.
score=(--model ck --threads 1 --no-progress)
"$hslide" eval "${score[@]}" --test tiny/test.txt --metrics-out eval_one.jsonl >eval_one.log 2>&1 ||
    fail "eval of the sharded checkpoint in one process failed: $(tail -5 eval_one.log)"
grep -q "assembled whole" eval_one.log || fail "one process did not say it assembled the model"
for n in 2 3; do
    mpirun --oversubscribe -np $n "$hslide" eval "${score[@]}" --test tiny/test.txt \
        --metrics-out "eval_$n.jsonl" >"eval_$n.log" 2>&1 ||
        fail "eval of the sharded checkpoint under $n ranks failed: $(tail -5 "eval_$n.log")"
    [[ $(grep -c '^P@1' "eval_$n.log") -eq 1 ]] || fail "eval under $n ranks: not one metrics line"
    [[ $(grep '^P@1' "eval_$n.log") == "$(grep '^P@1' eval_one.log)" ]] ||
        fail "eval: $(grep '^P@1' "eval_$n.log") under $n ranks, $(grep '^P@1' eval_one.log) in one process"
    [[ $(wc -l <"eval_$n.jsonl") -eq 1 ]] || fail "eval under $n ranks: other than one --metrics-out record"
done
grep -q "output rows per rank \[0, 166) \[166, 333) \[333, 500)" eval_3.log ||
    fail "eval under 3 ranks did not split the rows equally"
trained_p1=$(epochs_of two_tiny_topk.jsonl | sed -n 2p | cut -d' ' -f2)
[[ $(grep '^P@1' eval_one.log | cut -d' ' -f2) == "$trained_p1" ]] ||
    fail "eval: P@1 $(grep '^P@1' eval_one.log | cut -d' ' -f2), the run's epoch 2: $trained_p1"
"$hslide" predict "${score[@]}" --data tiny/test.txt --out pred_one.txt >pred_one.log 2>&1 ||
    fail "predict in one process failed: $(tail -5 pred_one.log)"
"${mpi2[@]}" "$hslide" predict "${score[@]}" --data tiny/test.txt --out pred_two.txt \
    >pred_two.log 2>&1 || fail "predict under 2 ranks failed: $(tail -5 pred_two.log)"
cmp -s pred_one.txt pred_two.txt || fail "predict: 2 ranks wrote other labels than one process"
[[ $(wc -l <pred_two.txt) -eq 500 ]] || fail "predict under 2 ranks: not 500 lines"
echo "ok: sharded checkpoint scored alike by 1, 2 and 3 ranks: $(grep '^P@1' eval_one.log | cut -d' ' -f1-2)"

# expect_failure NAME PATTERN COMMAND...: exits non-zero within 10 s, its output matching PATTERN.
expect_failure() {
    local name=$1 pattern=$2
    shift 2
    local start rc=0
    start=$(date +%s.%N)
    timeout 60 "$@" >"$name.log" 2>&1 || rc=$?
    local seconds
    seconds=$(python3 -c "import sys; print('%.1f' % (float(sys.argv[2]) - float(sys.argv[1])))" \
        "$start" "$(date +%s.%N)")
    [[ $rc -ne 0 ]] || fail "$name: exited 0"
    [[ $rc -ne 124 ]] || fail "$name: hung (killed by timeout after 60 s)"
    python3 -c "import sys; sys.exit(float(sys.argv[1]) > 10)" "$seconds" ||
        fail "$name: took $seconds s to exit"
    grep -q -- "$pattern" "$name.log" || fail "$name: no '$pattern' in: $(cat "$name.log")"
    echo "ok: $name: exit $rc after $seconds s"
}
one_rank=(--train tiny/train.txt --test tiny/test.txt --hidden 64 --threads 1 --no-progress)
expect_failure missing_file "error on rank 1 of 2: missing.txt" \
    mpirun --oversubscribe -np 1 "$hslide" train "${one_rank[@]}" : \
    -np 1 "$hslide" train --train missing.txt --test tiny/test.txt --hidden 64 --threads 1 \
    --no-progress
expect_failure eval_missing_model "error on rank 1 of 2: missing.ckpt" \
    mpirun --oversubscribe -np 1 "$hslide" eval "${score[@]}" --test tiny/test.txt : \
    -np 1 "$hslide" eval --model missing.ckpt --test tiny/test.txt --threads 1 --no-progress
expect_failure other_seed "the ranks disagree on --seed (rank 0: 1, rank 1: 2)" \
    mpirun --oversubscribe -np 1 "$hslide" train "${one_rank[@]}" --seed 1 : \
    -np 1 "$hslide" train "${one_rank[@]}" --seed 2
# --loss auto (the logistic loss on cpu ranks) beside a rank given the softmax: named, not hung
# (the ranks' collective choice of auto is taken by every rank, whatever its --loss).
expect_failure other_loss "the ranks disagree on --loss" \
    mpirun --oversubscribe -np 1 "$hslide" train "${one_rank[@]}" : \
    -np 1 "$hslide" train "${one_rank[@]}" --loss softmax
expect_failure lsh_catch_up "--adam catch-up: an LSH output layer sharded" "${mpi2[@]}" \
    "$hslide" train "${one_rank[@]}" --output-sparsity lsh --adam catch-up
expect_failure dense_backend "only --backend cpu and --backend gpu" "${mpi2[@]}" "$hslide" train \
    "${one_rank[@]}" --backend cpu-dense
expect_failure no_rows "would hold none" "${mpi2[@]}" "$hslide" train "${one_rank[@]}" \
    --shard-weights 1000000,1
expect_failure other_weights "the ranks disagree on --shard-weights" \
    mpirun --oversubscribe -np 1 "$hslide" train "${one_rank[@]}" --shard-weights 3,1 : \
    -np 1 "$hslide" train "${one_rank[@]}" --shard-weights 1,1
expect_failure auto_on_one_rank "the ranks disagree on --shard-weights auto" \
    mpirun --oversubscribe -np 1 "$hslide" train "${one_rank[@]}" --shard-weights auto : \
    -np 1 "$hslide" train "${one_rank[@]}"
expect_failure resume_other_ranks "resume it with mpirun -np 2" mpirun --oversubscribe -np 3 \
    "$hslide" train "${one_rank[@]}" --epochs 3 --resume ck
expect_failure resume_one_process "sharded across MPI ranks" "$hslide" train "${one_rank[@]}" \
    --epochs 3 --resume ck
"${mpi2[@]}" "$hslide" train "${tiny[@]}" "${sparse[@]}" --epochs 3 --save ck >save3.log 2>&1 ||
    fail "the second sharded save failed: $(tail -5 save3.log)"
cp epoch2.rank1 ck.rank1-of-2  # a rank's file of another save
expect_failure resume_mixed_saves "the ranks' files are of different saves" "${mpi2[@]}" \
    "$hslide" train "${one_rank[@]}" --epochs 4 --resume ck
echo "mpi_ranks: all passed"
