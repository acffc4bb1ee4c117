#!/usr/bin/env bash
# ctest `napkinxc_script`: scripts/baselines/napkinxc.sh, the napkinXC peer. Always: bad input
# stops with exit code 2 and a message naming the file and reason, and the files it hands
# napkinXC (--prepare-only) are exactly the points `hslide train` would read (split rows in
# the split file's order, CRLF and blank lines dropped, points without labels kept, a header
# "N D L" where the file had none, --eval-max's first points). Where $NAPKINXC names napkinXC's
# CLI: a run on the tiny preset prints one results.csv row with numbers that parse, its
# --metrics-out record, and scripts/reproduce.sh reports a napkinxc configuration beside cpu.
#
# Usage: tests/test_napkinxc.sh HSLIDE_BINARY
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
hslide="$(realpath "${1:?usage: test_napkinxc.sh HSLIDE_BINARY}")"
script="$root/scripts/baselines/napkinxc.sh"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
fail() { echo "FAIL: $*"; exit 1; }

# --- data the tests read: an XC file with CRLF ends, a point without labels and a blank line;
# split files (one with CRLF); a LibSVM file whose first point has two fields (napkinXC would
# take it for a header).
printf '5 10 6\r\n0,2 1:0.5 3:1\r\n 2:1\r\n\r\n4 9:0.25\r\n1 0:1\r\n5 7:2\r\n' >data.txt
printf '4 2\r\n2 1\r\n1 5\r\n' >train_split.txt
printf '3 3\n5 4\n' >test_split.txt
printf '1 3:1\n0,2 1:0.5 4:1\n3 2:1 5:1\n' >libsvm.txt

expect_error() {
    local want=$1; shift
    local rc=0
    "$script" "$@" >err.txt 2>&1 || rc=$?
    if ((rc != 2)) || ! grep -qF -- "$want" err.txt; then
        echo "FAIL: napkinxc.sh $* exited $rc, expected 2 with '$want':"; cat err.txt; exit 1
    fi
}
expect_error "missing --train" --test data.txt --prepare-only p
expect_error "missing.txt: no such file (--train)" --train missing.txt --test data.txt --prepare-only p
expect_error "missing --test" --train data.txt --prepare-only p
expect_error "train_split.txt: line 1: 2 columns, --split-column is 3" \
    --train data.txt --train-split train_split.txt --test-split test_split.txt --split-column 3 --prepare-only p
printf '9\n' >far_split.txt
expect_error "far_split.txt: row 9 is past the 5 points of data.txt" --train data.txt --test-split far_split.txt --prepare-only p
printf '0\n' >zero_split.txt
expect_error "zero_split.txt: line 1: row \"0\" is not a 1-based row number" --train data.txt --test-split zero_split.txt --prepare-only p
printf '1 2 3\nx 1:2\n' >bad_label.txt
expect_error "bad_label.txt: line 2: label \"x\" is not a non-negative integer" --train bad_label.txt --test data.txt --prepare-only p
printf '1 2:3:4\n' >bad_feature.txt
expect_error "bad_feature.txt: line 1: \"2:3:4\" is not a feature id:value pair" --train bad_feature.txt --test data.txt --prepare-only p
expect_error "--threads must be a positive integer" --train data.txt --test data.txt --threads 0 --prepare-only p
expect_error "unknown option --epochs" --train data.txt --test data.txt --epochs 3
expect_error "missing --nxc" --train data.txt --test data.txt
expect_error "nosuch: not an executable (--nxc)" --nxc nosuch --train data.txt --test data.txt
expect_error "did not print 'napkinXC <version>'" --nxc /bin/true --train data.txt --test data.txt
! ls p 2>/dev/null | grep -E '\.(body|counts)$' || fail "a failed run left its scratch files"

# --- what napkinXC reads --------------------------------------------------------------------
check_file() {  # check_file FILE EXPECTED
    local got
    got="$(cat -A "$1")"
    [[ "$got" == "$(printf '%s' "$2" | cat -A)" ]] || { echo "FAIL: $1 is"; cat -A "$1"; echo "expected"; printf '%s' "$2" | cat -A; exit 1; }
}
"$script" --train data.txt --train-split train_split.txt --test-split test_split.txt \
    --prepare-only p1 >p1.txt
grep -qx "train $tmp/p1/train.txt 3" p1.txt && grep -qx "test $tmp/p1/test.txt 2" p1.txt || { cat p1.txt; fail "counts"; }
check_file p1/train.txt $'3 10 6\n1 0:1\n 2:1\n0,2 1:0.5 3:1\n'
check_file p1/test.txt $'2 10 6\n4 9:0.25\n5 7:2\n'
# Column 2, and --eval-max 1 (the split's first row).
"$script" --train data.txt --train-split train_split.txt --test-split test_split.txt \
    --split-column 2 --eval-max 1 --prepare-only p2 >/dev/null
check_file p2/train.txt $'3 10 6\n 2:1\n0,2 1:0.5 3:1\n5 7:2\n'
check_file p2/test.txt $'1 10 6\n4 9:0.25\n'
# LibSVM: a header from the largest ids; the ids themselves unchanged.
"$script" --train libsvm.txt --test libsvm.txt --eval-max 2 --prepare-only p3 >/dev/null
check_file p3/train.txt $'3 6 4\n1 3:1\n0,2 1:0.5 4:1\n3 2:1 5:1\n'
check_file p3/test.txt $'2 5 3\n1 3:1\n0,2 1:0.5 4:1\n'
# A clean XC file (LF, header count right, no blank lines) is read where it is.
"$hslide" gen --preset tiny --scale 0.05 --out tiny -q
"$script" --train tiny/train.txt --test tiny/test.txt --prepare-only p4 >p4.txt
grep -qx "train tiny/train.txt $(($(wc -l <tiny/train.txt) - 1))" p4.txt || { cat p4.txt; fail "clean XC file rewritten"; }
[[ ! -e p4/train.txt ]] || fail "clean XC file copied"

if [[ -z "${NAPKINXC:-}" ]]; then
    echo "napkinxc_script: \$NAPKINXC is not set: the runs of napkinXC itself are not tested"
    exit 0
fi

# --- napkinXC itself ------------------------------------------------------------------------
"$hslide" gen --preset tiny --scale 1 --out tiny1 -q
"$script" --nxc "$NAPKINXC" --train tiny1/train.txt --test tiny1/test.txt --metrics-out m.jsonl \
    -- --arity 16 >run.csv
/usr/bin/python3 - run.csv m.jsonl "$(($(wc -l <tiny1/test.txt) - 1))" <<'PY'
import csv, json, math, sys
rows = list(csv.DictReader(open(sys.argv[1])))
def fail(msg):
    print("FAIL:", msg); sys.exit(1)
if len(rows) != 1:
    fail(f"{len(rows)} rows, expected 1")
r = rows[0]
want = ["config", "backend", "precision", "isa", "epoch", "train_seconds", "wall_seconds",
        "epoch_seconds", "samples_per_s", "loss", "p@1", "p@3", "p@5", "peak_rss_bytes",
        "peak_gpu_bytes"] + ["stage_" + s for s in ["hashing", "rebuild", "active_sets", "forward",
        "backward", "update", "transfer"]] + ["eval_seconds", "eval_points", "cpu", "gpu", "revision"]
if list(r) != want:
    fail(f"columns {list(r)}")
for k in ["train_seconds", "wall_seconds", "eval_seconds"]:
    if not (0 < float(r[k]) < 600):
        fail(f"{k} = {r[k]}")
if float(r["wall_seconds"]) < float(r["train_seconds"]):
    fail("the command took less than its training")
p = [float(r[k]) for k in ["p@1", "p@3", "p@5"]]
if not all(0 <= x <= 1 for x in p) or p[0] < 0.05:
    fail(f"P@k {p}: tiny is learnable")
if int(r["eval_points"]) != int(sys.argv[3]) or int(r["peak_rss_bytes"]) < 1 << 20:
    fail(f"eval_points {r['eval_points']}, peak {r['peak_rss_bytes']}")
m = [json.loads(l) for l in open(sys.argv[2])]
if len(m) != 1 or m[0]["p@1"] != p[0] or m[0]["epoch_seconds"] != float(r["train_seconds"]) \
        or "--arity 16" not in m[0]["args"]:
    fail(f"--metrics-out {m}")
PY

# reproduce.sh: a napkinxc configuration beside hslide's cpu one (same files).
"$root/scripts/reproduce.sh" --train tiny1/train.txt --test tiny1/test.txt --preset tiny \
    --epochs 1 --threads 2 --configs "cpu napkinxc" --napkinxc "$NAPKINXC" --hslide "$hslide" \
    --out rep >rep.log 2>&1 || { cat rep.log; fail "reproduce.sh with napkinxc"; }
grep -q '^napkinxc,napkinxc,,,1,' rep/results.csv || { cat rep/results.csv; fail "no napkinxc row in results.csv"; }
grep -q '^| napkinxc | 1 |' rep/report.md || fail "no napkinxc row in report.md"
rc=0
"$root/scripts/reproduce.sh" --preset tiny --configs "napkinxc@2" --napkinxc "$NAPKINXC" \
    --hslide "$hslide" --out bad >err.txt 2>&1 || rc=$?
((rc == 2)) && grep -q "napkinXC takes no precision, ISA or @EPOCHS" err.txt || { cat err.txt; fail "napkinxc@2 accepted"; }
echo "napkinxc_script: passed (with $("$NAPKINXC" version))"
