// The CUDA backend's prediction (design in gpu_backend_impl.cuh): exact or LSH scoring of
// a batch in chunks, the k best labels of each point.
#include "gpu_backend_impl.cuh"

namespace hslide::gpu {

void gpu_backend::predict(const batch_view& batch, uint32_t k, scoring_mode scoring,
                          uint32_t* labels, float* scores) {
    HSLIDE_CHECK(k > 0, "top-k must be positive");
    activate();
    complete_deferred_updates();  // the rows as dense Adam would have them
    const drain_on_throw drain(stream_);
    // A top-k layer has no tables: its prediction is exact scoring.
    const bool exact = !lsh_output() || scoring == scoring_mode::exact;
    HSLIDE_CHECK_KIND(exact || shape_.config.layers[1].active.probes == 0, error_kind::unsupported,
                      "multi-probe LSH scoring (--probes {}) runs on the CPU backend only; use "
                      "--probes 0 or --scoring exact on the GPU",
                      shape_.config.layers[1].active.probes);
    // LSH scoring uses the tables of every rebuild asked for so far, the same for every chunk
    // (evaluations are rare: waiting costs little, and they do not depend on timing).
    if (!exact) finish_table_rebuild();
    const device_layer& out = layers_[1];
    // Exact scores of every label are batch x rows floats: score in chunks of at most 1 GiB.
    const uint32_t chunk =
        exact ? uint32_t(std::clamp<uint64_t>((uint64_t{1} << 28) / out.rows, 1, 1024)) : 1024;
    for (uint32_t begin = 0; begin < batch.size; begin += chunk) {
        const uint32_t b = std::min(chunk, batch.size - begin);
        const batch_view part{batch.data, batch.rows + begin, b};
        ensure_work(b);
        upload_batch(part, /*check_labels=*/false);
        const batch_csr csr = device_batch(b);
        first_layer_forward(layers_[0].view(), csr, hidden_.data(),
                            use_bf16() ? hidden16_.data() : nullptr, stream_);
        top_labels_.reserve(size_t(b) * k, "top-k labels");
        top_scores_.reserve(size_t(b) * k, "top-k scores");
        if (exact) {
            if (!blas_) {
                HSLIDE_CUBLAS_CHECK(cublas().create(&blas_));
                HSLIDE_CUBLAS_CHECK(cublas().set_stream(blas_, stream_));
            }
            logits_.reserve(size_t(b) * out.rows, "exact scores");
            dense_logits(b, logits_.data(), CUDA_R_32F, out.rows);
            top_k(logits_.data(), nullptr, nullptr, out.rows, b, k, top_labels_.data(),
                  top_scores_.data(), stream_, out.bias.data());
        } else {
            const layer_config& cfg = shape_.config.layers[1];
            device_hash_.hash_rows(hidden_.data(), layers_[0].stride, b, codes_.data(), stream_);
            const uint64_t seed =
                derive_seed(step_seed(train_.seed, seed_stream::predict, shape_.adam_step), begin);
            const uint32_t total =
                build_active_sets(tables_[front_].view(), codes_.data(), b, nullptr, nullptr, 0,
                                  output_active_params(false, seed), active_, stream_);
            logits_.reserve(std::max(total, 1u), "active logits");
            sparse_output_forward(out.view(), hidden_.data(), hidden16_.data(), use_bf16(),
                                  active_.ids.data(), active_.entry_sample.data(), total,
                                  logits_.data(), stream_);
            top_k(logits_.data(), active_.offsets.data(), active_.ids.data(), 0, b, k,
                  top_labels_.data(), top_scores_.data(), stream_, nullptr);
        }
        HSLIDE_CUDA_CHECK(cudaMemcpyAsync(labels + size_t(begin) * k, top_labels_.data(),
                                          size_t(b) * k * 4, cudaMemcpyDeviceToHost, stream_));
        HSLIDE_CUDA_CHECK(cudaMemcpyAsync(scores + size_t(begin) * k, top_scores_.data(),
                                          size_t(b) * k * 4, cudaMemcpyDeviceToHost, stream_));
        HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }
    // Exact scores took up to 1 GiB that LSH training, which needs a batch's active logits,
    // would otherwise keep from the rest of the model.
    if (exact && sparse_output()) logits_.resize(0, "exact scores");
}

}  // namespace hslide::gpu
