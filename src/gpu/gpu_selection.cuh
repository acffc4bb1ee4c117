// The GPU backend's selection seam: one object per sparse output layer that chooses each
// sample's active neurons and owns what that takes (the CPU side's vocabulary: it selects the
// sets for a batch, refreshes what it derives from the weights, and hears when rows changed).
//
//  - lsh_selection (gpu_selection_lsh.cu): the hash functions, the tables (two, for the
//    asynchronous rebuild on a side stream, G-SLIDE's scheme) and the samples' codes;
//  - top_k_selection (gpu_selection_topk.cu): exact scoring of every row in chunks
//    (gpu_topk.cuh's buffers), the sets with the CPU's fill, the fill's correction and the
//    loss through the exact log-partition.
// A dense output layer has none: the backend computes it with cuBLAS (gpu_dense.cuh).
//
// Every call queues work on the backend's stream; select_sets waits once, for the size of
// the sets. A label-sharded output layer would plug in here: a selection over its shard whose
// candidates and log-partition terms are merged across ranks before the sets are built.
#pragma once

#include "gpu_layers.cuh"
#include "gpu_lsh.cuh"

#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <cstdint>
#include <memory>
#include <string>

namespace hslide {
struct layer_config;
}

namespace hslide::gpu {

/// What a selection sees of one batch.
struct selection_batch {
    layer_view layer{};  ///< the output layer as it is now
    uint32_t size = 0;
    const batch_csr* csr = nullptr;  ///< the batch on the device (labels: used when training)
    uint32_t max_labels = 0;         ///< the most labels of a sample (training)
    const float* hidden = nullptr;   ///< size x hidden_stride: the output layer's input
    const __nv_bfloat16* hidden16 = nullptr;  ///< its bf16 copy (bf16 precision), or null
    uint32_t hidden_stride = 0;
    bool training = false;         ///< labels first, a sample without labels gets no set
    uint64_t sample_seed = 0;      ///< training: step_seed(seed, train_sample, step); else the
                                   ///< prediction chunk's seed
    uint64_t fill_pool_seed = 0;   ///< training: step_seed(seed, fill_pool, step)
    cudaEvent_t hashed = nullptr;  ///< recorded once the samples are hashed (none: at the start)
};

/// One sparse output layer's way of choosing its active neurons (see above).
class output_selection {
  public:
    virtual ~output_selection() = default;

    /// The active sets of the batch into `sets` (CSR: offsets, ids, entry_sample; labels first
    /// when training); returns the number of entries (one host wait).
    virtual uint32_t select_sets(const selection_batch& batch, active_sets& sets,
                                 cudaStream_t stream) = 0;
    /// The logits the set's softmax reads: `logits` itself, or a corrected copy (top-k's
    /// fill correction). `sets` and `batch` as the last select_sets gave them.
    virtual float* set_logits(float* logits, const active_sets& sets, uint32_t batch,
                              uint32_t total, cudaStream_t stream) {
        (void)sets, (void)batch, (void)total, (void)stream;
        return logits;
    }
    /// After the set's softmax (labels first): where the selection reports another loss than
    /// the set's (top-k: the full softmax's), writes it into `loss`; returns the per-sample
    /// softmax mass outside the set on the device (summed into the report), or null.
    virtual const float* report_loss(const float* logits, const active_sets& sets,
                                     const batch_csr& batch, float* loss, cudaStream_t stream) {
        (void)logits, (void)sets, (void)batch, (void)loss, (void)stream;
        return nullptr;
    }
    /// Refreshes what it derives from the layer's weights (LSH: the tables; with
    /// `new_functions`, new hash functions first). Nothing for exact top-k.
    virtual void refresh(bool new_functions, const layer_view& layer) {
        (void)new_functions, (void)layer;
    }
    /// The layer's rows were replaced (a whole import): what depends on them is rebuilt now.
    virtual void rows_changed(const layer_view& layer) { (void)layer; }
    /// A step's update is queued: a refresh asked for while another ran may start now.
    virtual void step_queued(const layer_view& layer) { (void)layer; }
    /// Waits for refreshes still running and puts the last in use (LSH's asynchronous rebuild).
    virtual void finish_refresh(const layer_view& layer) { (void)layer; }
    /// GPU seconds of the refreshes landed since the last call; with `adopt_landed`, one that
    /// has landed is put in use first.
    virtual double take_refresh_seconds(bool adopt_landed) {
        (void)adopt_landed;
        return 0;
    }
    /// Whether predictions may score only the sets (LSH), rather than every row exactly.
    virtual bool predicts_from_sets() const { return false; }
    /// Device bytes it holds.
    virtual size_t memory_bytes() const = 0;
    /// How it chooses, for the backend's device line (" (LSH output)", ...).
    virtual std::string describe() const = 0;
};

/// LSH over the output layer (`layer`, whose weights the backend updates in place) with
/// `config`'s tables and active-set settings; `hash_seed` and `step` are the backend's model
/// seed and Adam step, read at each rebuild (new functions move the seed, as on the CPU). With
/// `async_rebuild`, refreshes with the same functions run on a side stream of the lowest
/// priority and are swapped in when done. Builds its tables (both, with async_rebuild) on
/// `stream`, which every later call queues on.
std::unique_ptr<output_selection> make_lsh_selection(const layer_view& layer,
                                                     const layer_config& config,
                                                     uint64_t& hash_seed, const uint64_t& step,
                                                     bool async_rebuild, cudaStream_t stream);

/// Exact top-k over a layer of `rows` rows (config's top_k, min_active fill, fill_pool and
/// fill_correction), scored through `blas` in bf16 (`bf16`) or fp32, by the fused pass where
/// HSLIDE_GPU_TOPK_FUSED=1 applies. Training only: prediction scores exactly without it.
std::unique_ptr<output_selection> make_top_k_selection(uint32_t rows, const layer_config& config,
                                                       bool bf16, cublasHandle_t blas);

}  // namespace hslide::gpu
