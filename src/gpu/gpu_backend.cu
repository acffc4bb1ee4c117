// The CUDA backend (design in gpu_backend_impl.cuh): creation, whole-state export and
// import, its report of itself, and the factory functions of gpu_backend.hpp.
#include "gpu_backend_impl.cuh"

#include <fmt/format.h>

namespace hslide::gpu {

gpu_backend::gpu_backend(model_state initial, const train_config& train, int device,
                         precision_mode precision, bool dense_output, bool async_rebuild,
                         output_shard shard)
    : train_(train),
      device_(device),
      precision_(precision),
      async_rebuild_(async_rebuild),
      shard_(std::move(shard)) {
    offer_rows(this);
    validate(initial.config);
    validate(initial.config, train);
    const model_config& config = initial.config;
    HSLIDE_CHECK_KIND(config.layers.size() == 2, error_kind::unsupported,
                      "the GPU backend trains networks with one hidden layer for now; this one "
                      "has {} (use --backend cpu for deeper networks)",
                      config.layers.size() - 1);
    HSLIDE_CHECK_KIND(initial.layers[0].stride <= 1024, error_kind::unsupported,
                      "the GPU backend supports hidden layers of at most 1024 neurons, got {}",
                      initial.layers[0].width);
    HSLIDE_CHECK_KIND(train.adam_moments == moment_storage::fp32, error_kind::unsupported,
                      "--adam-moments {} is CPU-only so far; the GPU backend keeps fp32 moments",
                      to_string(train.adam_moments));
    HSLIDE_CHECK_KIND(train.adam != adam_mode::dense && train.adam != adam_mode::catch_up,
                      error_kind::unsupported,
                      "--adam {} is CPU-only so far; the GPU backend takes sparse, input-dense "
                      "and input-catch-up",
                      to_string(train.adam));
    const bool top_k = !dense_output && config.selection(1) == neuron_selection::top_k;
    dense_output_ = dense_output || (!config.uses_lsh(1) && !top_k);
    // k is clamped to the layer (as the CPU's and the top-k selection's k): --top-k above the
    // layer's size takes every neuron, and only the clamped k has to fit the merge buffer.
    HSLIDE_CHECK_KIND(
        !top_k || std::min(config.layers[1].top_k, config.layers[1].size) <= top_k_max,
        error_kind::unsupported, "the GPU backend selects at most {} neurons by top-k (--top-k {})",
        top_k_max, config.layers[1].top_k);

    // Only this backend's device is touched (list_gpus would create a context on every GPU).
    int n_gpus = 0;
    const cudaError_t count_status = cudaGetDeviceCount(&n_gpus);
    cudaGetLastError();  // a failed count is reported below, not left for a later check
    HSLIDE_CHECK_KIND(count_status == cudaSuccess && n_gpus > 0, error_kind::unsupported,
                      "--backend={}: no usable GPU on this machine ({})",
                      to_string(dense_output ? backend_kind::gpu_dense : backend_kind::gpu),
                      count_status != cudaSuccess ? cudaGetErrorString(count_status)
                                                  : "the CUDA runtime sees no device");
    HSLIDE_CHECK_KIND(device >= 0 && device < n_gpus, error_kind::invalid_argument,
                      "GPU {} does not exist (this machine has {})", device, n_gpus);
    cudaDeviceProp properties{};
    HSLIDE_CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
    device_name_ = properties.name;
    handles_.device = device;
    activate();
    HSLIDE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    for (auto& set : handles_.events)
        for (auto& e : set) HSLIDE_CUDA_CHECK(cudaEventCreate(&e));
    for (auto& e : handles_.staged)
        HSLIDE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    if (dense_output_ || top_k) {
        HSLIDE_CUBLAS_CHECK(cublas().create(&blas_));
        HSLIDE_CUBLAS_CHECK(cublas().set_stream(blas_, stream_));
    }

    shape_ = model_state::layout(config);
    if (shard_.sharded()) {  // a rank's rows of the output layer
        shape_.layers[1].rows = shard_.count;
        shape_.output_first = shard_.first;
        check_shardable();
    }
    shape_.adam_step = initial.adam_step;
    shape_.hash_seeds = initial.hash_seeds;
    shape_.check_same_layout(initial);
    for (size_t l = 0; l < 2; ++l) upload_layer(l, initial.layers[l], /*with_optimizer=*/true);
    initial = model_state{};  // the host copy is no longer needed: free it before tables
    reset_changed_rows();
    if (catches_up_inputs())
        input_catch_up_.start(train_.adam_beta1, train_.adam_beta2, train_.adam_epsilon,
                              layers_[0].rows, shape_.adam_step, stream_);
    // The output layer's selection (none for a dense layer): LSH builds its tables now.
    // A rank's exact top-k scores its shard through exact_ (gpu_backend_shard.cu).
    const layer_config& output = shape_.config.layers[1];
    if (top_k && !shard_.sharded())
        selection_ = make_top_k_selection(layers_[1].rows, output, use_bf16(), blas_);
    else if (!top_k && !dense_output_)
        selection_ = make_lsh_selection(layers_[1].view(), output, shape_.hash_seeds[1],
                                        shape_.adam_step, async_rebuild_, stream_);
    HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

gpu_backend::~gpu_backend() {
    // Work in flight may still read the device arrays, which are freed before handles_.
    cudaSetDevice(device_);
    if (stream_) cudaStreamSynchronize(stream_);
    selection_.reset();  // waits for its own side stream, if any
}

void gpu_backend::upload_layer(size_t l, const layer_state& src, bool with_optimizer) {
    // `src` has this layer's shape: the constructor and import_state check the layout first.
    device_layer& dst = layers_[l];
    const layer_state& shape = shape_.layers[l];
    dst.rows = shape.rows;
    dst.width = shape.width;
    dst.stride = shape.stride;
    const size_t n = size_t(shape.rows) * shape.stride;
    // Layer 0's bias is one per hidden neuron, a later layer's one per row.
    const size_t n_bias = l == 0 ? shape.width : shape.rows;
    HSLIDE_CHECK(src.weights.size() == n && src.bias.size() == n_bias,
                 "imported layer {} has {} weights and {} biases, expected {} and {}", l,
                 src.weights.size(), src.bias.size(), n, n_bias);
    const bool has_moments = src.adam_m.size() == n && src.adam_v.size() == n &&
                             src.bias_m.size() == n_bias && src.bias_v.size() == n_bias;
    dst.weights.resize(n, l == 0 ? "first-layer weights" : "output-layer weights");
    dst.bias.resize(n_bias, "biases");
    const bool fresh = dst.adam_m.size() != n;
    dst.adam_m.resize(n, "Adam moments");
    dst.adam_v.resize(n, "Adam moments");
    dst.bias_m.resize(n_bias, "Adam moments");
    dst.bias_v.resize(n_bias, "Adam moments");
    auto put = [&](float* to, const float* from, size_t count) {
        HSLIDE_CUDA_CHECK(
            cudaMemcpyAsync(to, from, count * sizeof(float), cudaMemcpyHostToDevice, stream_));
    };
    put(dst.weights.data(), src.weights.data(), n);
    put(dst.bias.data(), src.bias.data(), n_bias);
    if (with_optimizer && has_moments) {
        put(dst.adam_m.data(), src.adam_m.data(), n);
        put(dst.adam_v.data(), src.adam_v.data(), n);
        put(dst.bias_m.data(), src.bias_m.data(), n_bias);
        put(dst.bias_v.data(), src.bias_v.data(), n_bias);
    } else if (fresh) {
        dst.adam_m.zero(stream_);
        dst.adam_v.zero(stream_);
        dst.bias_m.zero(stream_);
        dst.bias_v.zero(stream_);
    }
    // The copies read pageable host memory the caller may free: finish them now.
    HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (use_bf16()) refresh_bf16(l);
}

void gpu_backend::refresh_bf16(size_t l) {
    device_layer& layer = layers_[l];
    layer.weights16.resize(layer.weights.size(), "bf16 weights");
    to_bf16(layer.weights.data(), layer.weights16.data(), layer.weights.size(), stream_);
}

void gpu_backend::ensure_work(uint32_t batch) {
    const size_t hidden = size_t(batch) * layers_[0].stride;
    hidden_.reserve(hidden, "hidden activations");
    d_hidden_.reserve(hidden, "hidden gradients");
    if (use_bf16()) hidden16_.reserve(hidden, "bf16 hidden activations");
    loss_.reserve(batch, "losses");
}

void gpu_backend::export_state(model_state& out, bool with_optimizer) const {
    activate();
    // Logically const: bringing the rows up to date changes when the deferred steps are
    // applied, not what the model is (the CPU backend's host_state does the same).
    const_cast<gpu_backend*>(this)->complete_deferred_updates();
    // Keep out's buffers where it has this model's shapes (the same snapshot is exported into
    // every epoch under --epochs auto); a layout has none.
    if (!out.same_layout(shape_)) {
        out = model_state::layout(shape_.config);
        out.layers[1].rows = shape_.layers[1].rows;  // a rank's shard
    }
    out.output_first = shape_.output_first;
    out.config = shape_.config;
    out.adam_step = shape_.adam_step;
    out.hash_seeds = shape_.hash_seeds;
    for (size_t l = 0; l < 2; ++l) {
        const device_layer& src = layers_[l];
        layer_state& dst = out.layers[l];
        const size_t n = size_t(src.rows) * src.stride;
        auto get = [&](auto& to, const device_array<float>& from, size_t count) {
            if (to.size() != count) to.resize(count);
            HSLIDE_CUDA_CHECK(cudaMemcpyAsync(to.data(), from.data(), count * sizeof(float),
                                              cudaMemcpyDeviceToHost, stream_));
        };
        get(dst.weights, src.weights, n);
        get(dst.bias, src.bias, src.bias.size());
        if (with_optimizer) {
            get(dst.adam_m, src.adam_m, n);
            get(dst.adam_v, src.adam_v, n);
            get(dst.bias_m, src.bias_m, src.bias_m.size());
            get(dst.bias_v, src.bias_v, src.bias_v.size());
        } else {  // as a layout: no moments
            dst.adam_m.resize(0);
            dst.adam_v.resize(0);
            dst.bias_m.clear();
            dst.bias_v.clear();
        }
    }
    HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void gpu_backend::import_state(const model_state& in, bool with_optimizer) {
    shape_.check_same_layout(in);
    activate();
    for (size_t l = 0; l < 2; ++l) upload_layer(l, in.layers[l], with_optimizer);
    if (with_optimizer) shape_.adam_step = in.adam_step;
    // New Adam state: every row is up to date at its step. Parameters alone keep the
    // replica's moments and step, and with them its rows' deferred steps (as on the CPU).
    if (catches_up_inputs() && with_optimizer) {
        input_catch_up_.restart(shape_.adam_step, stream_);
        rows_behind_ = false;
    }
    // In place: the LSH selection reads the output layer's seed where it is.
    HSLIDE_CHECK(in.hash_seeds.size() == shape_.hash_seeds.size(),
                 "imported model has {} hash seeds, expected {}", in.hash_seeds.size(),
                 shape_.hash_seeds.size());
    std::copy(in.hash_seeds.begin(), in.hash_seeds.end(), shape_.hash_seeds.begin());
    if (selection_) selection_->rows_changed(layers_[1].view());
    reset_changed_rows();
    HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void gpu_backend::refresh_selections(bool new_functions) {
    if (!selection_) return;
    activate();
    selection_->refresh(new_functions, layers_[1].view());
}

backend_info gpu_backend::info() const {
    backend_info bi;
    bi.kind = to_string(dense_output_ ? backend_kind::gpu_dense : backend_kind::gpu);
    bi.device = device_name_ + (selection_          ? selection_->describe()
                                : !shard_.sharded() ? " (dense output, cuBLAS)"
                                : dense_output_     ? " (every row)"
                                                    : " (top-k output, cuBLAS scoring)");
    if (shard_.sharded())
        bi.device += fmt::format(", rank {} of {}: output rows [{}, {}) of {}", shard_.comm->rank(),
                                 shard_.comm->size(), shard_.first, shard_.first + shard_.count,
                                 shard_.total);
    bi.precision = to_string(precision_);
    for (const device_layer& l : layers_)
        bi.memory_bytes += l.weights.bytes() + l.adam_m.bytes() + l.adam_v.bytes() +
                           l.bias.bytes() * 3 + l.weights16.bytes();
    const device_layer& out = layers_[1];  // its rows: a rank's shard, or all
    bi.output_layer_bytes = out.weights.bytes() + out.adam_m.bytes() + out.adam_v.bytes() +
                            out.bias.bytes() * 3 + out.weights16.bytes();
    bi.output_first = shard_.first;
    bi.output_rows = out.rows;
    bi.memory_bytes += exact_.memory_bytes() + input_catch_up_.memory_bytes();
    if (selection_) bi.memory_bytes += selection_->memory_bytes();
    activate();
    bi.free_memory_bytes = device_memory_info().first;
    return bi;
}

void finish_table_rebuild(backend& b) {
    if (auto* g = dynamic_cast<gpu_backend*>(&b)) g->finish_table_rebuild();
}

std::vector<std::vector<uint32_t>> last_output_active_sets(backend& b) {
    if (auto* g = dynamic_cast<gpu_backend*>(&b)) return g->last_active_sets();
    return {};
}

std::unique_ptr<backend> create_gpu_backend(model_state initial, const train_config& train,
                                            int device, precision_mode precision, bool dense_output,
                                            bool async_rebuild, const output_shard& shard) {
    return std::make_unique<gpu_backend>(std::move(initial), train, device, precision, dense_output,
                                         async_rebuild, shard);
}

}  // namespace hslide::gpu
