#!/usr/bin/env python3
"""The results side of scripts/reproduce.sh.

  report.py hardware --hslide build/hslide --out DIR/hardware.json
      CPU model, cores/threads, SIMD levels and kernel level (from `hslide info`), memory,
      OS, compiler, GPUs with driver and CUDA version (nvidia-smi), PyTorch, git revision.
  report.py report --dir DIR --configs "cpu cpu:bf16 ..." [--target-p1 X]
      reads DIR/runs/<config>.jsonl (hslide's --metrics-out records, or the PyTorch
      baseline's records in the same schema), DIR/run_info.tsv and DIR/hardware.json, and
      writes DIR/results.csv, DIR/results.jsonl, DIR/report.md, DIR/p1_vs_time.png and
      DIR/stages.png.
  report.py compare --out OUT [--names "A B ..."] [--target-p1 X] DIR DIR ...
      puts results folders of the same workload from different machines side by side:
      OUT/compare.md (the machines; s/epoch and time to one common target P@1 per
      configuration and machine, with each machine's speedup over the first; each machine's
      fastest configuration and the speedups between those), OUT/compare.csv (every
      evaluation with its machine) and OUT/compare_p1_vs_time.png.

Definitions (also in the report):
  * train seconds: the sum of the epochs' training wall time (evaluation excluded);
  * s/epoch: the mean training wall time of an epoch;
  * time to accuracy: train seconds at the first evaluation with P@1 >= the target;
  * default target: 90% of the lowest final P@1 among the configurations that learned
    (final P@1 at least a tenth of the best), so every such configuration reached it; the
    report adds the time to 90% of the best final P@1, which some may not reach.
"""
import argparse
import csv
import datetime
import json
import math
import os
import pathlib
import re
import shutil
import subprocess
import sys

STAGES = ["hashing", "rebuild", "active_sets", "forward", "backward", "update", "transfer"]
STAGE_NAMES = {"hashing": "hashing", "rebuild": "table build", "active_sets": "active sets",
               "forward": "forward", "backward": "backward", "update": "update",
               "transfer": "transfer"}
MARKERS = "osD^v<>pP*Xh"  # one per configuration (per machine in a comparison)
# Configurations with a full-softmax output layer (the dense baselines).
DENSE = {"cpu-nolsh", "cpu-dense", "gpu-dense", "torch-cpu", "torch-gpu"}
# Other tools' configurations (no network, no loss; scripts/baselines/napkinxc.sh).
PEERS = {"napkinxc", "napkinxc-tuned"}
CSV_FIELDS = (["config", "backend", "precision", "isa", "epoch", "train_seconds", "wall_seconds",
               "epoch_seconds", "samples_per_s", "loss", "p@1", "p@3", "p@5",
               "peak_rss_bytes", "peak_gpu_bytes"]
              + [f"stage_{s}" for s in STAGES]
              + ["eval_seconds", "eval_points", "cpu", "gpu", "revision"])


def run(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


# --- hardware ------------------------------------------------------------------------------------
def hardware(args):
    info_text = run([args.hslide, "info"])
    info = {}
    for line in info_text.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip():
            info[key.strip()] = value.strip()
    hw = {"date_utc": datetime.datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"),
          "cpu_model": info.get("cpu", ""), "cpu_threads": os.cpu_count(),
          "cores": info.get("cores", ""), "simd": info.get("simd", "").split(),
          "cpu_kernels": info.get("cpu kernels", ""), "memory": info.get("memory", ""),
          "os": info.get("os", ""), "compiler": info.get("compiler", ""),
          "cuda_build": info.get("cuda backend in this build", ""),
          "hslide_gpus": info.get("gpus", ""), "hslide_info": info_text}
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        m = re.search(r"^model name\s*:\s*(.*)$", text, re.M)
        if m:
            hw["cpu_model_proc"] = m.group(1).strip()
        hw["cpu_sockets"] = len(set(re.findall(r"^physical id\s*:\s*(\d+)", text, re.M))) or None
        cores = set(re.findall(r"^physical id\s*:\s*(\d+)\s*$.*?^core id\s*:\s*(\d+)", text,
                               re.M | re.S))
        hw["cpu_physical_cores"] = len(cores) or None
        with open("/proc/meminfo") as f:
            m = re.search(r"MemTotal:\s*(\d+) kB", f.read())
            if m:
                hw["memory_bytes"] = int(m.group(1)) * 1024
    except OSError:
        pass
    gpus = []
    if shutil.which("nvidia-smi"):
        out = run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                   "--format=csv,noheader"])
        for line in out.strip().splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 3:
                gpus.append({"name": parts[0], "driver": parts[1], "memory": parts[2]})
        m = re.search(r"CUDA Version:\s*([0-9.]+)", run(["nvidia-smi"]))
        hw["cuda_driver_version"] = m.group(1) if m else ""
    hw["gpus"] = gpus
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc"
                                    if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    if nvcc:
        m = re.search(r"release ([0-9.]+)", run([nvcc, "--version"]))
        hw["cuda_toolkit_version"] = m.group(1) if m else ""
    try:
        import torch
        hw["torch"] = {"version": torch.__version__, "threads": torch.get_num_threads(),
                       "cuda": torch.version.cuda or "",
                       "cuda_available": torch.cuda.is_available()}
    except ImportError:
        hw["torch"] = None
    rev = run(["git", "rev-parse", "--short=12", "HEAD"]).strip()
    dirty = run(["git", "status", "--porcelain", "--untracked-files=no"]).strip()
    hw["revision"] = rev + ("-dirty" if rev and dirty else "")
    pathlib.Path(args.out).write_text(json.dumps(hw, indent=2) + "\n")
    return 0


# --- report --------------------------------------------------------------------------------------
def config_parts(config):
    parts = (config.split("@")[0].split(":") + ["", ""])[:3]
    backend, precision, isa = parts
    if backend.startswith("torch"):
        return backend, precision or "fp32", ""
    if backend in PEERS:
        return backend, "", ""
    return backend, precision or "fp32", isa or "auto"


def load_runs(directory, configs):
    runs = {}
    for c in configs:
        path = directory / "runs" / (c.replace(":", "_") + ".jsonl")
        records = []
        if path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    records.append(json.loads(line))
        train = 0.0
        for r in records:
            train += r["epoch_seconds"]
            r["train_seconds"] = train
        runs[c] = records
    return runs


def fmt(x, digits=1):
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    return f"{x:.{digits}f}"


def speedup_matrix(names, values, unit_note):
    """G-SLIDE-style matrix: cell (row, column) = value(column) / value(row), i.e. how many
    times faster the row is than the column."""
    lines = ["| row over column | " + " | ".join(names) + " |",
             "|---|" + "---:|" * len(names)]
    for a in names:
        cells = []
        for b in names:
            va, vb = values.get(a), values.get(b)
            cells.append(f"{vb / va:.2f}x" if va and vb else "—")
        lines.append(f"| **{a}** | " + " | ".join(cells) + " |")
    return "\n".join(lines) + f"\n\n{unit_note}\n"


def target_rule(finals, given, scope):
    """(target P@1, the rule that gave it) from the runs' finite final P@1s: `given`, else 90%
    of the lowest among the runs that learned, so every one of them reached it. `scope` is
    added to the rule's text (e.g. ", over every machine")."""
    if given is not None:
        return given, "given with --target-p1"
    if not finals or max(finals) <= 0:
        return None, "no configuration has a positive P@1"
    learned = [p for p in finals if p >= 0.1 * max(finals)]
    return 0.9 * min(learned), ("90% of the lowest final P@1 among the configurations that "
                                "learned (final P@1 at least a tenth of the best one)" + scope +
                                ": an accuracy every one of them reached")


def time_to_target(records, target):
    """(train seconds, epoch) at the first evaluation with P@1 >= target, or None."""
    for r in records:
        if r.get("p@1") is not None and r["p@1"] >= target:
            return r["train_seconds"], r["epoch"]
    return None


def report(args):
    directory = pathlib.Path(args.dir)
    configs = args.configs.split()
    runs = load_runs(directory, configs)
    hw = json.loads((directory / "hardware.json").read_text())
    info = {"note": [], "failed": []}
    info_path = directory / "run_info.tsv"
    if info_path.exists():
        for line in info_path.read_text().splitlines():
            key, _, value = line.partition("\t")
            if key in ("note", "failed"):
                info[key].append(value)
            else:
                info[key] = value
    gpu_name = ", ".join(g["name"] for g in hw.get("gpus", [])) or "none"

    # Every evaluation, one row each.
    rows = []
    for c in configs:
        backend, precision, isa = config_parts(c)
        for r in runs[c]:
            row = {"config": c, "backend": backend, "precision": precision, "isa": isa,
                   "epoch": r["epoch"], "train_seconds": r["train_seconds"],
                   "wall_seconds": r["seconds"], "epoch_seconds": r["epoch_seconds"],
                   "samples_per_s": r["samples_per_s"], "loss": r.get("loss"),
                   "p@1": r.get("p@1"), "p@3": r.get("p@3"), "p@5": r.get("p@5"),
                   "peak_rss_bytes": r.get("peak_rss_bytes"),
                   "peak_gpu_bytes": r.get("peak_gpu_bytes"),
                   "eval_seconds": r.get("eval_seconds"), "eval_points": r.get("eval_points"),
                   "cpu": hw.get("cpu_model", ""), "gpu": gpu_name,
                   "revision": hw.get("revision", "")}
            for s in STAGES:
                row[f"stage_{s}"] = r.get("stage_seconds", {}).get(s, 0.0)
            rows.append(row)
    with open(directory / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for row in rows:
            w.writerow({k: ("" if v is None else v) for k, v in row.items()})
    with open(directory / "results.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")

    done = [c for c in configs if runs[c]]
    per_epoch = {c: sum(r["epoch_seconds"] for r in runs[c]) / len(runs[c]) for c in done}
    final = {c: runs[c][-1].get("p@1") for c in done}

    finals = [p for p in final.values() if p is not None and math.isfinite(p)]
    target, rule = target_rule(finals, args.target_p1, "")
    tta = {c: time_to_target(runs[c], target) for c in done} if target is not None else {}

    md = []
    md.append("# hslide reproduction report\n")
    md.append(f"- **Workload:** {info.get('workload', '?')}")
    md.append(f"- **Settings:** {info.get('settings', '?')}")
    md.append(f"- **Command:** `{info.get('command', '?')}`")
    md.append(f"- **Date (UTC):** {hw.get('date_utc', '?')}; hslide revision "
              f"`{hw.get('revision', '?')}`")
    md.append(f"- **Hardware:** {hw.get('cpu_model', '?')} ({hw.get('cores', '?')}), "
              f"SIMD: {' '.join(hw.get('simd', []))}; CPU kernels: "
              f"{hw.get('cpu_kernels', '?')}; memory {hw.get('memory', '?')}; GPU: {gpu_name}"
              + (f" (driver {hw['gpus'][0]['driver']}, CUDA "
                 f"{hw.get('cuda_driver_version', '?')})" if hw.get("gpus") else "")
              + "; full record in [hardware.json](hardware.json)")
    torch_info = hw.get("torch")
    if torch_info:
        md.append(f"- **PyTorch:** {torch_info['version']}"
                  + (f", CUDA {torch_info['cuda']}" if torch_info.get("cuda") else ""))
    for n in info["note"]:
        md.append(f"- **Note:** {n}")
    for c in info["failed"]:
        md.append(f"- **Failed:** `{c}` (its log: runs/{c.replace(':', '_')}.log)")
    md.append("")

    md.append("## Seconds per epoch\n")
    md.append("Training wall time per epoch (mean over the epochs; evaluation excluded), "
              "throughput, accuracy after the last epoch, and peak memory (resident set of "
              "the process; GPU memory separately where measured).\n")
    md.append("| configuration | epochs | s/epoch | samples/s | P@1 | P@3 | P@5 | loss | "
              "peak RSS (GiB) |")
    md.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in configs:
        if not runs[c]:
            md.append(f"| {c} | failed | — | — | — | — | — | — | — |")
            continue
        last = runs[c][-1]
        rates = [r["samples_per_s"] for r in runs[c]]
        peak = max(r.get("peak_rss_bytes") or 0 for r in runs[c]) / 2**30
        md.append(f"| {c} | {len(runs[c])} | {per_epoch[c]:.2f} | {sum(rates) / len(rates):.0f} | "
                  f"{fmt(last.get('p@1'), 4)} | {fmt(last.get('p@3'), 4)} | "
                  f"{fmt(last.get('p@5'), 4)} | {fmt(last.get('loss'), 4)} | {peak:.2f} |")
    md.append("")
    md.append("### Speedup per epoch\n")
    md.append(speedup_matrix(done, per_epoch,
                             "Each cell is the column's s/epoch divided by the row's: how many "
                             "times faster per epoch the row's configuration is than the "
                             "column's (the layout of the G-SLIDE paper's speedup table)."))

    md.append("## Time to accuracy\n")
    if target is None:
        md.append("No target: " + rule + ".\n")
    else:
        md.append(f"Target P@1 = **{target:.4f}** ({rule}). Time to accuracy is the training "
                  "time (evaluation excluded) up to the end of the first epoch whose "
                  "evaluation reached the target; accuracy is measured once an epoch, so "
                  "this is an upper bound at epoch granularity.\n")
        md.append("| configuration | train seconds to target | epoch | final P@1 |")
        md.append("|---|---:|---:|---:|")
        for c in done:
            t = tta.get(c)
            md.append(f"| {c} | {fmt(t[0], 2) if t else 'not reached'} | "
                      f"{t[1] if t else '—'} | {fmt(final[c], 4)} |")
        md.append("")
        reached = {c: tta[c][0] for c in done if tta.get(c)}
        dense = [c for c in done if config_parts(c)[0] in DENSE]
        sparse = [c for c in done if config_parts(c)[0] not in DENSE | PEERS]
        if dense and sparse:
            md.append("Sparse (LSH) against dense (full softmax) configurations, time to the "
                      "target P@1:\n")
            for s in sparse:
                parts = []
                for d in dense:
                    if reached.get(s) and reached.get(d):
                        parts.append(f"{reached[d] / reached[s]:.1f}x faster than {d}")
                    elif reached.get(s):
                        parts.append(f"reached it, {d} did not")
                    elif reached.get(d):
                        parts.append(f"did not reach it, {d} did")
                    else:
                        parts.append(f"neither it nor {d} reached it")
                md.append(f"- **{s}**: " + "; ".join(parts))
            md.append("")
        high = 0.9 * max(finals)
        if high > target * 1.001:
            md.append("### Time to 90% of the best final P@1\n")
            md.append(f"A higher target, P@1 = **{high:.4f}**, which not every configuration "
                      "may reach in its epochs:\n")
            md.append("| configuration | train seconds to it | epoch |")
            md.append("|---|---:|---:|")
            for c in done:
                t = time_to_target(runs[c], high)
                md.append(f"| {c} | {fmt(t[0], 2) if t else 'not reached'} | "
                          f"{t[1] if t else '—'} |")
            md.append("")
        md.append("### Speedup in time to accuracy\n")
        md.append(speedup_matrix([c for c in done if c in reached], reached,
                                 "Each cell is the column's time to the target divided by the "
                                 "row's, for the configurations that reached it."))

    md.append("## Per-stage breakdown\n")
    md.append("Seconds per epoch in each stage (mean over the epochs). hslide's CPU stages are "
              "per-thread CPU seconds averaged over the threads (the hybrid backend's are summed over its workers, so they can add up to more than the wall time); `other` is the epoch's wall "
              "time not in a stage (batching, scheduling, waiting). Table build is the LSH "
              "table rebuilds; active sets are the bucket queries, forced labels and random "
              "fill. The PyTorch baseline has no hashing; its transfer is building the batch "
              "tensors (and copying them to the GPU).\n")
    md.append("| configuration | " + " | ".join(STAGE_NAMES[s] for s in STAGES)
              + " | other | total |")
    md.append("|---|" + "---:|" * (len(STAGES) + 2))
    stage_means = {}
    for c in done:
        n = len(runs[c])
        means = {s: sum(r.get("stage_seconds", {}).get(s, 0.0) for r in runs[c]) / n
                 for s in STAGES}
        means["other"] = max(0.0, per_epoch[c] - sum(means.values()))
        stage_means[c] = means
        md.append(f"| {c} | " + " | ".join(f"{means[s]:.2f}" for s in STAGES)
                  + f" | {means['other']:.2f} | {per_epoch[c]:.2f} |")
    md.append("")

    md.append("## Plots\n")
    md.append("![P@1 against training time](p1_vs_time.png)\n")
    md.append("![Per-stage seconds per epoch](stages.png)\n")
    md.append("Every evaluation is in [results.csv](results.csv) / "
              "[results.jsonl](results.jsonl); each run's log and raw records are in `runs/`.\n")
    (directory / "report.md").write_text("\n".join(md))

    try:
        import matplotlib
    except ImportError:
        print(f"report.py: {sys.executable} has no matplotlib: report.md and the tables are "
              "written, the plots are not (scripts/setup.sh installs python3-matplotlib)",
              file=sys.stderr)
        return 1
    plots(directory, done, runs, stage_means, target)
    return 0


# --- compare ------------------------------------------------------------------------------------
def die(message):
    print(f"report.py compare: error: {message}", file=sys.stderr)
    sys.exit(2)


def load_results(directory):
    """(rows of results.jsonl grouped by configuration, in order; hardware; run_info)."""
    results = directory / "results.jsonl"
    by_config = {}
    if results.exists():
        for n, line in enumerate(results.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                by_config.setdefault(row["config"], []).append(row)
            except (ValueError, KeyError) as e:
                die(f"{results}:{n}: not a results row ({e})")
    elif (directory / "results.csv").exists():
        # The CSV alone (e.g. a folder kept in bench/): numbers back from text.
        results = directory / "results.csv"
        with open(results, newline="") as f:
            for n, row in enumerate(csv.DictReader(f), 2):
                try:
                    for key in row:
                        if key not in ("config", "backend", "precision", "isa", "cpu", "gpu",
                                       "revision"):
                            row[key] = float(row[key]) if row[key] != "" else None
                    row["epoch"] = int(row["epoch"])
                    by_config.setdefault(row["config"], []).append(row)
                except (ValueError, KeyError, TypeError) as e:
                    die(f"{results}:{n}: not a results row ({e})")
    else:
        die(f"{directory} has neither results.jsonl nor results.csv (a results folder of "
            "scripts/reproduce.sh is needed)")
    hw_path = directory / "hardware.json"
    hw = json.loads(hw_path.read_text()) if hw_path.exists() else {}
    info = {}
    info_path = directory / "run_info.tsv"
    if info_path.exists():
        for line in info_path.read_text().splitlines():
            key, _, value = line.partition("\t")
            info.setdefault(key, value)
    return by_config, hw, info


def machine_summary(hw):
    gpus = ", ".join(g["name"] for g in hw.get("gpus", [])) or "no GPU"
    kernels = (hw.get("cpu_kernels") or "?").split()[0]
    return (f"{hw.get('cpu_model', '?')}, {hw.get('cpu_threads', '?')} threads, {kernels} "
            f"kernels, {hw.get('memory', '?')}; {gpus}")




def compare(args):
    dirs = [pathlib.Path(d) for d in args.dirs]
    names = args.names.split() if args.names else [d.resolve().name for d in dirs]
    if len(names) != len(dirs):
        die(f"{len(names)} names for {len(dirs)} folders")
    if len(set(names)) != len(names):
        die("machine names must differ (--names)")
    machines = []
    for name, d in zip(names, dirs):
        by_config, hw, info = load_results(d)
        machines.append({"name": name, "dir": d, "runs": by_config, "hw": hw, "info": info})
    configs = []
    for m in machines:
        configs += [c for c in m["runs"] if c not in configs]
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    def per_epoch(m, c):
        rows = m["runs"].get(c)
        return sum(r["epoch_seconds"] for r in rows) / len(rows) if rows else None

    def final_p1(m, c):
        rows = m["runs"].get(c)
        return rows[-1].get("p@1") if rows else None

    finals = [final_p1(m, c) for m in machines for c in m["runs"]]
    target, rule = target_rule([p for p in finals if p is not None and math.isfinite(p)],
                               args.target_p1, ", over every machine")
    tta = {(m["name"], c): time_to_target(m["runs"][c], target)
           for m in machines for c in m["runs"]} if target is not None else {}

    with open(out / "compare.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["machine"] + CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for m in machines:
            for c in m["runs"]:
                for r in m["runs"][c]:
                    w.writerow({"machine": m["name"],
                                **{k: ("" if v is None else v) for k, v in r.items()}})

    first = machines[0]["name"]
    md = ["# hslide hardware comparison\n"]
    md.append("| machine | hardware | workload | settings | date (UTC), revision | results |")
    md.append("|---|---|---|---|---|---|")
    for m in machines:
        md.append(f"| **{m['name']}** | {machine_summary(m['hw'])} | "
                  f"{m['info'].get('workload', '?')} | {m['info'].get('settings', '?')} | "
                  f"{m['hw'].get('date_utc', '?')}, `{m['hw'].get('revision', '?')}` | "
                  f"`{m['dir']}` |")
    md.append("")
    workloads = {m["info"].get("workload") for m in machines}
    if len(workloads) > 1:
        md.append("**The workloads differ**: the figures below do not compare machines on the "
                  "same work.\n")

    md.append("## Seconds per epoch\n")
    md.append("Training wall time per epoch (mean over the epochs, evaluation excluded), and in "
              f"the last columns how many times faster each machine is than **{first}** on "
              "the same configuration.\n")
    others = machines[1:]
    # Both tables: a column per machine, then each other machine's speedup over the first.
    header = ("| configuration | " + " | ".join(m["name"] for m in machines)
              + "".join(f" | {m['name']} over {first}" for m in others) + " |\n|---|"
              + "---:|" * (len(machines) + len(others)))
    md.append(header)
    for c in configs:
        cells = [fmt(per_epoch(m, c), 2) for m in machines]
        base = per_epoch(machines[0], c)
        for m in others:
            mine = per_epoch(m, c)
            cells.append(f"{base / mine:.2f}x" if base and mine else "—")
        md.append(f"| {c} | " + " | ".join(cells) + " |")
    md.append("")

    md.append("## Time to accuracy\n")
    if target is None:
        md.append(f"No target: {rule}.\n")
    else:
        md.append(f"Target P@1 = **{target:.4f}** ({rule}): training seconds (evaluation "
                  "excluded) to the end of the first epoch whose evaluation reached it, and "
                  "the final P@1 in brackets.\n")
        md.append(header)
        for c in configs:
            cells = []
            for m in machines:
                if c not in m["runs"]:
                    cells.append("—")
                    continue
                t = tta.get((m["name"], c))
                cells.append(f"{fmt(t[0], 2) if t else 'not reached'} "
                             f"({fmt(final_p1(m, c), 3)})")
            base = tta.get((first, c))
            for m in others:
                mine = tta.get((m["name"], c))
                cells.append(f"{base[0] / mine[0]:.2f}x" if base and mine and mine[0] > 0
                             else "—")
            md.append(f"| {c} | " + " | ".join(cells) + " |")
        md.append("")
        md.append("### Each machine's fastest configuration\n")
        best = {}
        for m in machines:
            reached = [(tta[(m["name"], c)][0], c) for c in m["runs"]
                       if tta.get((m["name"], c))]
            if reached:
                best[m["name"]] = min(reached)
        md.append("| machine | fastest to the target | train seconds |")
        md.append("|---|---|---:|")
        for m in machines:
            b = best.get(m["name"])
            md.append(f"| {m['name']} | {b[1] if b else 'none reached it'} | "
                      f"{fmt(b[0], 2) if b else '—'} |")
        md.append("")
        md.append(speedup_matrix([m["name"] for m in machines if m["name"] in best],
                                 {n: b[0] for n, b in best.items()},
                                 "Each cell is the column machine's best time to the target "
                                 "divided by the row machine's: how many times faster the row "
                                 "machine, at its best, reaches the same accuracy."))
    md.append("![P@1 against training time, every machine](compare_p1_vs_time.png)\n")
    md.append("Every evaluation, with its machine, is in [compare.csv](compare.csv).\n")
    (out / "compare.md").write_text("\n".join(md))

    try:
        import matplotlib
    except ImportError:
        print(f"report.py: {sys.executable} has no matplotlib: compare.md and compare.csv are "
              "written, the plot is not", file=sys.stderr)
        return 1
    colours = [f"C{i}" for i in range(10)]  # matplotlib's default cycle (tab10)
    styles = ["-", "--", ":", "-."]
    curves = []
    for j, m in enumerate(machines):
        for c, rows in m["runs"].items():
            i = configs.index(c)
            curves.append((f"{c} ({m['name']})", rows,
                           {"color": colours[i % len(colours)],
                            "linestyle": styles[j % len(styles)],
                            "marker": MARKERS[j % len(MARKERS)]}))
    p1_plot(out / "compare_p1_vs_time.png", curves, target,
            "P@1 against training time: colour = configuration, line = machine",
            {"fontsize": 7, "ncol": 2})
    return 0


def p1_plot(path, curves, target, title, legend):
    """P@1 against training time, one line per (label, evaluation records, line style)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    # Times that span more than 20x between configurations go on a log axis (the curves then
    # start at the first evaluation instead of at 0 s).
    ends = [rows[-1]["train_seconds"] for _, rows, _ in curves if rows]
    log_x = bool(ends) and min(ends) > 0 and max(ends) / min(ends) > 20
    for label, rows, style in curves:
        pts = [(r["train_seconds"], r["p@1"]) for r in rows if r.get("p@1") is not None]
        if not pts:
            continue
        xs, ys = zip(*(pts if log_x else [(0.0, 0.0)] + pts))
        ax.plot(xs, ys, label=label, **style)
    if log_x:
        ax.set_xscale("log")
    if target is not None:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1,
                   label=f"target P@1 {target:.3f}")
    ax.set_xlabel("training time (s, evaluation excluded" + (", log scale)" if log_x else ")"))
    ax.set_ylabel("P@1 (test)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(**legend)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plots(directory, configs, runs, stage_means, target):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p1_plot(directory / "p1_vs_time.png",
            [(c, runs[c], {"marker": MARKERS[i % len(MARKERS)]}) for i, c in enumerate(configs)],
            target, "P@1 against training time", {"fontsize": 8})

    fig, ax = plt.subplots(figsize=(8, 0.5 * len(configs) + 1.8))
    names = list(configs)
    left = [0.0] * len(names)
    colours = plt.get_cmap("tab10").colors
    for i, s in enumerate(STAGES + ["other"]):
        widths = [stage_means[c][s] for c in names]
        ax.barh(names, widths, left=left, color=colours[i % len(colours)],
                label=STAGE_NAMES.get(s, s))
        left = [l + w for l, w in zip(left, widths)]
    ax.invert_yaxis()
    ax.set_xlim(0, max(left + [1e-9]) * 1.04)  # bars end inside the frame, never on its edge
    ax.set_xlabel("seconds per epoch")
    ax.set_title("Per-stage breakdown")
    ax.legend(fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.2 - 0.4 / len(names)))
    fig.tight_layout()
    fig.savefig(directory / "stages.png", dpi=120, bbox_inches="tight")
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    h = sub.add_parser("hardware")
    h.add_argument("--hslide", default="build/hslide")
    h.add_argument("--out", required=True)
    r = sub.add_parser("report")
    r.add_argument("--dir", required=True)
    r.add_argument("--configs", required=True, help="space-separated, in report order")
    r.add_argument("--target-p1", type=float)
    c = sub.add_parser("compare")
    c.add_argument("--out", required=True)
    c.add_argument("--names", help="space-separated machine names (default: folder names)")
    c.add_argument("--target-p1", type=float)
    c.add_argument("dirs", nargs="+", help="results folders of scripts/reproduce.sh")
    a = p.parse_args()
    return {"hardware": hardware, "report": report, "compare": compare}[a.command](a)


if __name__ == "__main__":
    sys.exit(main())
