// The test entry points of gpu_testing.hpp: copy in, run the GPU pieces, copy out.
#include "cublas_loader.hpp"
#include "gpu_dense.cuh"
#include "gpu_layers.cuh"
#include "gpu_lsh.cuh"
#include "gpu_testing.hpp"
#include "gpu_topk.cuh"

#include <algorithm>

namespace hslide::gpu::testing {

namespace {
template <class T>
device_array<T> to_device(const std::vector<T>& v, const char* what) {
    device_array<T> d(std::max<size_t>(v.size(), 1), what);
    if (!v.empty())
        HSLIDE_CUDA_CHECK(
            cudaMemcpy(d.data(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}
// A cuBLAS handle for one test call, destroyed however the call ends.
struct blas_handle {
    cublasHandle_t handle = nullptr;
    blas_handle() { HSLIDE_CUBLAS_CHECK(cublas().create(&handle)); }
    ~blas_handle() { cublas().destroy(handle); }
    blas_handle(const blas_handle&) = delete;
    blas_handle& operator=(const blas_handle&) = delete;
};

template <class T>
std::vector<T> to_host(const T* d, size_t n) {
    std::vector<T> v(n);
    if (n) HSLIDE_CUDA_CHECK(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}

// A scoring test's layer (weights and bias) and batch of hidden rows on the device, with
// their bf16 copies where asked.
struct scoring_inputs {
    device_array<float> weights, bias, hidden;
    device_array<__nv_bfloat16> weights16, hidden16;
    bool bf16;
    uint32_t rows, width, stride;

    scoring_inputs(const std::vector<float>& w, const std::vector<float>& b,
                   const std::vector<float>& h, uint32_t rows_, uint32_t width_, uint32_t stride_,
                   bool bf16_)
        : weights(to_device(w, "test weights")),
          bias(to_device(b, "test bias")),
          hidden(to_device(h, "test hidden")),
          weights16(std::max<size_t>(w.size(), 1), "test bf16"),
          hidden16(std::max<size_t>(h.size(), 1), "test bf16"),
          bf16(bf16_),
          rows(rows_),
          width(width_),
          stride(stride_) {
        if (!bf16) return;
        to_bf16(weights.data(), weights16.data(), w.size(), nullptr);
        to_bf16(hidden.data(), hidden16.data(), h.size(), nullptr);
    }
    // The layer as the scoring passes read it (no Adam state).
    layer_view view() {
        return layer_view::for_scoring(weights.data(), bias.data(),
                                       bf16 ? weights16.data() : nullptr, rows, width, stride);
    }
};

// A scoring pass's results: each sample's k best ids and scores, and its log-partition.
void take_top_k(const top_k_workspace& ws, uint32_t batch, uint32_t k,
                std::vector<uint32_t>& labels, std::vector<float>& top_scores,
                std::vector<float>& log_partition) {
    labels = to_host(ws.best_id.data(), size_t(batch) * k);
    top_scores = to_host(ws.best_score.data(), size_t(batch) * k);
    log_partition = to_host(ws.log_partition.data(), batch);
}
}  // namespace

std::vector<uint32_t> hash_rows(const hash_function_data& functions, const std::vector<float>& rows,
                                uint32_t n_rows, size_t row_stride) {
    device_hash_family family;
    family.upload(functions, nullptr);
    const auto d_rows = to_device(rows, "test rows");
    device_array<uint32_t> codes(size_t(n_rows) * functions.L, "test codes");
    family.hash_rows(d_rows.data(), row_stride, n_rows, codes.data(), nullptr);
    HSLIDE_CUDA_CHECK(cudaDeviceSynchronize());
    return to_host(codes.data(), codes.size());
}

std::vector<std::map<uint32_t, std::vector<uint32_t>>> build_tables(
    const std::vector<uint32_t>& codes, uint32_t n_items, const lsh_config& config, uint64_t seed) {
    const auto d_codes = to_device(codes, "test codes");
    device_tables tables;
    table_build_scratch scratch;
    tables.build(d_codes.data(), n_items, config.L, config.K * config.bits_per_hash,
                 config.bucket_capacity, seed, scratch, nullptr);
    std::vector<uint64_t> keys;
    std::vector<uint32_t> begin, items;
    tables.download(keys, begin, items, nullptr);
    std::vector<std::map<uint32_t, std::vector<uint32_t>>> out(size_t(config.L));
    const int code_bits = config.K * config.bits_per_hash;
    for (size_t b = 0; b < keys.size(); ++b) {
        auto& bucket =
            out[size_t(keys[b] >> code_bits)][uint32_t(keys[b] & ((uint64_t{1} << code_bits) - 1))];
        bucket.assign(items.begin() + begin[b], items.begin() + begin[b + 1]);
        std::sort(bucket.begin(), bucket.end());
    }
    return out;
}

std::vector<std::vector<uint32_t>> query_active_sets(const std::vector<uint32_t>& item_codes,
                                                     uint32_t n_items, const lsh_config& config,
                                                     const active_set_config& active,
                                                     const std::vector<uint32_t>& sample_codes,
                                                     const std::vector<uint32_t>& label_offsets,
                                                     const std::vector<uint32_t>& label_ids,
                                                     uint64_t seed) {
    const auto d_items = to_device(item_codes, "test codes");
    device_tables tables;
    table_build_scratch scratch;
    tables.build(d_items.data(), n_items, config.L, config.K * config.bits_per_hash,
                 config.bucket_capacity, seed, scratch, nullptr);
    const uint32_t n_samples = uint32_t(sample_codes.size() / size_t(config.L));
    const auto d_samples = to_device(sample_codes, "test codes");
    const auto d_offsets = to_device(label_offsets, "test labels");
    const auto d_labels = to_device(label_ids, "test labels");
    uint32_t max_labels = 0;
    for (size_t s = 0; s + 1 < label_offsets.size(); ++s)
        max_labels = std::max(max_labels, label_offsets[s + 1] - label_offsets[s]);
    const active_set_params p =
        active_set_params::of(n_items, config, active, !label_offsets.empty(), seed);
    hslide::gpu::active_sets sets;
    build_active_sets(tables.view(), d_samples.data(), n_samples, d_offsets.data(), d_labels.data(),
                      max_labels, p, sets, nullptr);
    HSLIDE_CUDA_CHECK(cudaDeviceSynchronize());
    const auto offsets = to_host(sets.offsets.data(), size_t(n_samples) + 1);
    const auto ids = to_host(sets.ids.data(), offsets.back());
    std::vector<std::vector<uint32_t>> out(n_samples);
    for (uint32_t s = 0; s < n_samples; ++s) {
        out[s].assign(ids.begin() + offsets[s], ids.begin() + offsets[s + 1]);
        std::sort(out[s].begin(), out[s].end());
    }
    return out;
}

void top_k(const std::vector<float>& scores, const std::vector<uint32_t>& offsets,
           const std::vector<uint32_t>& ids, uint32_t n_columns, uint32_t batch, uint32_t k,
           const std::vector<float>& bias, std::vector<uint32_t>& labels,
           std::vector<float>& top_scores) {
    const auto d_scores = to_device(scores, "test scores");
    const auto d_offsets = to_device(offsets, "test offsets");
    const auto d_ids = to_device(ids, "test ids");
    const auto d_bias = to_device(bias, "test bias");
    device_array<uint32_t> d_labels(size_t(batch) * k, "test top-k labels");
    device_array<float> d_top(size_t(batch) * k, "test top-k scores");
    gpu::top_k(d_scores.data(), offsets.empty() ? nullptr : d_offsets.data(),
               offsets.empty() ? nullptr : d_ids.data(), n_columns, batch, k, d_labels.data(),
               d_top.data(), nullptr, bias.empty() ? nullptr : d_bias.data());
    HSLIDE_CUDA_CHECK(cudaDeviceSynchronize());
    labels = to_host(d_labels.data(), d_labels.size());
    top_scores = to_host(d_top.data(), d_top.size());
}

void top_k_chunked(const std::vector<float>& scores, uint32_t n, uint32_t batch, uint32_t k,
                   uint32_t chunk, const std::vector<float>& bias, std::vector<uint32_t>& labels,
                   std::vector<float>& top_scores, std::vector<float>& log_partition) {
    const auto d_bias = to_device(bias, "test bias");
    top_k_workspace ws;
    top_k_begin(batch, k, ws, nullptr);
    std::vector<float> part;
    device_array<float> d_part(size_t(batch) * std::max(chunk, 1u), "test chunk");
    for (uint32_t c0 = 0; c0 < n; c0 += chunk) {
        const uint32_t m = std::min(chunk, n - c0);
        part.resize(size_t(batch) * m);
        for (uint32_t s = 0; s < batch; ++s)
            std::copy_n(scores.begin() + size_t(s) * n + c0, m, part.begin() + size_t(s) * m);
        HSLIDE_CUDA_CHECK(
            cudaMemcpy(d_part.data(), part.data(), part.size() * 4, cudaMemcpyHostToDevice));
        top_k_merge_chunk(d_part.data(), m, c0, bias.empty() ? nullptr : d_bias.data(), batch, k,
                          ws, nullptr);
        HSLIDE_CUDA_CHECK(cudaDeviceSynchronize());  // d_part is refilled
    }
    top_k_finish(batch, ws, nullptr);
    HSLIDE_CUDA_CHECK(cudaDeviceSynchronize());
    take_top_k(ws, batch, k, labels, top_scores, log_partition);
}

void score_top_k(const std::vector<float>& weights, const std::vector<float>& bias, uint32_t rows,
                 uint32_t width, uint32_t stride, const std::vector<float>& hidden, uint32_t batch,
                 bool bf16, uint32_t k, uint32_t chunk, std::vector<uint32_t>& labels,
                 std::vector<float>& top_scores, std::vector<float>& log_partition) {
    scoring_inputs in(weights, bias, hidden, rows, width, stride, bf16);
    const blas_handle blas;
    top_k_workspace ws;
    score_top_k(in.view(), in.hidden.data(), in.hidden16.data(), stride, bf16, batch, k, chunk,
                blas.handle, ws, nullptr);
    HSLIDE_CUDA_CHECK(cudaDeviceSynchronize());
    take_top_k(ws, batch, k, labels, top_scores, log_partition);
}

std::vector<std::vector<uint32_t>> top_k_sets(const std::vector<uint32_t>& best, uint32_t k,
                                              uint32_t batch,
                                              const std::vector<uint32_t>& label_offsets,
                                              const std::vector<uint32_t>& label_ids, uint32_t fill,
                                              uint32_t n_items, uint64_t seed,
                                              std::vector<uint32_t>* drawn_from,
                                              const fill_pool& pool) {
    top_k_workspace ws;
    ws.best_id.reserve(std::max<size_t>(best.size(), 1), "test best ids");
    HSLIDE_CUDA_CHECK(
        cudaMemcpy(ws.best_id.data(), best.data(), best.size() * 4, cudaMemcpyHostToDevice));
    const auto d_offsets = to_device(label_offsets, "test labels");
    const auto d_labels = to_device(label_ids, "test labels");
    uint32_t max_labels = 0;
    for (size_t s = 0; s + 1 < label_offsets.size(); ++s)
        max_labels = std::max(max_labels, label_offsets[s + 1] - label_offsets[s]);
    const bool with_labels = !label_offsets.empty();
    hslide::gpu::active_sets sets;
    build_top_k_sets(batch, k, with_labels ? d_offsets.data() : nullptr,
                     with_labels ? d_labels.data() : nullptr, max_labels, fill, n_items, seed, pool,
                     ws, sets, nullptr);
    HSLIDE_CUDA_CHECK(cudaDeviceSynchronize());
    const auto offsets = to_host(sets.offsets.data(), size_t(batch) + 1);
    const auto ids = to_host(sets.ids.data(), offsets.back());
    if (drawn_from) *drawn_from = to_host(ws.drawn_from.data(), batch);
    std::vector<std::vector<uint32_t>> out(batch);
    for (uint32_t s = 0; s < batch; ++s)
        out[s].assign(ids.begin() + offsets[s], ids.begin() + offsets[s + 1]);
    return out;
}

namespace {

// The host layer's arrays on the device, and its view.
struct device_host_layer {
    device_array<float> weights, adam_m, adam_v, bias, bias_m, bias_v;
    device_array<uint16_t> weights16;
    layer_view view;

    explicit device_host_layer(const host_layer& h)
        : weights(to_device(h.weights, "test weights")),
          adam_m(to_device(h.adam_m, "test weights")),
          adam_v(to_device(h.adam_v, "test weights")),
          bias(to_device(h.bias, "test bias")),
          bias_m(to_device(h.bias_m, "test bias")),
          bias_v(to_device(h.bias_v, "test bias")),
          weights16(to_device(h.weights16, "test bf16 weights")) {
        view = layer_view{
            weights.data(),
            adam_m.data(),
            adam_v.data(),
            bias.data(),
            bias_m.data(),
            bias_v.data(),
            h.weights16.empty() ? nullptr : reinterpret_cast<__nv_bfloat16*>(weights16.data()),
            h.rows,
            h.stride,
            h.stride};
    }
};

}  // namespace

void rows_adam(host_layer& layer, bool first_layer, const std::vector<uint32_t>& entry_row,
               const std::vector<uint32_t>& entry_sample, const std::vector<float>& scale,
               const std::vector<float>& vectors, float inv_batch, const host_adam& adam) {
    const uint32_t n = uint32_t(entry_row.size());
    std::vector<uint32_t> order(n);
    for (uint32_t e = 0; e < n; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(),
                     [&](uint32_t a, uint32_t b) { return entry_row[a] < entry_row[b]; });
    std::vector<uint32_t> unique, begin;
    for (uint32_t k = 0; k < n; ++k)
        if (k == 0 || entry_row[order[k]] != entry_row[order[k - 1]]) {
            unique.push_back(entry_row[order[k]]);
            begin.push_back(k);
        }
    begin.push_back(n);
    const std::vector<uint32_t> n_unique{uint32_t(unique.size())};
    device_host_layer d(layer);
    const auto d_unique = to_device(unique, "test rows");
    const auto d_begin = to_device(begin, "test rows");
    const auto d_n_unique = to_device(n_unique, "test rows");
    const auto d_order = to_device(order, "test rows");
    const auto d_sample = to_device(entry_sample, "test rows");
    const auto d_scale = to_device(scale, "test rows");
    const auto d_vectors = to_device(vectors, "test rows");
    const adam_params a{adam.lr, adam.beta1, adam.beta2, adam.eps, adam.c1, adam.c2};
    if (first_layer)
        first_layer_rows_adam(d.view, d_unique.data(), d_begin.data(), d_n_unique.data(), n,
                              d_order.data(), d_sample.data(), d_scale.data(), d_vectors.data(),
                              inv_batch, a, nullptr);
    else
        output_rows_adam(d.view, d_unique.data(), d_begin.data(), d_n_unique.data(), n,
                         d_order.data(), d_sample.data(), d_scale.data(), d_vectors.data(),
                         inv_batch, a, nullptr);
    HSLIDE_CUDA_CHECK(cudaDeviceSynchronize());
    layer.weights = to_host(d.weights.data(), layer.weights.size());
    layer.adam_m = to_host(d.adam_m.data(), layer.adam_m.size());
    layer.adam_v = to_host(d.adam_v.data(), layer.adam_v.size());
    layer.bias = to_host(d.bias.data(), layer.bias.size());
    layer.bias_m = to_host(d.bias_m.data(), layer.bias_m.size());
    layer.bias_v = to_host(d.bias_v.data(), layer.bias_v.size());
    layer.weights16 = to_host(d.weights16.data(), layer.weights16.size());
}

std::vector<float> sparse_output_backward(const host_layer& layer, bool bf16,
                                          const std::vector<uint32_t>& offsets,
                                          const std::vector<uint32_t>& ids,
                                          const std::vector<float>& delta,
                                          const std::vector<float>& hidden, uint32_t batch) {
    device_host_layer d(layer);
    const auto d_offsets = to_device(offsets, "test offsets");
    const auto d_ids = to_device(ids, "test ids");
    const auto d_delta = to_device(delta, "test deltas");
    const auto d_hidden = to_device(hidden, "test hidden");
    device_array<float> d_grad(std::max<size_t>(size_t(batch) * layer.stride, 1), "test grad");
    gpu::sparse_output_backward(d.view, bf16, d_offsets.data(), d_ids.data(), d_delta.data(),
                                d_hidden.data(), batch, d_grad.data(), nullptr);
    HSLIDE_CUDA_CHECK(cudaDeviceSynchronize());
    return to_host(d_grad.data(), size_t(batch) * layer.stride);
}

std::vector<double> hidden_gradient_share(const host_layer& layer, uint32_t width, bool bf16,
                                          const std::vector<uint32_t>& offsets,
                                          const std::vector<uint32_t>& ids,
                                          const std::vector<float>& delta, uint32_t batch) {
    device_host_layer d(layer);
    d.view.width = width;
    const auto d_offsets = to_device(offsets, "test offsets");
    const auto d_ids = to_device(ids, "test ids");
    const auto d_delta = to_device(delta, "test deltas");
    device_array<double> d_share(std::max<size_t>(size_t(batch) * width, 1), "test share");
    gpu::hidden_gradient_share_f64(d.view, bf16, d_offsets.data(), d_ids.data(), d_delta.data(),
                                   batch, d_share.data(), nullptr);
    HSLIDE_CUDA_CHECK(cudaDeviceSynchronize());
    return to_host(d_share.data(), size_t(batch) * width);
}

uint32_t dense_ld(uint32_t rows) {
    return dense_leading_dimension(rows);
}

void dense_softmax_loss(const std::vector<float>& logits, const std::vector<float>& bias,
                        uint32_t rows, uint32_t batch, const std::vector<uint32_t>& label_offsets,
                        const std::vector<uint32_t>& label_ids, bool bf16,
                        std::vector<float>& delta, std::vector<float>& bias_gradient,
                        std::vector<float>& loss, bool logistic) {
    const uint32_t ld = dense_leading_dimension(rows);
    HSLIDE_CHECK(logits.size() == size_t(batch) * ld && bias.size() == rows &&
                     label_offsets.size() == size_t(batch) + 1,
                 "dense_softmax_loss: inconsistent test inputs");
    const auto d_bias = to_device(bias, "test bias");
    const auto d_offsets = to_device(label_offsets, "test labels");
    const auto d_labels = to_device(label_ids, "test labels");
    const size_t n = size_t(batch) * ld;
    device_array<float> d_bias_gradient(rows, "test bias gradient");
    device_array<float> d_loss(batch, "test losses");
    device_array<float> work(dense_softmax_work_floats(batch, rows), "test work");
    batch_csr csr{};
    csr.label_offsets = d_offsets.data();
    csr.label_ids = d_labels.data();
    csr.size = batch;
    // Logits and deltas of type T (bf16: the logits rounded to nearest, the deltas widened).
    auto run = [&](auto type) {
        using T = decltype(type);
        std::vector<T> typed(n);
        for (size_t i = 0; i < n; ++i) typed[i] = T(logits[i]);
        const auto d_logits = to_device(typed, "test logits");
        device_array<T> d_delta(n, "test deltas");
        (logistic ? &gpu::dense_logistic_loss<T>
                  : &gpu::dense_softmax_loss<T>)(d_logits.data(), d_bias.data(), rows, ld, csr,
                                                 1.0f / float(batch), d_delta.data(),
                                                 d_bias_gradient.data(), d_loss.data(), work.data(),
                                                 nullptr);
        HSLIDE_CUDA_CHECK(cudaDeviceSynchronize());
        const auto out = to_host(d_delta.data(), n);
        delta.assign(n, 0.0f);
        for (size_t i = 0; i < n; ++i) delta[i] = float(out[i]);
    };
    if (bf16)
        run(__nv_bfloat16{});
    else
        run(float{});
    bias_gradient = to_host(d_bias_gradient.data(), rows);
    loss = to_host(d_loss.data(), batch);
}

void set_loss(const std::vector<float>& logits, const std::vector<float>& bias,
              const std::vector<uint32_t>& offsets, uint32_t n_columns,
              const std::vector<uint32_t>& label_offsets, const std::vector<uint32_t>& label_ids,
              bool logistic, std::vector<float>& delta, std::vector<float>& loss) {
    HSLIDE_CHECK(!label_offsets.empty(), "set_loss: no label offsets");
    const uint32_t batch = uint32_t(label_offsets.size() - 1);
    HSLIDE_CHECK((offsets.empty()
                      ? logits.size() == size_t(batch) * n_columns && bias.size() == n_columns
                      : offsets.size() == label_offsets.size() && logits.size() == offsets.back()),
                 "set_loss: inconsistent test inputs");
    auto d_logits = to_device(logits, "test logits");
    const auto d_bias = to_device(bias, "test bias");
    const auto d_offsets = to_device(offsets, "test offsets");
    const auto d_label_offsets = to_device(label_offsets, "test labels");
    const auto d_labels = to_device(label_ids, "test labels");
    device_array<float> d_delta(std::max<size_t>(logits.size(), 1), "test deltas");
    device_array<float> d_loss(std::max<uint32_t>(batch, 1), "test losses");
    batch_csr csr{};
    csr.label_offsets = d_label_offsets.data();
    csr.label_ids = d_labels.data();
    csr.size = batch;
    const uint32_t* o = offsets.empty() ? nullptr : d_offsets.data();
    const float* b = offsets.empty() ? d_bias.data() : nullptr;
    (logistic ? &gpu::logistic_loss : &gpu::softmax_loss)(d_logits.data(), b, o, n_columns,
                                                          /*labels_first=*/!offsets.empty(), csr,
                                                          d_delta.data(), d_loss.data(), nullptr);
    HSLIDE_CUDA_CHECK(cudaDeviceSynchronize());
    delta = to_host(d_delta.data(), logits.size());
    loss = to_host(d_loss.data(), batch);
}

std::vector<float> fill_corrected(const std::vector<float>& logits,
                                  const std::vector<uint32_t>& offsets,
                                  const std::vector<uint32_t>& drawn_from, uint32_t rows,
                                  float weight) {
    const uint32_t batch = uint32_t(offsets.size() - 1);
    top_k_workspace ws;
    ws.drawn_from.reserve(std::max<size_t>(batch, 1), "test fill starts");
    HSLIDE_CUDA_CHECK(cudaMemcpy(ws.drawn_from.data(), drawn_from.data(), size_t(batch) * 4,
                                 cudaMemcpyHostToDevice));
    const auto d_logits = to_device(logits, "test logits");
    const auto d_offsets = to_device(offsets, "test offsets");
    device_array<float> corrected;
    corrected.reserve(std::max<size_t>(logits.size(), 1), "test corrected logits");
    apply_fill_correction(d_logits.data(), d_offsets.data(), batch, rows, weight, ws,
                          corrected.data(), nullptr);
    HSLIDE_CUDA_CHECK(cudaDeviceSynchronize());
    return to_host(corrected.data(), logits.size());
}

static_assert(fused_auto_pilot == gpu::fused_auto_pilot, "the tests' name for the same value");

bool score_top_k_fused(const std::vector<float>& weights, const std::vector<float>& bias,
                       uint32_t rows, uint32_t width, uint32_t stride,
                       const std::vector<float>& hidden, uint32_t batch, uint32_t k,
                       uint32_t pilot_rows, std::vector<uint32_t>& labels,
                       std::vector<float>& top_scores, std::vector<float>& log_partition) {
    scoring_inputs in(weights, bias, hidden, rows, width, stride, /*bf16=*/true);  // its only form
    const blas_handle blas;
    top_k_workspace ws;
    const bool ran = gpu::score_top_k_fused(in.view(), in.hidden16.data(), stride, batch, k,
                                            pilot_rows, blas.handle, ws, nullptr);
    HSLIDE_CUDA_CHECK(cudaDeviceSynchronize());
    labels.clear(), top_scores.clear(), log_partition.clear();
    if (!ran) return false;
    take_top_k(ws, batch, k, labels, top_scores, log_partition);
    return true;
}

size_t largest_device_allocation() {
    return gpu::largest_device_allocation();
}
void reset_largest_device_allocation() {
    gpu::reset_largest_device_allocation();
}

}  // namespace hslide::gpu::testing
