#!/usr/bin/env python3
"""Replays --epochs auto's stopping rule on sweep.sh's records (one run per set, seed and
hold-out fraction, test P@1 after every epoch): for each patience and epoch cap, the epoch
kept (the best validation P@1, the first of equals), the epochs run, the kept model's test
P@1, and the training + validation seconds to the stop. Fraction 0 rows are fixed-epoch runs
on all the data; "refit" is the all-data run's P@1 at the epoch the hold-out chose (what
retraining on everything for that many epochs would give, at about twice the time).
Usage: analyse.py DIR [patiences] [caps] [validation metrics, e.g. p@1,ndcg@5,p@135]
(p@135: the mean of P@1, P@3 and P@5 on the validation set)."""
import json, os, statistics as st, sys
from collections import defaultdict

d = sys.argv[1]
patiences = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "1,2,3").split(",")]
caps = [int(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "30").split(",")]
metrics = (sys.argv[4] if len(sys.argv) > 4 else "p@1").split(",")

def valid_value(r, metric):
    v = r["valid"]
    return (v["p@1"] + v["p@3"] + v["p@5"]) / 3 if metric == "p@135" else v[metric]
runs = {}
for name in sorted(os.listdir(d)):
    if not name.endswith(".jsonl"): continue
    s, seed, f = name[:-6].split("-")[:3]
    recs = [json.loads(l) for l in open(os.path.join(d, name))]
    runs[(s, seed[1:], f[1:])] = recs

def replay(recs, patience, cap, metric):
    best, best_v, secs = 0, -1.0, 0.0
    for r in recs[:cap]:
        secs += r["epoch_seconds"] + r.get("valid", {}).get("seconds", 0)
        v = valid_value(r, metric)
        if best == 0 or v > best_v: best, best_v = r["epoch"], v
        if r["epoch"] - best >= patience: break
    return best, r["epoch"], recs[best - 1]["p@1"], secs, best_v

table = defaultdict(list)
for (s, seed, f), recs in runs.items():
    if f == "0":
        for n in (10, len(recs)):
            if n <= len(recs):
                table[(s, f"fixed {n}")].append((n, n, recs[n - 1]["p@1"],
                    sum(r["epoch_seconds"] for r in recs[:n]), 0))
        table[(s, "fixed, test-picked best (oracle)")].append(max(
            ((r["epoch"], r["epoch"], r["p@1"], 0, 0) for r in recs), key=lambda x: x[2]))
        continue
    for m in metrics:
        for p in patiences:
            for c in caps:
                b, e, p1, secs, v = replay(recs, p, c, m)
                name = f"hold-out {f}, {m}, patience {p}, cap {c}"
                table[(s, name)].append((b, e, p1, secs, v))
                base = runs.get((s, seed, "0"))
                if base and b <= len(base) and os.environ.get("REFIT"):
                    table[(s, name + ", refit on all")].append(
                        (b, e, base[b - 1]["p@1"],
                         secs + sum(r["epoch_seconds"] for r in base[:b]), v))

print("| set | variant | seeds | P@1 mean | P@1 sd | epochs kept / run (means) | train+valid s (mean) |")
print("| --- | --- | ---: | ---: | ---: | --- | ---: |")
for (s, v), rows in sorted(table.items()):
    p1 = [r[2] for r in rows]
    sd = st.stdev(p1) if len(p1) > 1 else 0
    print(f"| {s} | {v} | {len(rows)} | {st.mean(p1):.4f} | {sd:.4f} | "
          f"{st.mean(r[0] for r in rows):.1f} / {st.mean(r[1] for r in rows):.1f} | "
          f"{st.mean(r[3] for r in rows):.2f} |")
