// The CUDA backend's prediction (design in gpu_backend_impl.cuh): the k best labels of each
// point of a batch, by exact scoring through training's chunked top-k selection (gpu_topk.cuh:
// memory O(batch x (k + chunk)), no batch x rows matrix) or by LSH scoring of active sets.
#include "gpu_backend_impl.cuh"

#include "cpu/shard_merge.hpp"

namespace hslide::gpu {

void gpu_backend::predict(const batch_view& batch, uint32_t k, scoring_mode scoring,
                          uint32_t* labels, float* scores) {
    HSLIDE_CHECK(k > 0, "top-k must be positive");
    activate();
    complete_deferred_updates();  // the rows as dense Adam would have them
    const drain_on_throw drain(stream_);
    // A top-k layer has no tables: its prediction is exact scoring.
    // exact-bf16 and exact-fast are exact here: the GPU's exact scoring is its tensor cores'
    // already.
    const bool exact =
        !selection_ || !selection_->predicts_from_sets() || scores_every_neuron(scoring);
    HSLIDE_CHECK_KIND(exact || shape_.config.layers[1].active.probes == 0, error_kind::unsupported,
                      "multi-probe LSH scoring (--probes {}) runs on the CPU backend only; use "
                      "--probes 0 or --scoring exact on the GPU",
                      shape_.config.layers[1].active.probes);
    // LSH scoring uses the tables of every rebuild asked for so far, the same for every chunk
    // (evaluations are rare: waiting costs little, and they do not depend on timing).
    if (!exact) selection_->finish_refresh(layers_[1].view());
    const device_layer& out = layers_[1];
    // Exact scoring is training's chunked selection (score_top_k): batch x (k + chunk) floats,
    // never batch x rows. k above the layer keeps every row (the rest padded, as top_k does).
    const uint32_t kept = std::min(k, out.rows);
    HSLIDE_CHECK_KIND(!exact || kept <= top_k_max, error_kind::unsupported,
                      "exact prediction on the GPU keeps at most {} labels a point, not {}",
                      top_k_max, k);
    const uint32_t chunk = 1024;
    for (uint32_t begin = 0; begin < batch.size; begin += chunk) {
        const uint32_t b = std::min(chunk, batch.size - begin);
        const batch_view part{batch.data, batch.rows + begin, b};
        ensure_work(b);
        upload_batch(part, /*check_labels=*/false);
        const batch_csr csr = device_batch(b);
        first_layer_forward(layers_[0].view(), csr, hidden_.data(),
                            use_bf16() ? hidden16_.data() : nullptr, stream_);
        if (exact) {
            if (!blas_) {
                HSLIDE_CUBLAS_CHECK(cublas().create(&blas_));
                HSLIDE_CUBLAS_CHECK(cublas().set_stream(blas_, stream_));
            }
            score_top_k(out.view(), hidden_.data(), use_bf16() ? hidden16_.data() : nullptr,
                        layers_[0].stride, use_bf16(), b, kept, /*chunk=*/0, blas_, exact_,
                        stream_);
            // Rows of `kept` into rows of k; the columns past the layer are padded below.
            HSLIDE_CUDA_CHECK(cudaMemcpy2DAsync(
                labels + size_t(begin) * k, size_t(k) * 4, exact_.best_id.data(), size_t(kept) * 4,
                size_t(kept) * 4, b, cudaMemcpyDeviceToHost, stream_));
            HSLIDE_CUDA_CHECK(cudaMemcpy2DAsync(
                scores + size_t(begin) * k, size_t(k) * 4, exact_.best_score.data(),
                size_t(kept) * 4, size_t(kept) * 4, b, cudaMemcpyDeviceToHost, stream_));
            HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream_));
            for (uint32_t s = 0; s < b; ++s)
                for (uint32_t j = kept; j < k; ++j) {
                    labels[size_t(begin + s) * k + j] = UINT32_MAX;
                    scores[size_t(begin + s) * k + j] = -INFINITY;
                }
            continue;  // a rank's ids are its shard's until the merge below
        }
        // LSH: the samples' active sets (no labels) scored, then their k best.
        top_labels_.reserve(size_t(b) * k, "top-k labels");
        top_scores_.reserve(size_t(b) * k, "top-k scores");
        selection_batch sb;
        sb.layer = out.view();
        sb.size = b;
        sb.hidden = hidden_.data();
        sb.hidden16 = use_bf16() ? hidden16_.data() : nullptr;
        sb.hidden_stride = layers_[0].stride;
        sb.sample_seed =
            derive_seed(step_seed(train_.seed, seed_stream::predict, shape_.adam_step), begin);
        const uint32_t total = selection_->select_sets(sb, active_, stream_);
        logits_.reserve(std::max(total, 1u), "active logits");
        sparse_output_forward(out.view(), hidden_.data(), hidden16_.data(), use_bf16(),
                              active_.ids.data(), active_.entry_sample.data(), total,
                              logits_.data(), stream_);
        top_k(logits_.data(), active_.offsets.data(), active_.ids.data(), 0, b, k,
              top_labels_.data(), top_scores_.data(), stream_, nullptr);
        HSLIDE_CUDA_CHECK(cudaMemcpyAsync(labels + size_t(begin) * k, top_labels_.data(),
                                          size_t(b) * k * 4, cudaMemcpyDeviceToHost, stream_));
        HSLIDE_CUDA_CHECK(cudaMemcpyAsync(scores + size_t(begin) * k, top_scores_.data(),
                                          size_t(b) * k * 4, cudaMemcpyDeviceToHost, stream_));
        HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    // A rank's k best of its rows, merged with the other ranks' into the whole layer's k best
    // (ids of the whole layer), the same on every rank.
    if (shard_.sharded())
        cpu::merge_shard_top_k(*shard_.comm, shard_.first, batch.size, k, labels, scores, nullptr,
                               shard_host_.merge_scratch);
}

}  // namespace hslide::gpu
