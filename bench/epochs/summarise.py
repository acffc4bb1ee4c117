#!/usr/bin/env python3
"""Means over seeds of auto_runs.sh's lines (read from stdin): per variant and set, the test
P@1 (mean, sd), the best epoch and the epochs run (means)."""
import re, statistics as st, sys
from collections import defaultdict
rows = defaultdict(list)
pat = re.compile(r"(\S+) (\S+) seed \d+: P@1 (\S+) P@3 \S+ P@5 \S+ best (\d+) run (\d+)")
for line in sys.stdin:
    m = pat.match(line)
    if m:
        rows[(m[1], m[2])].append((float(m[3]), int(m[4]), int(m[5])))
print("| variant | set | seeds | P@1 mean | sd | epochs kept / run |")
print("| --- | --- | ---: | ---: | ---: | --- |")
for (v, s), r in rows.items():
    p = [x[0] for x in r]
    print(f"| {v} | {s} | {len(r)} | {st.mean(p):.4f} | {st.stdev(p) if len(p) > 1 else 0:.4f} | "
          f"{st.mean(x[1] for x in r):.1f} / {st.mean(x[2] for x in r):.1f} |")
