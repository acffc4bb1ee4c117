#!/usr/bin/env python3
"""The label-sharded step on paper (bench/scale.md, "The model"): what one training step of N
ranks holds, computes and moves, from the step's shape, and what that predicts at a scale this
machine cannot run. Arithmetic only (no hslide, no MPI); the floor of each part, as
src/gpu/step_floor.hpp models one GPU's step.

    python3 bench/scale_model.py                     # bench/scale.md's tables
    python3 bench/scale_model.py --labels 4e6 --hidden 64 --batch 128 --ranks 2
                                                     # one configuration

What a step moves (today's collectives, src/common/shard/shard_comm.cpp and the CPU backend's
sharded step): four all-gathers, every reduction built on one, each rank sending m_i bytes and
receiving (N - 1) m_i:
  candidates   B (8 k + 8)  ids and scores of the shard's top k, the log-partition (exact
                            top-k only; one all-gather per 256 queries of the batch)
  maximum      4 B          the set's largest logit (set softmax)
  sums         24 B         the sum of exponentials, the kept mass, the labels' logits
  gradient     4 B H        the last hidden layer's gradient, summed in rank order
(a dense output layer has no candidates). A rank receives (N - 1) m a step, m = B (8k + 4H + 36):
linear in N, because every reduction is an all-gather. The alternative the model also prices
("tree"): the gradient as a rank-ordered reduce-scatter plus all-gather (2 (N-1)/N x 4 B H a
rank: each chunk's owner sums the N pieces of it in rank order, the same bits everywhere) and the
candidates merged pairwise up a tree (B (8k + 8) log2 N).
Messages: an all-gather of small m takes log2 N rounds (recursive doubling / Bruck), of large m
N - 1 (ring); Open MPI's tuned component chooses by size.
"""
import argparse
import math

GB = 1e9


def step(labels, ranks, hidden=128, batch=256, k=64, features=135909, per_node=8,
         rank_flops=790e12, rank_bytes=4.3e12, weight_bytes=2, intra=(1e-6, 10e9),
         inter=(2e-6, 25e9), tree=False, dense=False):
    """One step of `ranks` ranks, `per_node` of them a node. rank_flops/rank_bytes: a rank's
    rates (default: an H200 in bf16, as step_floor.hpp); intra/inter: (latency s, bytes/s) of
    shared memory between a node's ranks and of a node's network link."""
    B, H, N = batch, hidden, ranks
    rows = labels / N
    out = {}
    # Memory a rank holds: its rows' fp32 weights, Adam's two moments and the bias (12 bytes a
    # value), a bf16 copy where the products read bf16 (2), and the replicated input layer.
    out["shard_gb"] = rows * (H * (12 + (2 if weight_bytes == 2 else 0)) + 12) / GB
    out["replicated_gb"] = features * H * 12 / GB
    # Compute: exact top-k scores every row of the shard (a GEMM reading the rows once).
    flops = 2 * B * rows * H
    read = rows * H * weight_bytes
    out["compute_s"] = max(flops / rank_flops, read / rank_bytes)
    # Communication.
    cand = 0 if dense else B * (8 * k + 8)
    small = 4 * B + 24 * B
    grad = 8 * B * H  # doubles: each rank's share summed in rank order, rounded once
    m = cand + small + grad
    if tree and N > 1:
        # Reduce-scatter and all-gather of the gradient (log2 N rounds each), the candidates up
        # a tree (log2 N), the maximum and the sums as today.
        recv = 2 * (N - 1) / N * grad + cand * math.log2(N) + (N - 1) * small
        rounds = (5 if cand else 4) * math.log2(N)
    else:
        recv = (N - 1) * m
        rounds = (4 if cand else 3) * (math.log2(N) if N > 1 else 0)
    ring_rounds = (4 if cand else 3) * (N - 1)
    out["sent_per_rank_mb"] = m / 1e6
    out["recv_per_rank_mb"] = recv / 1e6
    nodes = max(1, math.ceil(N / per_node))
    off_node = (N - min(N, per_node)) / max(N - 1, 1)  # share of a rank's peers on other nodes
    local = min(N, per_node)
    lat = inter[0] if nodes > 1 else intra[0]
    # Bandwidth: a node's link carries its ranks' off-node bytes; shared memory the rest.
    out["link_s"] = local * recv * off_node / inter[1] if nodes > 1 else 0.0
    out["shm_s"] = recv * (1 - off_node) / intra[1]
    out["latency_s"] = (rounds, ring_rounds)
    out["lat_s"] = rounds * lat
    out["lat_ring_s"] = ring_rounds * lat
    out["comm_s"] = max(out["link_s"], out["shm_s"]) + out["lat_s"]
    return out


def row(label, r):
    bound = "compute" if r["compute_s"] >= r["comm_s"] else (
        "bandwidth" if max(r["link_s"], r["shm_s"]) >= r["lat_s"] else "latency")
    return (f"| {label} | {r['shard_gb']:.1f} + {r['replicated_gb']:.2f} | {r['sent_per_rank_mb']:.2f} | "
            f"{r['recv_per_rank_mb']:.1f} | {r['latency_s'][0]:.0f} / {r['latency_s'][1]} | "
            f"{1e3 * r['compute_s']:.2f} | {1e3 * max(r['link_s'], r['shm_s']):.2f} | "
            f"{1e3 * r['lat_s']:.3f} ({1e3 * r['lat_ring_s']:.2f}) | {bound} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--labels", type=float)
    ap.add_argument("--ranks", type=int)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--k", type=int, default=64)
    ap.add_argument("--dense", action="store_true")
    ap.add_argument("--cpu", type=float, metavar="GFLOPS",
                    help="CPU ranks of this many GFLOP/s (fp32 products), e.g. 60 for this "
                         "machine's two cores measured (default: H200 ranks)")
    a = ap.parse_args()
    cpu = dict(rank_flops=0.8e12, rank_bytes=200e9, weight_bytes=4)  # a 16-core CPU rank, fp32
    head = ("| configuration | GB a rank (shard + replicated) | MB sent a step | MB received a step | "
            "rounds (log / ring) | compute ms | bandwidth ms | latency ms (ring) | bound |\n"
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    if a.labels:
        print(head)
        rates = dict(cpu, rank_flops=a.cpu * 1e9) if a.cpu else {}
        print(row(f"{a.labels:.3g} labels, {a.ranks} ranks", step(
            a.labels, a.ranks, a.hidden, a.batch, a.k, dense=a.dense, per_node=max(a.ranks, 1),
            **rates)))
        return
    print(head)
    print(row("8 H200 ranks, one node", step(100e6, 8)))
    print(row("8 H200 ranks, one node, tree collectives", step(100e6, 8, tree=True)))
    print(row("8 CPU ranks, one node", step(100e6, 8, **cpu)))
    print(row("64 H200 ranks, 8 nodes, IB 200 Gb/s", step(100e6, 64)))
    print(row("64 H200 ranks, 8 nodes, IB 200 Gb/s, tree collectives", step(100e6, 64, tree=True)))
    print(row("64 H200 ranks, 8 nodes, 25 GbE (TCP, 30 us)", step(100e6, 64, inter=(30e-6, 3e9))))
    print(row("64 CPU ranks, 8 nodes, IB 200 Gb/s", step(100e6, 64, **cpu)))


if __name__ == "__main__":
    main()
