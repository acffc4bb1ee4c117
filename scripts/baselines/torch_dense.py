#!/usr/bin/env python3
"""Dense (full-softmax) PyTorch baseline for hslide's network.

Trains the network hslide trains -- a sparse input layer (the weighted sum of the point's
feature rows) -> ReLU hidden layer(s) -> an output layer with one neuron per label -- with a
full softmax over every label, on the same data files hslide reads, and appends one JSON
record per epoch to --metrics-out in hslide's `--metrics-out` schema (epoch, seconds,
epoch_seconds, samples_per_s, loss, peak_rss_bytes, stage_seconds, p@1..p@5, ...), so that
scripts/report.py reads both alike.

Matches hslide where practical:
  * data: XC files (`N D L` header, `l1,l2 f:v ...`, 0-based ids) or LibSVM multi-label files
    (no header, 1-based features), optional XC split files (1-based rows, --split-column);
  * each point's features scaled to unit L2 norm (hslide's --normalize l2 default);
  * initialisation: layer 0 ~ N(0, 0.1^2), later ReLU layers ~ N(0, (2/sqrt(fan_in))^2), the
    output layer ~ N(0, (1/sqrt(fan_in))^2), biases 0 (src/common/model/model.cpp);
  * loss: cross-entropy against the uniform distribution over the point's labels,
    -sum_{y} (1/|y|) log softmax(z)_y, averaged over the batch (points without labels count
    in the batch size but add no loss or gradient), as src/cpu/cpu_backend.cpp computes it;
  * Adam with the same lr, betas, epsilon and batch size; a fresh seeded shuffle per epoch;
  * P@k (k = 1..5) on the test file after every epoch, scoring every label (exact).
Unlike hslide's default lazy Adam, torch.optim.Adam moves every row every step (what
hslide calls --adam dense, and what the dense baselines of the SLIDE papers did).

Usage: torch_dense.py --train FILE --test FILE --metrics-out FILE.jsonl [--device cpu|cuda]
       [--hidden 128] [--epochs 2] [--batch-size 128] [--lr 0.002] [--threads N] [--seed 1]
"""
import argparse
import json
import math
import os
import resource
import sys
import time


def threads_from_argv(argv):
    for i, arg in enumerate(argv):
        if arg == "--threads" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--threads="):
            return arg.split("=", 1)[1]
    return "0"


# The BLAS under Debian's PyTorch (OpenBLAS where installed) keeps its own thread pool: give it
# the same thread count, set before torch loads it.
if threads_from_argv(sys.argv) not in ("", "0"):
    os.environ.setdefault("OPENBLAS_NUM_THREADS", threads_from_argv(sys.argv))

try:
    import numpy as np
    import torch
except ImportError as e:  # a clone without scripts/setup.sh
    print(f"torch_dense.py: {e}; install python3-torch and python3-numpy "
          "(scripts/setup.sh does)", file=sys.stderr)
    sys.exit(3)


class DataError(Exception):
    pass


def read_split(path, column):
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            cols = line.split()
            if not cols:
                continue
            if column > len(cols):
                raise DataError(f"{path}:{n}: no column {column}")
            rows.append(int(cols[column - 1]) - 1)
    return rows


def read_data(path, rows=None):
    """Returns (labels: list of int lists, feat_ids, feat_vals, offsets, n_features, n_labels)."""
    try:
        f = open(path, encoding="utf-8-sig")
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror}")
    with f:
        lines = [l for l in f.read().splitlines() if l.strip()]
    if not lines:
        raise DataError(f"{path}: empty file")
    head = lines[0].split()
    xc = len(head) == 3 and all(t.isdigit() for t in head)
    feature_base = 0 if xc else 1
    n_features = int(head[1]) if xc else 0
    n_labels = int(head[2]) if xc else 0
    body = lines[1:] if xc else lines
    if xc and len(body) != int(head[0]):
        raise DataError(f"{path}: the header declares {head[0]} points but the file has {len(body)}")
    if rows is not None:
        body = [body[r] for r in rows]
    labels, ids, vals, offsets = [], [], [], [0]
    for n, line in enumerate(body, 1):
        tokens = line.split()
        y = []
        if tokens and ":" not in tokens[0]:
            y = [int(t) for t in tokens[0].split(",")]
            tokens = tokens[1:]
        labels.append(y)
        for t in tokens:
            fid, val = t.split(":")
            ids.append(int(fid) - feature_base)
            vals.append(float(val))
        offsets.append(len(ids))
        if y:
            n_labels = max(n_labels, max(y) + 1) if not xc else n_labels
    ids = np.asarray(ids, dtype=np.int64)
    vals = np.asarray(vals, dtype=np.float32)
    if not xc and len(ids):
        n_features = int(ids.max()) + 1
    return labels, ids, vals, np.asarray(offsets, dtype=np.int64), n_features, n_labels


def l2_normalize(vals, offsets):
    """Each point's values scaled to unit L2 norm (points without features, or all zeros, kept)."""
    counts = np.diff(offsets)
    row_of = np.repeat(np.arange(len(counts)), counts)
    norms = np.sqrt(np.bincount(row_of, weights=vals.astype(np.float64) ** 2,
                                minlength=len(counts)))
    norms[norms == 0] = 1.0
    return (vals / norms[row_of]).astype(np.float32)


class Net(torch.nn.Module):
    def __init__(self, n_features, hidden, n_labels, gen):
        super().__init__()
        self.embed = torch.nn.EmbeddingBag(n_features, hidden[0], mode="sum")
        self.bias0 = torch.nn.Parameter(torch.zeros(hidden[0]))
        self.layers = torch.nn.ModuleList()
        sizes = list(hidden) + [n_labels]
        with torch.no_grad():
            self.embed.weight.normal_(0.0, 0.1, generator=gen)
            for i in range(1, len(sizes)):
                layer = torch.nn.Linear(sizes[i - 1], sizes[i])
                output = i == len(sizes) - 1
                layer.weight.normal_(0.0, (1.0 if output else 2.0) / math.sqrt(sizes[i - 1]),
                                     generator=gen)
                layer.bias.zero_()
                self.layers.append(layer)

    def forward(self, ids, offsets, weights):
        h = torch.relu(self.embed(ids, offsets, per_sample_weights=weights) + self.bias0)
        for i, layer in enumerate(self.layers):
            h = layer(h)
            if i + 1 < len(self.layers):
                h = torch.relu(h)
        return h


def batch_tensors(rows, ids, vals, offsets, device):
    starts, ends = offsets[rows], offsets[rows + 1]
    counts = ends - starts
    index = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends)]) if len(rows) else []
    b_ids = torch.from_numpy(ids[index])
    b_vals = torch.from_numpy(vals[index])
    b_off = torch.from_numpy(np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64))
    return b_ids.to(device), b_off.to(device), b_vals.to(device)


def target_entries(rows, labels, device):
    """(sample index, label, 1/|y|) for every label of every point: the uniform distribution
    over each point's labels (a point without labels has no entries)."""
    r, c, v = [], [], []
    for i, row in enumerate(rows):
        y = labels[row]
        for l in y:
            r.append(i)
            c.append(l)
            v.append(1.0 / len(y))
    return (torch.tensor(r, dtype=torch.int64).to(device),
            torch.tensor(c, dtype=torch.int64).to(device),
            torch.tensor(v, dtype=torch.float32).to(device))


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train", required=True)
    p.add_argument("--test", help="test file (default: --train, with --test-split)")
    p.add_argument("--train-split")
    p.add_argument("--test-split")
    p.add_argument("--split-column", type=int, default=1)
    p.add_argument("--metrics-out", required=True)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--hidden", default="128", help="comma-separated hidden sizes")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.002)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.999)
    p.add_argument("--adam-eps", type=float, default=1e-8)
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0 = torch's default)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--eval-batch", type=int, default=256)
    p.add_argument("--eval-max", type=int, default=0, help="test points used (0 = all)")
    p.add_argument("--normalize", default="l2", choices=["l2", "none"])
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                   help="bf16: forward and backward under torch.autocast (bf16 GEMMs, fp32 "
                        "master weights, Adam and softmax), PyTorch's mixed precision")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the model (PyTorch 2.0 or later)")
    a = p.parse_args()

    if not a.test and not a.test_split:
        print("torch_dense.py: error: give --test (or --test-split)", file=sys.stderr)
        return 2
    if a.device == "cuda" and not torch.cuda.is_available():
        print("torch_dense.py: --device cuda but this PyTorch sees no CUDA GPU", file=sys.stderr)
        return 1
    if a.compile and not hasattr(torch, "compile"):
        print(f"torch_dense.py: --compile needs PyTorch 2.0 or later (this is {torch.__version__})",
              file=sys.stderr)
        return 2
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    device = torch.device(a.device)
    hidden = [int(h) for h in a.hidden.split(",")]

    t0 = time.perf_counter()
    try:
        tr_rows = read_split(a.train_split, a.split_column) if a.train_split else None
        te_rows = read_split(a.test_split, a.split_column) if a.test_split else None
        test_path = a.test or a.train
        tr = read_data(a.train, tr_rows)
        te = read_data(test_path, te_rows)
    except (DataError, ValueError, IndexError) as e:
        print(f"torch_dense.py: error: {e}", file=sys.stderr)
        return 2
    n_features = max(tr[4], te[4])
    n_labels = max(tr[5], te[5])
    tr_labels, tr_ids, tr_vals, tr_off = tr[0], tr[1], tr[2], tr[3]
    te_labels, te_ids, te_vals, te_off = te[0], te[1], te[2], te[3]
    if a.normalize == "l2":
        tr_vals, te_vals = l2_normalize(tr_vals, tr_off), l2_normalize(te_vals, te_off)
    n_train, n_test = len(tr_labels), len(te_labels)
    if a.eval_max:
        n_test = min(n_test, a.eval_max)
    print(f"torch_dense.py: {n_train} train / {n_test} test points, D={n_features}, "
          f"L={n_labels}, network {n_features} -> {a.hidden} -> {n_labels} (full softmax), "
          f"device {a.device}, {torch.get_num_threads()} threads, loaded in "
          f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)

    gen = torch.Generator().manual_seed(a.seed)
    model = Net(n_features, hidden, n_labels, gen).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr, betas=(a.beta1, a.beta2), eps=a.adam_eps)
    run = torch.compile(model) if a.compile else model

    def mixed():
        """The forward pass's precision: autocast to bf16, or nothing for fp32."""
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16,
                              enabled=a.precision == "bf16")
    shuffle = np.random.default_rng(a.seed)
    seconds = 0.0
    for epoch in range(1, a.epochs + 1):
        model.train()
        order = shuffle.permutation(n_train)
        stages = dict(hashing=0.0, active_sets=0.0, forward=0.0, backward=0.0, update=0.0,
                      rebuild=0.0, transfer=0.0)
        loss_sum = 0.0
        t_epoch = time.perf_counter()
        for begin in range(0, n_train, a.batch_size):
            rows = order[begin:begin + a.batch_size]
            t = time.perf_counter()
            ids, off, vals = batch_tensors(rows, tr_ids, tr_vals, tr_off, device)
            t_rows, t_labels, t_weights = target_entries(rows, tr_labels, device)
            sync(device)
            stages["transfer"] += time.perf_counter() - t
            t = time.perf_counter()
            with mixed():
                logits = run(ids, off, vals)
            log_p = torch.log_softmax(logits.float(), dim=1)
            loss_total = -(log_p[t_rows, t_labels] * t_weights).sum()
            loss = loss_total / len(rows)
            sync(device)
            stages["forward"] += time.perf_counter() - t
            t = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            sync(device)
            stages["backward"] += time.perf_counter() - t
            t = time.perf_counter()
            opt.step()
            sync(device)
            stages["update"] += time.perf_counter() - t
            loss_sum += float(loss_total)
        epoch_seconds = time.perf_counter() - t_epoch
        if not math.isfinite(loss_sum):
            print(f"torch_dense.py: training diverged at epoch {epoch}", file=sys.stderr)
            return 1
        seconds += epoch_seconds

        # P@k on the test points, every label scored.
        t_eval = time.perf_counter()
        model.eval()
        hits = np.zeros(5)
        with torch.no_grad(), mixed():
            for begin in range(0, n_test, a.eval_batch):
                rows = np.arange(begin, min(n_test, begin + a.eval_batch))
                ids, off, vals = batch_tensors(rows, te_ids, te_vals, te_off, device)
                top = torch.topk(run(ids, off, vals).float(), min(5, n_labels), dim=1).indices.cpu()
                for i, row in enumerate(rows):
                    y = set(te_labels[row])
                    rel = np.array([int(l) in y for l in top[i].tolist()] + [False] * 5)[:5]
                    hits += np.cumsum(rel)
        eval_seconds = time.perf_counter() - t_eval
        seconds += eval_seconds
        record = {"backend": f"torch-{a.device}", "precision": a.precision,
                  "compiled": a.compile, "epoch": epoch, "seconds": seconds,
                  "epoch_seconds": epoch_seconds, "samples_per_s": n_train / epoch_seconds,
                  "loss": loss_sum / n_train, "mean_active_output": float(n_labels),
                  "peak_rss_bytes": peak_rss_bytes(), "stage_seconds": stages}
        if device.type == "cuda":
            record["peak_gpu_bytes"] = torch.cuda.max_memory_allocated()
        for k in range(1, 6):
            record[f"p@{k}"] = hits[k - 1] / (k * max(n_test, 1))
        record["eval_seconds"] = eval_seconds
        record["eval_points"] = n_test
        with open(a.metrics_out, "a") as f:
            f.write(json.dumps(record) + "\n")
        print(f"epoch {epoch:>3}/{a.epochs}  {epoch_seconds:7.1f} s  "
              f"{record['samples_per_s']:9.0f} samples/s  loss {record['loss']:.4f}  "
              f"P@1 {record['p@1']:.4f} P@3 {record['p@3']:.4f} P@5 {record['p@5']:.4f}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
