// The exact top-k selection of the GPU backend's output layer (gpu_selection.cuh): each
// sample's k best rows by chunked scoring (or the fused pass), the sets with the CPU's fill,
// the fill's log-Q correction and the loss through the exact log-partition (gpu_topk.cuh).
#include "gpu_selection.cuh"
#include "gpu_topk.cuh"
#include "hslide/config.hpp"
#include "hslide/fill_pool.hpp"

#include <algorithm>
#include <cstdio>

namespace hslide::gpu {

namespace {

class top_k_selection final : public output_selection {
  public:
    top_k_selection(uint32_t rows, const layer_config& config, bool bf16, cublasHandle_t blas)
        : rows_(rows),
          // k is clamped to the layer (as the CPU's): --top-k above it takes every neuron.
          k_(std::min(config.top_k, rows)),
          fill_(std::min(config.active.min_active, rows)),
          fill_pool_(config.fill_pool),
          fill_correction_(config.fill_correction),
          bf16_(bf16),
          blas_(blas) {}

    uint32_t select_sets(const selection_batch& b, active_sets& sets,
                         cudaStream_t stream) override {
        HSLIDE_ASSERT(b.training && b.csr);
        // No hashing: the selection (scoring GEMMs included) counts as active sets.
        if (b.hashed) HSLIDE_CUDA_CHECK(cudaEventRecord(b.hashed, stream));
        // HSLIDE_GPU_TOPK_FUSED=1: the fused scoring pass (gpu_topk.cuh), opt-in until a GPU
        // run has measured it; the cuBLAS pass where it does not apply or its candidates
        // overflowed.
        const uint64_t fallbacks = ws_.fused_fallbacks;
        const bool fused = top_k_fused_requested() && bf16_ &&
                           score_top_k_fused(b.layer, b.hidden16, b.hidden_stride, b.size, k_,
                                             fused_auto_pilot, blas_, ws_, stream);
        if (fallbacks == 0 && ws_.fused_fallbacks == 1)
            std::fprintf(stderr,
                         "hslide: HSLIDE_GPU_TOPK_FUSED: a sample's candidates overflowed; such "
                         "steps take the cuBLAS scoring pass\n");
        if (!fused)
            score_top_k(b.layer, b.hidden, bf16_ ? b.hidden16 : nullptr, b.hidden_stride, bf16_,
                        b.size, k_, /*chunk=*/0, blas_, ws_, stream);
        // The fill's ids are the CPU's (fill_pool.hpp's draw_fill), from the step's seeds and pool.
        const fill_pool pool{b.fill_pool_seed, fill_pool_size(fill_pool_, rows_, fill_, b.size)};
        return build_top_k_sets(b.size, k_, b.csr->label_offsets, b.csr->label_ids, b.max_labels,
                                fill_, rows_, b.sample_seed, pool, ws_, sets, stream);
    }

    float* set_logits(float* logits, const active_sets& sets, uint32_t batch, uint32_t total,
                      cudaStream_t stream) override {
        // The gradient is the softmax over the set (as LSH's; bench/topk.md says why), with
        // the fill raised by its log-Q correction where the layer asks for one.
        if (fill_correction_ <= 0.0f) return logits;
        corrected_.reserve(std::max(total, 1u), "corrected logits");
        apply_fill_correction(logits, sets.offsets.data(), batch, rows_, fill_correction_, ws_,
                              corrected_.data(), stream);
        return corrected_.data();
    }

    const float* report_loss(const float* logits, const active_sets& sets, const batch_csr& batch,
                             float* loss, cudaStream_t stream) override {
        // The loss reported is the full softmax's, through the exact log-partition.
        full_softmax_loss(logits, sets.offsets.data(), batch, ws_, loss, stream);
        return ws_.dropped.data();
    }

    size_t memory_bytes() const override { return ws_.memory_bytes() + corrected_.bytes(); }

    std::string describe() const override {
        return top_k_fused_requested() && bf16_ ? " (top-k output, fused scoring)"
                                                : " (top-k output, cuBLAS scoring)";
    }

  private:
    uint32_t rows_, k_, fill_;
    float fill_pool_, fill_correction_;
    bool bf16_;
    cublasHandle_t blas_;
    top_k_workspace ws_;
    device_array<float> corrected_;  // the logits with the fill's correction
};

}  // namespace

std::unique_ptr<output_selection> make_top_k_selection(uint32_t rows, const layer_config& config,
                                                       bool bf16, cublasHandle_t blas) {
    return std::make_unique<top_k_selection>(rows, config, bf16, blas);
}

}  // namespace hslide::gpu
