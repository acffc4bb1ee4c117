// Exact top-k active sets on the GPU (config.hpp's neuron_selection::top_k; the CPU reference
// is cpu_backend_selection.cpp's select_top_k_sets).
//
// Scoring. The batch's hidden activations are scored against every output row in chunks of
// `chunk` rows: one cuBLAS GEMM per chunk (bf16 tensor cores with fp32 accumulation, or fp32
// sgemm) writes batch x chunk floats, never batch x rows. After each GEMM one thread block
// per sample (top_k_merge_kernel, 512 threads) reads its chunk of scores (+ bias) once, in
// rounds of 16 scores a thread (4 float4 loads where the rows are 16-byte aligned), all in
// flight together (8,192 scores a round):
//  - an online log-sum-exp (online_softmax.hpp's max_sum) over every score: a round's
//    maximum, then one exp a score, combined into the thread's pair, then across the block
//    and into the sample's running pair: after the last chunk the exact log-partition;
//  - a filter against the k-th best entry kept so far (in every thread's registers): the
//    entries that beat it are appended (one shared atomic a warp) to a candidate buffer in
//    shared memory behind the running k best. One barrier a round: if the buffer overflowed,
//    the k kept and the full buffer are sorted by a block-wide bitonic sort (higher score
//    first, ties to the smaller id, NaN never kept: the CPU's select_top_k order), the first
//    k kept, and the round's entries that did not fit (still in registers) are filtered
//    against the new k-th and appended again. At the chunk's end: no candidate, nothing to
//    write; up to 128, each entry's rank among the kept and the candidates is counted (no
//    barrier) and the first k written; more, a bitonic sort. The threshold only rises, so
//    after the first chunk's first round few entries pass it (about k ln(R / k) over the
//    layer; FAISS's GPU k-selection filters against the k-th best the same way): only the
//    first chunk sorts a full buffer (once, 4,096 entries).
// The running k best and the pair live in global memory between chunks: batch x (k + chunk)
// floats of selection memory in all (plus the fill's hash sets below).
//
// Sets (top_k_sets_kernel, one block per sample, 256 threads): the sample's labels first
// (a sample without labels gets no set, as with LSH), then the top-k ids that are not labels,
// then a random fill up to `fill` ids in all (min_active clamped to the layer): the CPU's
// ids, drawn by one thread a sample with fill_pool.hpp's draw_fill (the CPU backend's rejection
// draws from rng(derive_seed(seed, s)), a per-sample hash set of ids as the membership test, in
// shared memory where it fits), and the part after the labels sorted by id (bitonic sort in
// shared memory). Then the CSR arrays, as build_active_sets gives them: the one host wait of
// the step is for their total size. The fill's draws are sequential (a shared-memory probe
// and a few integer operations each: ~0.1 ms for 1,000 ids, the samples' blocks in
// parallel); not yet measured on a GPU against the parallel claims they replaced.
//
// Bytes and FLOPs per training step (batch B, rows R, hidden H, bf16; Amazon-670K's preset:
// B 256, R 670,091, H 128):
//  - GEMM: 2 B R H = 43.9 GFLOP -> 0.056 ms at the H200's ~790 TFLOP/s (bf16 dense);
//  - W read (bf16): R H 2 = 171.5 MB -> 0.040 ms at ~4.3 TB/s (fp32: 343 MB, 0.080 ms; the
//    hidden block, B H 2 = 64 KB, stays in cache);
//  - chunk buffer: written by the GEMM and read by the selection, B R 4 bytes each way =
//    686 MB + 686 MB -> 0.32 ms if it went to HBM. A chunk is a 32 MiB buffer (32,768 rows
//    at B 256), 21 chunks at 670K: a 16 MiB one would stay in the H100's / H200's 50 MB L2
//    between the GEMM and the selection, but twice the launches cost more (measured below);
//  - merge kernel, per 16,384 rows: 16.8 MB of scores and bias (the bias chunk from L2) ->
//    ~4 us at HBM rates, ~2 us from L2; 256 blocks of 512 threads are one wave of two blocks
//    a multiprocessor with 128 KB of loads in flight each (Little's law asks ~30 KB at
//    ~4 TB/s and ~1 us); plus the first chunk's one 4,096-entry sort (~5 us a step);
//  - measured (H200, 2026-11-26, B 256, R 670,091, H 128, bf16, k 64; a CUDA-event timing
//    of score_top_k, the merges also alone on an L2-warm chunk, no Nsight): the merge kernel
//    12.3 us a 16,384-row chunk (1.4 TB/s: above the model's ~5 us, not yet understood; the
//    kernel before, 256 threads, 8 loads a thread, two barriers per 2,048 scores, a sort at
//    every chunk's end: 22.1 us, and 30 us under Nsight Compute with its cache flushes);
//    GEMMs + merges 1.06 ms a step with 16 MiB chunks (before: 1.56), 0.89 ms with 32 MiB
//    (merges 0.42, GEMMs ~0.47: cuBLAS writing the fp32 chunk, not W or the FLOPs, bounds
//    them; under Nsight 9 us a 16,384-row GEMM); k 1024: 1.59 ms;
//  - launches: 2 per chunk (42 a step); a fused GEMM + selection kernel would remove them and
//    the chunk's round trip, the next step toward the ~0.1 ms floor;
//  - selection arithmetic: one compare and one exp per score (B R = 172 M), negligible.
// So the selection should cost about 0.9 ms a step at 670K labels (1,916 steps an epoch:
// ~1.8 s of st.active_sets, from 3.1 s), then the sparse forward/backward/Adam on ~1.1k ids
// a sample as LSH's do: gpu_check.sh's `topk` row at Amazon-670K ~3.5 s an epoch (from 4.85).
// step_floor.hpp models the whole step's floor (its top-k GEMM row is the one above, with the
// chunk buffer kept on chip).
//
// Fused pass (score_top_k_fused, opt-in: HSLIDE_GPU_TOPK_FUSED=1; bf16, hidden width <= 256,
// sm_80 or later): the scores never leave the chip.
//  1. Pilot: rows [0, P) through the cuBLAS GEMM + merge above: the k best of P rows, whose
//     k-th is a lower bound of the layer's k-th (k real scores of distinct rows), and their
//     log-sum-exp pair. P = k R / (k + (8,192 - k) / 4) rounded up to 256 rows (20,480 at
//     Amazon-670K, k 64): a later row passes with a chance of about k / P, k (R - P) / P
//     candidates a sample expected (~2,000: a quarter of the buffer).
//  2. top_k_fused_kernel (256 threads, a persistent grid of the blocks that fit): a block
//     loads a tile of 128 rows (bf16, K = width padded to 16) into shared memory once, then
//     per tile of 64 samples their hidden rows (from L2), 8 warps multiply 32 rows x 32
//     samples each with WMMA bf16 16x16x16 (fp32 accumulators) into a shared score tile; then
//     4 threads a sample take 32 rows each (+ bias): the pair (max across the 4, one exp a
//     score, the sum across the 4) folded into the block's pair of the sample in shared
//     memory (written per block at the end: grid x B pairs), and every score that beats the
//     sample's pilot k-th (better(): higher score, ties to the smaller id, NaN never) appended
//     to its candidates in global memory (one atomic a candidate; counted past the capacity).
//  3. top_k_fused_finish_kernel (one block a sample): log_partition from the pilot's pair and
//     the blocks' (a fixed order); the k kept and the candidates sorted (bitonic, up to 8,192
//     entries of shared memory), the first k written. Exact: a row that is no candidate is
//     beaten by all k kept. A sample with more than 8,192 - k candidates sets a flag: the
//     host reads it (one wait) and runs score_top_k instead, for the whole step.
// Model at Amazon-670K (B 256, R 670,091, H 128, k 64; H200):
//  - pilot: 20,480 rows, one GEMM (21 MB of fp32 written and read back) + one merge with the
//    first chunk's sort: ~30 us (the measured rates above);
//  - fused: W read once, (R - P) H 2 = 166 MB -> 39 us at 4.3 TB/s; 42.6 GFLOP on the tensor
//    cores through mma.sync (WMMA: no wgmma, no pipelined loads) at an assumed ~300-400
//    TFLOP/s -> 0.11-0.14 ms; the hidden tiles re-read from L2, B H 2 per row tile = 333 MB
//    (~30 us at L2 rates, beside the HBM stream); one exp a score, 166 M -> 40 us of the
//    multiprocessors' exp units (16 a clock each); candidates ~4 MB, partials 0.5 MB;
//  - finish: a 4,096-entry sort a sample, ~10 us; the flag's host wait ~10-20 us;
//  - so ~0.2 ms a step (from 0.89: ~1.3 s less an epoch of 1,916 steps: gpu_check.sh's
//    `topk-fused` row ~1.3 s below the `topk` row), bound by the tensor math and the
//    epilogue's exps rather than bytes; the floor (step_floor.hpp's top-k row: R H 2 + B H 2
//    bytes and 2 B R H FLOPs, the scores on chip, as here) is ~0.06 ms.
#pragma once

#include "device_memory.hpp"
#include "gpu_layers.cuh"
#include "gpu_lsh.cuh"
#include "hslide/fill_pool.hpp"
#include "online_softmax.hpp"

#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <cstdint>

namespace hslide::gpu {

/// The largest k the merge kernel takes (its shared buffer is 4,096 entries of 8 bytes: the k
/// kept and at least 2,048 candidates).
constexpr uint32_t top_k_max = 2048;

/// Rows scored per GEMM for a batch of `batch` samples: a buffer of at most 32 MiB
/// (at least 256 rows), never more than the layer.
uint32_t top_k_chunk_rows(uint32_t batch, uint32_t rows);

/// The selection's work arrays, grown to the largest batch.
struct top_k_workspace {
    device_array<float> chunk_scores;   ///< batch x chunk (column-major rows x batch per chunk)
    device_array<float> best_score;     ///< batch x k, best first
    device_array<uint32_t> best_id;     ///< batch x k (UINT32_MAX: none)
    device_array<max_sum> running;      ///< batch: the online log-sum-exp so far
    device_array<float> log_partition;  ///< batch: log sum_r exp(z_r) over every row
    device_array<float> dropped;        ///< batch: softmax mass outside the set (training)
    device_array<uint32_t> set_ids;     ///< the sets' per-sample hash sets of ids
    device_array<uint32_t> drawn_from;  ///< batch: where each set's random fill begins
    // The fused pass's (score_top_k_fused): per (block, sample) log-sum-exp partials, the
    // candidates (batch x capacity), their counts and the overflow flag.
    device_array<max_sum> fused_partials;
    device_array<float> fused_score;
    device_array<uint32_t> fused_id, fused_count, fused_flag;
    uint64_t fused_runs = 0, fused_fallbacks = 0;  ///< host counters: fused passes, overflows
    /// The fused kernel's launch as last set up (blocks 0: the device cannot run it).
    struct fused_setup {
        int device = -1;
        size_t shared = 0;
        bool vec = false;
        uint32_t blocks = 0;
    } fused_launch;

    size_t memory_bytes() const {
        return chunk_scores.bytes() + best_score.bytes() + best_id.bytes() + running.bytes() +
               log_partition.bytes() + dropped.bytes() + set_ids.bytes() + drawn_from.bytes() +
               fused_partials.bytes() + fused_score.bytes() + fused_id.bytes() +
               fused_count.bytes() + fused_flag.bytes();
    }
};

/// Clears the running state of `batch` samples (k best: none; log-sum-exp: nothing seen).
void top_k_begin(uint32_t batch, uint32_t k, top_k_workspace& ws, cudaStream_t stream);

/// Merges one chunk: scores[s * n_cols + j] (+ bias[first_id + j] when bias is not null) is
/// the score of id first_id + j for sample s.
void top_k_merge_chunk(const float* scores, uint32_t n_cols, uint32_t first_id, const float* bias,
                       uint32_t batch, uint32_t k, top_k_workspace& ws, cudaStream_t stream);

/// log_partition[s] = the running pair's max + log(sum).
void top_k_finish(uint32_t batch, top_k_workspace& ws, cudaStream_t stream);

/// The whole scoring pass: chunked GEMMs of the output layer against the hidden rows (bf16
/// when `bf16`: the layer's bf16 copy and hidden16; else fp32), each merged. Leaves the k
/// best per sample (best_id / best_score) and log_partition in `ws`. `chunk` 0: chosen by
/// top_k_chunk_rows. k <= min(top_k_max, rows).
void score_top_k(const layer_view& out, const float* hidden, const __nv_bfloat16* hidden16,
                 uint32_t hidden_stride, bool bf16, uint32_t batch, uint32_t k, uint32_t chunk,
                 cublasHandle_t blas, top_k_workspace& ws, cudaStream_t stream);

/// score_top_k_fused's pilot_rows: chosen from k and the layer (see above).
constexpr uint32_t fused_auto_pilot = 0xffffffffu;

/// The fused scoring pass (bf16 only, hidden width up to 256, sm_80 or later): the first
/// `pilot_rows` rows through score_top_k's cuBLAS GEMM + merge, the rest by
/// top_k_fused_kernel, which never writes the scores (see above). Leaves `ws` as score_top_k
/// does (the same ids in the same order; log_partition within float rounding) and returns
/// true; returns false, with ws in no defined state, where it does not apply (fp32, a wider
/// layer, a pilot covering the layer, too little shared memory) or a sample's candidates
/// overflowed their buffer: the caller then runs score_top_k. One host wait (the flag).
/// The backend takes this path only under HSLIDE_GPU_TOPK_FUSED=1 (read once).
bool score_top_k_fused(const layer_view& out, const __nv_bfloat16* hidden16, uint32_t hidden_stride,
                       uint32_t batch, uint32_t k, uint32_t pilot_rows, cublasHandle_t blas,
                       top_k_workspace& ws, cudaStream_t stream);

/// Whether HSLIDE_GPU_TOPK_FUSED is "1" (read once).
bool top_k_fused_requested();

/// Builds the CSR active sets from ws.best_id (k per sample): labels first (label_offsets /
/// label_ids, batch + 1 offsets; null: no labels, and every sample gets a set), then the
/// top-k ids that are not labels, sorted by id, then random ids up to `fill` in all, sorted
/// by id: sample s's are the CPU backend's, drawn (fill_pool.hpp's draw_fill) from
/// rng(derive_seed(seed, s)) with seed = step_seed(.., seed_stream::train_sample, step),
/// first from `pool` (fill_pool.hpp; size 0: no pool), then from all n_items rows;
/// ws.drawn_from[s] is where sample s's fill begins. Returns the total number of entries (one
/// host wait).
uint32_t build_top_k_sets(uint32_t batch, uint32_t k, const uint32_t* label_offsets,
                          const uint32_t* label_ids, uint32_t max_labels, uint32_t fill,
                          uint32_t n_items, uint64_t seed, const fill_pool& pool,
                          top_k_workspace& ws, active_sets& out, cudaStream_t stream);

/// corrected[e] = logits[e], plus weight * log((rows - f) / (n - f)) on the fill's entries
/// (position >= f = ws.drawn_from[s] in a set of n entries): the sampled softmax's log-Q
/// correction (layer_config::fill_correction), each random neuron standing for the rows
/// outside the labels and the top-k that it was drawn from. One block per sample.
void apply_fill_correction(const float* logits, const uint32_t* offsets, uint32_t batch,
                           uint32_t rows, float weight, const top_k_workspace& ws, float* corrected,
                           cudaStream_t stream);

/// The full-softmax cross-entropy of each labelled sample through ws.log_partition, over its
/// set's logits (labels first): loss[s] = -1/|y| sum_labels (z - logZ); ws.dropped[s] =
/// max(0, 1 - sum_set exp(z - logZ)). Samples without labels: 0 and 0.
void full_softmax_loss(const float* logits, const uint32_t* offsets, const batch_csr& batch,
                       top_k_workspace& ws, float* loss, cudaStream_t stream);

}  // namespace hslide::gpu
