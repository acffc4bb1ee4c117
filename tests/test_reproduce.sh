#!/usr/bin/env bash
# ctest `reproduce_tiny`: scripts/reproduce.sh end to end on the tiny preset with CPU
# configurations and the CPU PyTorch baseline, then checks what it wrote: results.csv and
# results.jsonl (one row per configuration and epoch, numbers that parse), report.md (the
# tables with one row per configuration), both PNGs (valid PNG files) and hardware.json; that
# bad input stops with a message and exit code 2; and that --compare puts the results beside
# those of a machine made twice as fast (a copy with every time halved) and says so.
#
# Usage: tests/test_reproduce.sh HSLIDE_BINARY
# HSLIDE_REPRO_TEST_CONFIGS replaces the configuration list, e.g.
# HSLIDE_REPRO_TEST_CONFIGS="cpu cpu-dense torch-cpu".
# Exits 77 (ctest: skipped) when Debian's python3-torch / -numpy / -matplotlib are missing.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
hslide="$(realpath "${1:?usage: test_reproduce.sh HSLIDE_BINARY}")"
python="${PYTHON:-/usr/bin/python3}"
configs="${HSLIDE_REPRO_TEST_CONFIGS:-cpu cpu:bf16 cpu-nolsh cpu-dense hybrid-cpu torch-cpu cpu@4}"
epochs=3

if ! "$python" -c 'import torch, numpy, matplotlib' 2>/dev/null; then
    echo "SKIP: $python cannot import torch, numpy and matplotlib (scripts/setup.sh installs python3-torch python3-numpy python3-matplotlib)"
    exit 77
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"

# Bad input: a clear message and exit code 2, before anything runs.
expect_error() {
    local want=$1; shift
    local rc=0
    "$root/scripts/reproduce.sh" --hslide "$hslide" --out "$tmp/bad" "$@" >"$tmp/err.txt" 2>&1 || rc=$?
    if ((rc != 2)) || ! grep -q "$want" "$tmp/err.txt"; then
        echo "FAIL: reproduce.sh $* exited $rc, expected 2 with '$want':"; cat "$tmp/err.txt"; exit 1
    fi
}
expect_error "unknown preset 'nosuch'" --preset nosuch
expect_error "unknown configuration 'warp-drive'" --preset tiny --configs "cpu warp-drive"
expect_error "precision must be fp32 or bf16" --preset tiny --configs "cpu:fp16"
expect_error "no training file" --train "$tmp/missing.txt" --test "$tmp/missing.txt"
expect_error "unknown argument" --preset tiny --epoch 2
expect_error "@EPOCHS must be a positive integer" --preset tiny --configs "cpu@0"
[[ ! -e $tmp/bad/runs ]] || { echo "FAIL: a bad command started runs"; exit 1; }

# The run (relative --out and --data-cache: resolved against this directory).
"$root/scripts/reproduce.sh" --preset tiny --scale 1 --epochs "$epochs" --threads 2 \
    --configs "$configs" --hslide "$hslide" --out out --data-cache cache
[[ -f cache/tiny-s1-seed2024/.complete ]] || { echo "FAIL: no cached data"; exit 1; }
# A second run with --reuse reuses the data and every complete run, and rewrites the report.
rm out/report.md
"$root/scripts/reproduce.sh" --preset tiny --scale 1 --epochs "$epochs" --threads 2 \
    --configs "$configs" --hslide "$hslide" --out out --data-cache cache --reuse 2>"$tmp/reuse.txt"
if ! grep -q "reusing .*tiny-s1-seed2024" "$tmp/reuse.txt" ||
    ! grep -q ": reusing .*cpu.jsonl" "$tmp/reuse.txt" || grep -q "^final:" "$tmp/reuse.txt" ||
    [[ ! -f out/report.md ]]; then
    echo "FAIL: --reuse ran again:"; cat "$tmp/reuse.txt"; exit 1
fi

"$python" - out "$configs" "$epochs" <<'PY'
import csv, json, math, pathlib, re, sys
out, configs, epochs = pathlib.Path(sys.argv[1]), sys.argv[2].split(), int(sys.argv[3])
def fail(msg):
    print("FAIL:", msg); sys.exit(1)
def number(text, what):
    try:
        x = float(text.rstrip("x"))
    except ValueError:
        fail(f"{what}: '{text}' is not a number")
    if not math.isfinite(x):
        fail(f"{what}: {text} is not finite")
    return x

# results.csv / results.jsonl: one row per configuration and epoch, numbers that parse.
rows = list(csv.DictReader(open(out / "results.csv")))
want = {c: int(c.split("@")[1]) if "@" in c else epochs for c in configs}
if len(rows) != sum(want.values()):
    fail(f"results.csv has {len(rows)} rows, expected {sum(want.values())}")
jsonl = [json.loads(l) for l in open(out / "results.jsonl")]
if len(jsonl) != len(rows):
    fail("results.jsonl and results.csv disagree")
for c in configs:
    mine = [r for r in rows if r["config"] == c]
    if [int(r["epoch"]) for r in mine] != list(range(1, want[c] + 1)):
        fail(f"{c}: epochs {[r['epoch'] for r in mine]}")
    for r in mine:
        for key in ["train_seconds", "wall_seconds", "epoch_seconds", "samples_per_s", "loss",
                    "p@1", "p@3", "p@5", "peak_rss_bytes", "stage_forward", "stage_update"]:
            number(r[key], f"{c} epoch {r['epoch']} {key}")
        if not 0 <= float(r["p@1"]) <= 1 or float(r["peak_rss_bytes"]) <= 0:
            fail(f"{c}: implausible row {r}")
    if float(mine[-1]["p@1"]) < 0.08:  # chance on tiny is ~0.01; every config learns it
        fail(f"{c}: final P@1 {mine[-1]['p@1']} (did it learn?)")
    if not r["cpu"]:
        fail("no CPU model in the rows")

# report.md: the tables, one row per configuration, numbers that parse.
text = (out / "report.md").read_text()
sections = {}
for part in re.split(r"^#+ ", text, flags=re.M)[1:]:
    title, _, body = part.partition("\n")
    sections[title.strip()] = body
for title in ["Seconds per epoch", "Speedup per epoch", "Time to accuracy",
              "Speedup in time to accuracy", "Per-stage breakdown"]:
    if title not in sections:
        fail(f"report.md has no section '{title}'")
def table(title):
    lines = [l for l in sections[title].splitlines() if l.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    return head, {l.strip("|").split("|")[0].strip().strip("*"):
                  [c.strip() for c in l.strip("|").split("|")[1:]] for l in lines[2:]}
for title in ["Seconds per epoch", "Speedup per epoch", "Time to accuracy",
              "Per-stage breakdown", "Speedup in time to accuracy",
              "Time to 90% of the best final P@1"]:
    if title not in sections:  # the last one: only when it differs from the target
        continue
    head, body = table(title)
    if title == "Speedup in time to accuracy":  # the configurations that reached the target
        if not body or not set(body) <= set(configs) or sorted(head[1:]) != sorted(body):
            fail(f"'{title}' rows {sorted(body)}, columns {head[1:]}")
    elif sorted(body) != sorted(configs):
        fail(f"'{title}' rows {sorted(body)} != {sorted(configs)}")
    for c, cells in body.items():
        for h, cell in zip(head[1:], cells):
            if cell in ("—", "not reached"):
                if title.startswith(("Speedup in time", "Time to")):
                    continue
                fail(f"'{title}' {c} {h}: {cell}")
            number(cell, f"'{title}' {c} {h}")
# The diagonal of a speedup matrix is 1.
head, body = table("Speedup per epoch")
for i, c in enumerate(head[1:]):
    if abs(number(body[c][i], "diagonal") - 1) > 1e-9:
        fail(f"speedup of {c} over itself is {body[c][i]}")
m = re.search(r"Target P@1 = \*\*([0-9.]+)\*\*", text)
if not m or not 0 < float(m.group(1)) <= 1:
    fail("no target P@1 in report.md")
for needle in ["p1_vs_time.png", "stages.png", "hardware.json", "**Hardware:**"]:
    if needle not in text:
        fail(f"report.md does not mention {needle}")

# The plots: non-empty PNG files with a sane size.
import struct
for name in ["p1_vs_time.png", "stages.png"]:
    data = (out / name).read_bytes()
    if len(data) < 5000 or data[:8] != b"\x89PNG\r\n\x1a\n":
        fail(f"{name} is not a PNG ({len(data)} bytes)")
    w, h = struct.unpack(">II", data[16:24])
    if not (300 <= w <= 4000 and 200 <= h <= 4000):
        fail(f"{name} is {w}x{h}")

# hardware.json
hw = json.loads((out / "hardware.json").read_text())
for key in ["cpu_model", "cpu_threads", "simd", "memory", "gpus", "revision", "cpu_kernels"]:
    if key not in hw:
        fail(f"hardware.json has no {key}")
if not hw["cpu_model"] or not hw["simd"] or hw["cpu_threads"] < 1:
    fail(f"hardware.json is incomplete: {hw}")
print(f"reproduce harness OK: {len(configs)} configurations, {len(rows)} evaluations")
PY
# --compare: a copy of the results "from a machine twice as fast" (every time halved).
cp -r out fast
"$python" - fast/results.jsonl fast/hardware.json <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for r in rows:
    r["train_seconds"] /= 2
    r["epoch_seconds"] /= 2
open(sys.argv[1], "w").write("".join(json.dumps(r) + "\n" for r in rows))
hw = json.load(open(sys.argv[2]))
hw["cpu_model"] = "twice as fast"
json.dump(hw, open(sys.argv[2], "w"))
PY
rc=0
"$root/scripts/reproduce.sh" --compare out >"$tmp/err.txt" 2>&1 || rc=$?
((rc == 2)) && grep -q "at least two results folders" "$tmp/err.txt" ||
    { echo "FAIL: --compare with one folder exited $rc:"; cat "$tmp/err.txt"; exit 1; }
"$root/scripts/reproduce.sh" --compare out fast --names "slow fast" --out cmp
"$python" - cmp "$configs" <<'PY'
import csv, pathlib, re, struct, sys
cmp, configs = pathlib.Path(sys.argv[1]), sys.argv[2].split()
def fail(msg):
    print("FAIL: --compare:", msg); sys.exit(1)
text = (cmp / "compare.md").read_text()
if "twice as fast" not in text:
    fail("the second machine's hardware is not in compare.md")
sections = {}
for part in re.split(r"^#+ ", text, flags=re.M)[1:]:
    title, _, body = part.partition("\n")
    table = []  # the section's first table
    for l in body.splitlines():
        if l.startswith("|"):
            table.append(l)
        elif table:
            break
    sections[title.strip()] = table
def rows(title):
    if title not in sections:
        fail(f"no section '{title}'")
    return {l.strip("|").split("|")[0].strip().strip("*"):
            [c.strip() for c in l.strip("|").split("|")[1:]] for l in sections[title][2:]}
per_epoch = rows("Seconds per epoch")
if sorted(per_epoch) != sorted(configs):
    fail(f"per-epoch rows {sorted(per_epoch)}")
for c, cells in per_epoch.items():
    slow, fast, ratio = float(cells[0]), float(cells[1]), cells[2]
    if ratio != "2.00x" or abs(slow - 2 * fast) > 0.011:
        fail(f"{c}: {cells} (the fast copy halves every time)")
reached = [c for c, cells in rows("Time to accuracy").items() if cells[2] != "—"]
if not reached or any(rows("Time to accuracy")[c][2] != "2.00x" for c in reached):
    fail(f"time-to-accuracy speedups {rows('Time to accuracy')}")
best = rows("Each machine's fastest configuration")
if best["slow"][0] != best["fast"][0] or abs(float(best["slow"][1]) - 2 * float(best["fast"][1])) > 0.011:
    fail(f"fastest configurations {best}")
data = list(csv.DictReader(open(cmp / "compare.csv")))
if sorted({r["machine"] for r in data}) != ["fast", "slow"] or len(data) % 2:
    fail(f"compare.csv has {len(data)} rows")
png = (cmp / "compare_p1_vs_time.png").read_bytes()
if len(png) < 5000 or png[:8] != b"\x89PNG\r\n\x1a\n":
    fail("compare_p1_vs_time.png is not a PNG")
print(f"compare OK: {len(per_epoch)} configurations on 2 machines")
PY
