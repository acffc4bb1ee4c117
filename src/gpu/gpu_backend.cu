// The CUDA backend (see gpu_backend.hpp): one step on the GPU.
//
// A training step, all on one stream:
//  1. the batch goes to the device as one CSR block (features, labels) from pinned memory;
//  2. first layer: each sample's feature rows summed, ReLU;
//  3. output layer (LSH): bucket codes of the hidden vectors, active sets (labels first),
//     one warp per active neuron for the logits, one block per sample for the fused
//     softmax + loss + gradient, and one block per sample for W^T delta;
//     (top-k): the same, with the active sets from exact scoring of every row in chunked
//     GEMMs and a fused k-selection (gpu_topk.cuh), and the loss through the exact
//     log-partition;
//     (dense): cuBLAS for logits, W^T delta and the weight gradient, the fused softmax,
//     gradient and bias gradient between them (gpu_dense.cuh);
//  4. update: the active entries sorted by neuron (CUB), one warp per touched row sums its
//     gradient in sample order and applies Adam; the first layer's touched rows likewise
//     from the batch's nonzeros sorted by feature.
// Under --adam input-catch-up the first layer's rows the batch reads are first brought up to
// date on the steps they skipped (gpu_catch_up.cuh), before step 2 reads them; every row is
// brought up to date before predictions and exports.
// The host waits once per step, for the size of the active sets (kernel grids and sorts are
// sized by it). A step is not waited for at its end: train_batch returns the report of the
// step before (done by then: the wait came after it), and the caller stages the next batch
// while the update runs; synchronize() returns the last one. Two staging blocks, loss blocks
// and event sets alternate between consecutive steps.
// The update also flags the rows it changed, so that a hybrid merge moves only those rows
// (take_changed_rows, export_rows, import_rows: gpu_rows.cuh).
#include "cublas_loader.hpp"
#include "gpu_backend.hpp"
#include "gpu_catch_up.cuh"
#include "gpu_dense.cuh"
#include "gpu_layers.cuh"
#include "gpu_lsh.cuh"
#include "gpu_rows.cuh"
#include "gpu_topk.cuh"
#include "hslide/backend_registry.hpp"
#include "hslide/error.hpp"
#include "hslide/gpu_devices.hpp"
#include "hslide/lsh.hpp"
#include "hslide/rng.hpp"
#include "hslide/row_transfer.hpp"
#include "hslide/seed_streams.hpp"

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <numeric>

namespace hslide::gpu {

namespace {

/// Waits for the stream when a scope is left by an exception: the work queued before the
/// throw may still read host staging buffers or device buffers the next call reuses.
class drain_on_throw {
  public:
    explicit drain_on_throw(cudaStream_t stream)
        : stream_(stream), exceptions_(std::uncaught_exceptions()) {}
    ~drain_on_throw() {
        if (std::uncaught_exceptions() > exceptions_) {
            cudaStreamSynchronize(stream_);  // the error being thrown is the one to report
            cudaGetLastError();
        }
    }
    drain_on_throw(const drain_on_throw&) = delete;
    drain_on_throw& operator=(const drain_on_throw&) = delete;

  private:
    cudaStream_t stream_;
    int exceptions_;
};

int bits_for(uint64_t n) {  // bits to hold 0..n-1
    int bits = 1;
    while ((uint64_t{1} << bits) < n) ++bits;
    return bits;
}

/// One layer's parameters and Adam moments on the device.
struct device_layer {
    uint32_t rows = 0, width = 0, stride = 0;
    device_array<float> weights, adam_m, adam_v, bias, bias_m, bias_v;
    device_array<__nv_bfloat16> weights16;  // empty in fp32 precision

    // Kernels get mutable pointers; constness is the backend's, not the view's.
    layer_view view() const {
        auto* self = const_cast<device_layer*>(this);
        return layer_view{self->weights.data(),
                          self->adam_m.data(),
                          self->adam_v.data(),
                          self->bias.data(),
                          self->bias_m.data(),
                          self->bias_v.data(),
                          weights16.size() ? self->weights16.data() : nullptr,
                          rows,
                          width,
                          stride};
    }
};

/// Rows grouped for a row-sparse update: sorted keys, the entry of each sorted position, and
/// the run-length encoding of the keys.
struct row_groups {
    device_array<uint32_t> keys, sorted_keys, index, order, unique, counts, begin, n_unique;
    device_array<uint8_t> temp;

    /// Groups n keys (keys and index filled by the caller) of up to key_bits bits.
    void group(uint32_t n, int key_bits, cudaStream_t stream) {
        reserve(n);
        with_scratch(temp, [&](void* t, size_t& bytes) {
            return cub::DeviceRadixSort::SortPairs(t, bytes, keys.data(), sorted_keys.data(),
                                                   index.data(), order.data(), n, 0, key_bits,
                                                   stream);
        });
        HSLIDE_CUDA_CHECK(cudaMemsetAsync(counts.data(), 0, (size_t(n) + 1) * 4, stream));
        with_scratch(temp, [&](void* t, size_t& bytes) {
            return cub::DeviceRunLengthEncode::Encode(t, bytes, sorted_keys.data(), unique.data(),
                                                      counts.data(), n_unique.data(), n, stream);
        });
        with_scratch(temp, [&](void* t, size_t& bytes) {
            return cub::DeviceScan::ExclusiveSum(t, bytes, counts.data(), begin.data(), n + 1,
                                                 stream);
        });
    }
    void reserve(uint32_t n) {
        for (auto* a : {&keys, &sorted_keys, &index, &order, &unique})
            a->reserve(std::max(n, 1u), "gradient grouping");
        counts.reserve(size_t(n) + 1, "gradient grouping");
        begin.reserve(size_t(n) + 1, "gradient grouping");
        n_unique.reserve(1, "gradient grouping");
    }
};

class gpu_backend final : public backend, public row_transfer {
  public:
    gpu_backend(model_state initial, const train_config& train, int device,
                precision_mode precision, bool dense_output, bool async_rebuild);
    ~gpu_backend() override;

    step_report train_batch(const batch_view& batch, float learning_rate) override;
    step_report synchronize() override;
    void refresh_selections(bool new_functions) override;
    void predict(const batch_view& batch, uint32_t k, scoring_mode scoring, uint32_t* labels,
                 float* scores) override;
    void export_state(model_state& out, bool with_optimizer) const override;
    void import_state(const model_state& in, bool with_optimizer) override;
    bool take_changed_rows(row_sets& rows) override;
    void export_rows(const row_sets& rows, model_state& out) const override;
    void import_rows(const model_state& in, const row_sets& rows) override;
    bool complete_deferred_updates() override;
    backend_info info() const override;

    /// Waits for the table rebuilds asked for so far and puts the last one in use.
    void finish_table_rebuild() {
        activate();
        adopt_rebuilt_tables(/*wait=*/true);
        if (rebuild_wanted_) {
            start_async_rebuild();
            adopt_rebuilt_tables(/*wait=*/true);
        }
    }

    /// The output layer's active sets of the last step (tests): per sample, as built.
    std::vector<std::vector<uint32_t>> last_active_sets() {
        activate();
        std::vector<std::vector<uint32_t>> sets;
        if (dense_output_ || last_batch_ == 0) return sets;
        HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream_));
        std::vector<uint32_t> offsets(size_t(last_batch_) + 1);
        HSLIDE_CUDA_CHECK(cudaMemcpy(offsets.data(), active_.offsets.data(), offsets.size() * 4,
                                     cudaMemcpyDeviceToHost));
        std::vector<uint32_t> ids(offsets.back());
        if (!ids.empty())
            HSLIDE_CUDA_CHECK(
                cudaMemcpy(ids.data(), active_.ids.data(), ids.size() * 4, cudaMemcpyDeviceToHost));
        for (uint32_t s = 0; s < last_batch_; ++s)
            sets.emplace_back(ids.begin() + offsets[s], ids.begin() + offsets[s + 1]);
        return sets;
    }

  private:
    /// Rows of a layer moved per transfer: bounds the pinned and device staging blocks.
    static constexpr uint32_t rows_per_chunk = 65536;
    /// Copies the batch's CSR arrays to the device (through the staging block whose last copy
    /// is done); returns the largest label count.
    uint32_t upload_batch(const batch_view& batch, bool check_labels);
    /// Waits for the step still in flight, if any, and returns its report.
    step_report finish_pending_step();
    batch_csr device_batch(uint32_t size) const;
    /// Sizes the per-batch buffers for `batch` samples (a no-op when they are big enough; an
    /// allocation that failed is tried again).
    void ensure_work(uint32_t batch);
    void upload_layer(size_t l, const layer_state& src, bool with_optimizer);
    void refresh_bf16(size_t l);
    /// Rebuilds the tables in use on the main stream (new hash functions first if the seed
    /// changed), after any rebuild still running on the side stream.
    void rebuild_output_tables();
    /// Hashes the output layer's rows and builds `tables` from them on `stream`.
    void build_output_tables(device_tables& tables, cudaStream_t stream);
    /// Starts a rebuild into the spare tables on the side stream, after the work queued so
    /// far; the steps go on with the tables in use until it lands.
    void start_async_rebuild();
    /// Puts a rebuild from the side stream in use once it is done (with `wait`: waits for it).
    /// A rebuild asked for meanwhile (rebuild_wanted_) is the caller's to start.
    void adopt_rebuilt_tables(bool wait);
    bool use_bf16() const { return precision_ == precision_mode::bf16; }
    /// --adam input-catch-up: the first layer's untouched rows catch up when next read.
    bool catches_up_inputs() const { return adam_catches_up_rows(train_.adam, 0); }
    /// The output layer's active sets come from LSH tables (rebuilt as training goes).
    bool lsh_output() const { return !dense_output_ && !topk_output_; }
    /// The output layer trains on active sets (LSH or top-k), not on every neuron.
    bool sparse_output() const { return !dense_output_; }
    /// Top-k active sets of the batch (exact scoring, gpu_topk.cuh) into active_; the loss's
    /// log-partition in topk_.log_partition. Returns the number of entries.
    uint32_t select_top_k_sets(uint32_t batch, const batch_csr& csr, uint32_t max_labels);
    /// logits (batch rows of ld >= n_out values of `type`) = hidden . W^T, bias not added:
    /// fp32 (sgemm) or, in bf16, the tensor cores' products written as `type` (fp32 for
    /// predictions, bf16 for a dense training step: gpu_dense.cuh).
    void dense_logits(uint32_t batch, void* logits, cudaDataType_t type, uint32_t ld);
    /// The dense step's loss, output deltas and bias gradient from its logits (rows of
    /// dense_leading_dimension values: logits_ and delta_, or logits16_ and delta16_ in bf16).
    void dense_softmax(uint32_t batch, const batch_csr& csr, float inv_batch);
    void dense_backward_and_update(uint32_t batch, float inv_batch, const adam_params& adam);
    /// Allocates what first_layer_update needs, before any update of the step is queued: an
    /// out-of-memory error then leaves the model as it was, never half a step.
    void reserve_first_layer_update(uint32_t nnz);
    void first_layer_update(uint32_t batch, uint32_t nnz, float inv_batch, const adam_params& adam);
    void activate() const { HSLIDE_CUDA_CHECK(cudaSetDevice(device_)); }
    /// The output layer's active-set settings; `training` forces the labels in.
    active_set_params output_active_params(bool training, uint64_t seed) const;
    /// No row changed since now (creation, a whole import, a take).
    void reset_changed_rows();
    /// Calls chunk(ids, n) for consecutive chunks of layer l's `rows`, each checked against
    /// the layer and copied to the device (row_ids_) first.
    template <class Chunk>
    void for_row_chunks(size_t l, const std::vector<uint32_t>& rows, Chunk&& chunk) const;
    /// Room for n packed rows of `stride` floats (and their biases) on both sides; returns
    /// the floats of the block.
    size_t reserve_row_staging(uint32_t n, uint32_t stride) const;

    model_state shape_;  // config, layer shapes, step count, hash seeds; no parameters
    train_config train_;
    int device_;
    std::string device_name_;
    precision_mode precision_;
    bool dense_output_;
    bool topk_output_ = false;  // exact top-k output sets (neuron_selection::top_k)
    bool async_rebuild_;
    /// The stream, cuBLAS handle and timing events, released by their own destructor so that
    /// a constructor that throws part-way (out of memory) leaks none of them.
    struct cuda_handles {
        int device = 0;
        cudaStream_t stream = nullptr;
        cublasHandle_t blas = nullptr;
        cudaEvent_t events[2][8] = {};  // a step's stage boundaries, by step parity
        cudaEvent_t staged[2] = {};     // each staging block's last copy to the device
        // Asynchronous table rebuilds: their stream, the main stream's point they start
        // after, and their start and end (timed).
        cudaStream_t side = nullptr;
        cudaEvent_t weights_ready = nullptr, rebuild_begin = nullptr, rebuild_end = nullptr;
        ~cuda_handles() {
            // Errors are ignored: a destructor must not throw (the process may be exiting).
            cudaSetDevice(device);
            if (stream) cudaStreamSynchronize(stream);
            if (side) cudaStreamSynchronize(side);
            if (blas) cublas().destroy(blas);
            for (auto& set : events)
                for (cudaEvent_t e : set)
                    if (e) cudaEventDestroy(e);
            for (cudaEvent_t e : staged)
                if (e) cudaEventDestroy(e);
            for (cudaEvent_t e : {weights_ready, rebuild_begin, rebuild_end})
                if (e) cudaEventDestroy(e);
            if (side) cudaStreamDestroy(side);
            if (stream) cudaStreamDestroy(stream);
        }
    };
    cuda_handles handles_;
    cudaStream_t& stream_ = handles_.stream;
    cublasHandle_t& blas_ = handles_.blas;

    device_layer layers_[2];
    std::unique_ptr<hash_family> hash_;  // host copy: the functions' seed and arrays
    device_hash_family device_hash_;
    // tables_[front_] serve the lookups; an asynchronous rebuild writes the other, which is
    // swapped in when it is done. One build runs at a time: they share the codes and scratch.
    device_tables tables_[2];
    int front_ = 0;
    table_build_scratch table_scratch_;
    device_array<uint32_t> table_codes_;
    bool rebuild_in_flight_ = false;
    bool rebuild_wanted_ = false;  // asked for while one ran: started when that one lands
    double rebuild_seconds_ = 0;   // GPU time of the rebuilds landed since the last report

    // The batch: pinned blocks (two, used in turn) and one device block with the same layout.
    pinned_array<uint32_t> staging_[2];
    int next_staging_ = 0;
    device_array<uint32_t> batch_block_;
    uint32_t batch_nnz_ = 0, batch_labels_ = 0;

    // Work arrays, grown to the largest batch.
    device_array<float> hidden_, d_hidden_, loss_;
    device_array<__nv_bfloat16> hidden16_, delta16_;
    device_array<__nv_bfloat16> logits16_, dense_gradient16_;  // a dense bf16 step's
    device_array<uint32_t> codes_;
    active_sets active_;
    top_k_workspace topk_;
    device_array<float> logits_, delta_;
    device_array<float> corrected_logits_;  // top-k: the logits with the fill's correction
    device_array<float> dense_gradient_, bias_gradient_, dense_softmax_work_;
    row_groups output_groups_, input_groups_;
    device_array<uint32_t> nonzero_sample_;
    device_array<uint8_t> input_touched_;  // --adam input-dense: the step's first-layer rows
    device_array<uint32_t> top_labels_;
    device_array<float> top_scores_;
    input_catch_up input_catch_up_;           // --adam input-catch-up's schedule and row steps
    bool rows_behind_ = false;                // input-catch-up: rows may lag the step count
    pinned_array<float> loss_host_[2];        // per-sample losses, by step parity
    pinned_array<float> dropped_host_[2];     // top-k: per-sample dropped mass, by step parity
    pinned_array<uint32_t> touched_host_[2];  // output rows the step's update touched, by parity

    /// The last step queued, whose report is built once it is done.
    struct pending_step {
        bool active = false;
        int parity = 0;
        uint32_t samples = 0;
        uint64_t active_entries = 0;
        uint32_t labelled = 0;   // top-k: samples with labels (their dropped mass is reported)
        bool every_row = false;  // the update moved every output row (a dense output layer)
    };
    pending_step pending_;
    int step_parity_ = 0;
    uint32_t last_batch_ = 0;  // samples of the last training step (last_active_sets)

    // Row traffic for hybrid merges (gpu_rows.cuh).
    device_array<uint8_t> changed_[2];      // per row: updated since the last take
    bool all_changed_[2] = {false, false};  // a dense update changed every row
    mutable pinned_array<uint8_t> changed_host_;
    mutable pinned_array<uint32_t> row_ids_host_;
    mutable pinned_array<float> row_block_host_, row_bias_host_;
    mutable device_array<uint32_t> row_ids_;
    mutable device_array<float> row_block_, row_bias_;
};

gpu_backend::gpu_backend(model_state initial, const train_config& train, int device,
                         precision_mode precision, bool dense_output, bool async_rebuild)
    : train_(train), device_(device), precision_(precision), async_rebuild_(async_rebuild) {
    offer_rows(this);
    validate(initial.config);
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
    topk_output_ = !dense_output && config.selection(1) == neuron_selection::top_k;
    dense_output_ = dense_output || (!config.uses_lsh(1) && !topk_output_);
    // k is clamped to the layer (as the CPU's and select_top_k_sets' k): --top-k above the
    // layer's size takes every neuron, and only the clamped k has to fit the merge buffer.
    HSLIDE_CHECK_KIND(
        !topk_output_ || std::min(config.layers[1].top_k, config.layers[1].size) <= top_k_max,
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
    if (async_rebuild_ && lsh_output()) {
        // The lowest priority: the steps' kernels go first where both wait for the SMs.
        int least = 0, greatest = 0;
        HSLIDE_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
        HSLIDE_CUDA_CHECK(
            cudaStreamCreateWithPriority(&handles_.side, cudaStreamNonBlocking, least));
        HSLIDE_CUDA_CHECK(
            cudaEventCreateWithFlags(&handles_.weights_ready, cudaEventDisableTiming));
        HSLIDE_CUDA_CHECK(cudaEventCreate(&handles_.rebuild_begin));
        HSLIDE_CUDA_CHECK(cudaEventCreate(&handles_.rebuild_end));
    }
    if (dense_output_ || topk_output_) {
        HSLIDE_CUBLAS_CHECK(cublas().create(&blas_));
        HSLIDE_CUBLAS_CHECK(cublas().set_stream(blas_, stream_));
    }

    shape_ = model_state::layout(config);
    shape_.adam_step = initial.adam_step;
    shape_.hash_seeds = initial.hash_seeds;
    shape_.check_same_layout(initial);
    for (size_t l = 0; l < 2; ++l) upload_layer(l, initial.layers[l], /*with_optimizer=*/true);
    initial = model_state{};  // the host copy is no longer needed: free it before tables
    reset_changed_rows();
    if (catches_up_inputs())
        input_catch_up_.start(train_.adam_beta1, train_.adam_beta2, train_.adam_epsilon,
                              layers_[0].rows, shape_.adam_step, stream_);
    if (lsh_output()) {
        rebuild_output_tables();
        // The spare set is allocated (and filled) now: an out-of-memory error comes at
        // creation, not from a rebuild in the middle of training.
        if (async_rebuild_) build_output_tables(tables_[front_ ^ 1], stream_);
    }
    HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

gpu_backend::~gpu_backend() {
    // Work in flight may still read the device arrays, which are freed before handles_.
    cudaSetDevice(device_);
    if (stream_) cudaStreamSynchronize(stream_);
    if (handles_.side) cudaStreamSynchronize(handles_.side);
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

void gpu_backend::rebuild_output_tables() {
    if (rebuild_in_flight_) {
        // It uses the codes and the scratch, and this rebuild is newer: the main stream waits
        // for it, and its tables are not used.
        HSLIDE_CUDA_CHECK(cudaStreamWaitEvent(stream_, handles_.rebuild_end, 0));
        rebuild_in_flight_ = rebuild_wanted_ = false;
    }
    const lsh_config& cfg = shape_.config.layers[1].lsh;
    if (!hash_ || hash_->seed() != shape_.hash_seeds[1]) {
        // Taken only once uploaded: after a failed upload the next call tries again.
        auto family = hash_family::create(cfg, layers_[1].width, shape_.hash_seeds[1]);
        device_hash_.upload(family->function_data(), stream_);
        hash_ = std::move(family);
    }
    build_output_tables(tables_[front_], stream_);
}

void gpu_backend::build_output_tables(device_tables& tables, cudaStream_t stream) {
    const lsh_config& cfg = shape_.config.layers[1].lsh;
    const device_layer& out = layers_[1];
    table_codes_.reserve(size_t(out.rows) * cfg.L, "LSH codes of the output neurons");
    device_hash_.hash_rows(out.weights.data(), out.stride, out.rows, table_codes_.data(), stream);
    // The priorities depend on the step count, as the CPU's insertion order does.
    tables.build(table_codes_.data(), out.rows, cfg.L, cfg.K * cfg.bits_per_hash,
                 cfg.bucket_capacity, derive_seed(shape_.hash_seeds[1], shape_.adam_step),
                 table_scratch_, stream);
}

void gpu_backend::start_async_rebuild() {
    adopt_rebuilt_tables(/*wait=*/false);
    if (rebuild_in_flight_) {
        rebuild_wanted_ = true;
        return;
    }
    // The spare tables were last read by work queued on the main stream before the last
    // swap, and the weights are those of the steps queued so far: the side stream starts
    // after both. The steps queued after this one update the weights while they are hashed:
    // a row may be read partly before and partly after an update (each float is old or new),
    // the staleness SLIDE's unsynchronised threads accept on the CPU.
    try {
        HSLIDE_CUDA_CHECK(cudaEventRecord(handles_.weights_ready, stream_));
        HSLIDE_CUDA_CHECK(cudaStreamWaitEvent(handles_.side, handles_.weights_ready, 0));
        HSLIDE_CUDA_CHECK(cudaEventRecord(handles_.rebuild_begin, handles_.side));
        build_output_tables(tables_[front_ ^ 1], handles_.side);
        HSLIDE_CUDA_CHECK(cudaEventRecord(handles_.rebuild_end, handles_.side));
    } catch (...) {
        // Part of the build may be queued, with nothing to wait for it: finish it here, so
        // that no later build shares the codes and scratch with it. Asked for again later.
        cudaStreamSynchronize(handles_.side);
        cudaGetLastError();
        rebuild_wanted_ = true;
        throw;
    }
    rebuild_wanted_ = false;
    rebuild_in_flight_ = true;
}

void gpu_backend::adopt_rebuilt_tables(bool wait) {
    if (!rebuild_in_flight_) return;
    if (wait) {
        HSLIDE_CUDA_CHECK(cudaEventSynchronize(handles_.rebuild_end));
    } else {
        const cudaError_t status = cudaEventQuery(handles_.rebuild_end);
        if (status == cudaErrorNotReady) {
            cudaGetLastError();  // "not ready" is no error: clear it for the next launch check
            return;
        }
        HSLIDE_CUDA_CHECK(status);
    }
    float ms = 0;
    HSLIDE_CUDA_CHECK(cudaEventElapsedTime(&ms, handles_.rebuild_begin, handles_.rebuild_end));
    rebuild_seconds_ += double(ms) / 1000.0;
    // Work queued from here on reads the new tables; the old ones become the spare.
    front_ ^= 1;
    rebuild_in_flight_ = false;
}

active_set_params gpu_backend::output_active_params(bool training, uint64_t seed) const {
    const layer_config& cfg = shape_.config.layers[1];
    return active_set_params::of(layers_[1].rows, cfg.lsh, cfg.active, training, seed);
}

void gpu_backend::refresh_selections(bool new_functions) {
    if (!lsh_output()) return;
    activate();
    if (new_functions)
        shape_.hash_seeds[1] = derive_seed(shape_.hash_seeds[1], shape_.adam_step + 1);
    if (async_rebuild_ && !new_functions) {
        // New functions change the samples' codes too: those rebuilds stay synchronous.
        start_async_rebuild();
        return;
    }
    rebuild_output_tables();
    // Wait for it, so that its time is counted as a rebuild, not in the next batch's update.
    HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

uint32_t gpu_backend::upload_batch(const batch_view& batch, bool check_labels) {
    const dataset& data = *batch.data;
    const uint32_t b = batch.size;
    uint64_t nnz = 0, n_labels = 0;
    uint32_t max_labels = 0;
    for (uint32_t s = 0; s < b; ++s) {
        const uint32_t point = batch.rows[s];
        const feature_row x = data.features(point);
        const label_row y = data.labels(point);
        for (uint32_t i = 0; i < x.count; ++i)
            HSLIDE_CHECK(x.ids[i] < shape_.layers[0].rows,
                         "{}: point {} has feature {} but the model has {} inputs", data.source,
                         point, x.ids[i], shape_.layers[0].rows);
        if (check_labels)
            for (uint32_t i = 0; i < y.count; ++i)
                HSLIDE_CHECK(y.ids[i] < shape_.layers[1].rows,
                             "{}: point {} has label {} but the model has {} outputs", data.source,
                             point, y.ids[i], shape_.layers[1].rows);
        nnz += x.count;
        n_labels += y.count;
        max_labels = std::max(max_labels, y.count);
    }
    HSLIDE_CHECK(nnz < (uint64_t{1} << 31) && n_labels < (uint64_t{1} << 31),
                 "a batch of {} points has too many nonzeros for the GPU backend", b);
    // Layout: feature offsets, label offsets (b + 1 each), feature ids, values, label ids.
    const size_t words = 2 * (size_t(b) + 1) + 2 * nnz + n_labels;
    const int slot = next_staging_;
    next_staging_ ^= 1;
    // Its last copy (two batches ago) must be done before it is refilled (an event never
    // recorded counts as done).
    HSLIDE_CUDA_CHECK(cudaEventSynchronize(handles_.staged[slot]));
    pinned_array<uint32_t>& staging = staging_[slot];
    staging.reserve(words, "batch staging");
    uint32_t* f_off = staging.data();
    uint32_t* l_off = f_off + b + 1;
    uint32_t* f_ids = l_off + b + 1;
    float* f_vals = reinterpret_cast<float*>(f_ids + nnz);
    uint32_t* l_ids = f_ids + 2 * nnz;
    f_off[0] = l_off[0] = 0;
    for (uint32_t s = 0; s < b; ++s) {
        const feature_row x = data.features(batch.rows[s]);
        const label_row y = data.labels(batch.rows[s]);
        std::memcpy(f_ids + f_off[s], x.ids, x.count * 4);
        std::memcpy(f_vals + f_off[s], x.values, x.count * 4);
        std::memcpy(l_ids + l_off[s], y.ids, y.count * 4);
        f_off[s + 1] = f_off[s] + x.count;
        l_off[s + 1] = l_off[s] + y.count;
    }
    batch_block_.reserve(words, "batch");
    HSLIDE_CUDA_CHECK(cudaMemcpyAsync(batch_block_.data(), staging.data(), words * 4,
                                      cudaMemcpyHostToDevice, stream_));
    HSLIDE_CUDA_CHECK(cudaEventRecord(handles_.staged[slot], stream_));
    batch_nnz_ = uint32_t(nnz);
    batch_labels_ = uint32_t(n_labels);
    return max_labels;
}

batch_csr gpu_backend::device_batch(uint32_t size) const {
    const uint32_t* base = batch_block_.data();
    const uint32_t* f_ids = base + 2 * (size_t(size) + 1);
    return batch_csr{base,
                     f_ids,
                     reinterpret_cast<const float*>(f_ids + batch_nnz_),
                     base + size + 1,
                     f_ids + 2 * size_t(batch_nnz_),
                     size};
}

void gpu_backend::ensure_work(uint32_t batch) {
    const size_t hidden = size_t(batch) * layers_[0].stride;
    hidden_.reserve(hidden, "hidden activations");
    d_hidden_.reserve(hidden, "hidden gradients");
    if (use_bf16()) hidden16_.reserve(hidden, "bf16 hidden activations");
    loss_.reserve(batch, "losses");
    if (lsh_output()) codes_.reserve(size_t(batch) * shape_.config.layers[1].lsh.L, "LSH codes");
}

void gpu_backend::dense_logits(uint32_t batch, void* logits, cudaDataType_t type, uint32_t ld) {
    const device_layer& out = layers_[1];
    const float one = 1.0f, zero = 0.0f;
    // Row-major logits (batch rows of ld values) are column-major (rows x batch, leading
    // dimension ld) = W . hidden^T; columns rows..ld - 1 are not written.
    if (use_bf16()) {
        HSLIDE_CUBLAS_CHECK(cublas().gemm_ex(
            blas_, CUBLAS_OP_T, CUBLAS_OP_N, int(out.rows), int(batch), int(out.width), &one,
            out.weights16.data(), CUDA_R_16BF, int(out.stride), hidden16_.data(), CUDA_R_16BF,
            int(layers_[0].stride), &zero, logits, type, int(ld), CUBLAS_COMPUTE_32F,
            CUBLAS_GEMM_DEFAULT));
    } else {
        HSLIDE_ASSERT(type == CUDA_R_32F);
        HSLIDE_CUBLAS_CHECK(cublas().sgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, int(out.rows),
                                           int(batch), int(out.width), &one, out.weights.data(),
                                           int(out.stride), hidden_.data(), int(layers_[0].stride),
                                           &zero, static_cast<float*>(logits), int(ld)));
    }
}

void gpu_backend::dense_softmax(uint32_t batch, const batch_csr& csr, float inv_batch) {
    const device_layer& out = layers_[1];
    const uint32_t ld = dense_leading_dimension(out.rows);
    // The gradient in the precision of the logits, which the backward products consume; the
    // bias gradient with it.
    bias_gradient_.reserve(out.rows, "dense output gradient");
    dense_softmax_work_.reserve(dense_softmax_work_floats(batch, out.rows), "dense softmax");
    if (use_bf16()) {
        delta16_.reserve(size_t(batch) * ld, "bf16 output gradients");
        dense_softmax_loss(logits16_.data(), out.bias.data(), out.rows, ld, csr, inv_batch,
                           delta16_.data(), bias_gradient_.data(), loss_.data(),
                           dense_softmax_work_.data(), stream_);
    } else {
        delta_.reserve(size_t(batch) * ld, "dense output gradients");
        dense_softmax_loss(logits_.data(), out.bias.data(), out.rows, ld, csr, inv_batch,
                           delta_.data(), bias_gradient_.data(), loss_.data(),
                           dense_softmax_work_.data(), stream_);
    }
}

void gpu_backend::dense_backward_and_update(uint32_t batch, float inv_batch,
                                            const adam_params& adam) {
    device_layer& out = layers_[1];
    const float one = 1.0f, zero = 0.0f;
    const int rows = int(out.rows), width = int(out.width), stride = int(out.stride);
    const int hstride = int(layers_[0].stride), b = int(batch);
    const int ld = int(dense_leading_dimension(out.rows));  // of the deltas (dense_softmax)
    const size_t value_bytes = use_bf16() ? 2 : 4;          // of the deltas and the weight gradient
    // d_hidden (column-major stride x batch) = W^T . delta; the padding rows stay zero.
    d_hidden_.zero(stream_);
    void* gradient = nullptr;  // dW, column-major stride x rows
    if (use_bf16()) {
        // Mixed precision as AMP training does it: all three products on the tensor cores,
        // the logits and deltas in bf16 (dense_softmax wrote them so), and the weight gradient
        // written in bf16 for Adam, as autocast's linear layers produce theirs (half the bytes
        // of an fp32 one, written and read once a step: 2 x 171 MB at Amazon-670K). The CPU's
        // bf16 path keeps logits, deltas and gradients in fp32, so here the two differ by
        // about 2^-9 per term (the dense GPU path is the baseline the sparse paths are timed
        // against, not a reference).
        dense_gradient16_.reserve(size_t(out.rows) * out.stride, "dense output gradient");
        gradient = dense_gradient16_.data();
        HSLIDE_CUBLAS_CHECK(cublas().gemm_ex(
            blas_, CUBLAS_OP_N, CUBLAS_OP_N, width, b, rows, &one, out.weights16.data(),
            CUDA_R_16BF, stride, delta16_.data(), CUDA_R_16BF, ld, &zero, d_hidden_.data(),
            CUDA_R_32F, hstride, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        // dW = hidden^T . delta, scaled to the batch mean.
        HSLIDE_CUBLAS_CHECK(cublas().gemm_ex(
            blas_, CUBLAS_OP_N, CUBLAS_OP_T, width, rows, b, &inv_batch, hidden16_.data(),
            CUDA_R_16BF, hstride, delta16_.data(), CUDA_R_16BF, ld, &zero, gradient, CUDA_R_16BF,
            stride, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    } else {
        dense_gradient_.reserve(size_t(out.rows) * out.stride, "dense output gradient");
        gradient = dense_gradient_.data();
        HSLIDE_CUBLAS_CHECK(cublas().sgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_N, width, b, rows, &one,
                                           out.weights.data(), stride, delta_.data(), ld, &zero,
                                           d_hidden_.data(), hstride));
        HSLIDE_CUBLAS_CHECK(cublas().sgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_T, width, rows, b,
                                           &inv_batch, hidden_.data(), hstride, delta_.data(), ld,
                                           &zero, dense_gradient_.data(), stride));
    }
    relu_backward(hidden_.data(), batch, layers_[0].stride, d_hidden_.data(), stream_);
    if (width != stride)  // the gradient's padding columns were not written: keep them zero
        HSLIDE_CUDA_CHECK(cudaMemset2DAsync(
            static_cast<char*>(gradient) + width * value_bytes, size_t(stride) * value_bytes, 0,
            size_t(stride - width) * value_bytes, size_t(rows), stream_));
    // The bias gradient came with the deltas (dense_softmax).
    if (use_bf16())
        dense_adam(out.view(), dense_gradient16_.data(), bias_gradient_.data(), adam, stream_);
    else
        dense_adam(out.view(), dense_gradient_.data(), bias_gradient_.data(), adam, stream_);
}

void gpu_backend::first_layer_update(uint32_t batch, uint32_t nnz, float inv_batch,
                                     const adam_params& adam) {
    const batch_csr csr = device_batch(batch);
    row_groups& g = input_groups_;
    if (nnz > 0) {
        nonzero_keys(csr, g.keys.data(), nonzero_sample_.data(), g.index.data(), stream_);
        g.group(nnz, 32, stream_);
        first_layer_rows_adam(layers_[0].view(), g.unique.data(), g.begin.data(), g.n_unique.data(),
                              nnz, g.order.data(), nonzero_sample_.data(), csr.feature_values,
                              d_hidden_.data(), inv_batch, adam, stream_);
        mark_rows(changed_[0].data(), g.unique.data(), g.n_unique.data(), nnz, stream_);
        // The forward pass brought them up to date at the step before; now at this one.
        if (catches_up_inputs())
            input_catch_up_.stamp(g.unique.data(), g.n_unique.data(), nnz, stream_);
    }
    if (adam_moves_untouched_rows(train_.adam, 0)) {
        // The other rows move with their momentum, as the CPU's input-dense Adam does.
        input_touched_.zero(stream_);
        if (nnz > 0)
            mark_rows(input_touched_.data(), g.unique.data(), g.n_unique.data(), nnz, stream_);
        untouched_rows_adam(layers_[0].view(), input_touched_.data(), adam, stream_);
        all_changed_[0] = true;
    }
    first_layer_bias_adam(layers_[0].view(), d_hidden_.data(), batch, inv_batch, adam, stream_);
}

void gpu_backend::reserve_first_layer_update(uint32_t nnz) {
    input_groups_.reserve(nnz);
    nonzero_sample_.reserve(std::max(nnz, 1u), "gradient grouping");
    if (adam_moves_untouched_rows(train_.adam, 0))
        input_touched_.reserve(layers_[0].rows, "first-layer row flags");
}

uint32_t gpu_backend::select_top_k_sets(uint32_t batch, const batch_csr& csr, uint32_t max_labels) {
    const layer_config& cfg = shape_.config.layers[1];
    const device_layer& out = layers_[1];
    const uint32_t k = std::min(cfg.top_k, out.rows);
    const uint32_t fill = std::min(cfg.active.min_active, out.rows);
    // HSLIDE_GPU_TOPK_FUSED=1: the fused scoring pass (gpu_topk.cuh), opt-in until a GPU run
    // has measured it; the cuBLAS pass where it does not apply or its candidates overflowed.
    const uint64_t fallbacks = topk_.fused_fallbacks;
    const bool fused = top_k_fused_requested() && use_bf16() &&
                       score_top_k_fused(out.view(), hidden16_.data(), layers_[0].stride, batch, k,
                                         fused_auto_pilot, blas_, topk_, stream_);
    if (fallbacks == 0 && topk_.fused_fallbacks == 1)
        std::fprintf(stderr,
                     "hslide: HSLIDE_GPU_TOPK_FUSED: a sample's candidates overflowed; such "
                     "steps take the cuBLAS scoring pass\n");
    if (!fused)
        score_top_k(out.view(), hidden_.data(), use_bf16() ? hidden16_.data() : nullptr,
                    layers_[0].stride, use_bf16(), batch, k, /*chunk=*/0, blas_, topk_, stream_);
    // The fill's seed as LSH's (the CPU draws other ids: only the seed decides them); the
    // pool's as the CPU's, so both draw from the same rows.
    const fill_pool pool{step_seed(train_.seed, seed_stream::fill_pool, shape_.adam_step),
                         fill_pool_size(cfg.fill_pool, out.rows, fill, batch)};
    return build_top_k_sets(batch, k, csr.label_offsets, csr.label_ids, max_labels, fill, out.rows,
                            step_seed(train_.seed, seed_stream::train_sample, shape_.adam_step), pool, topk_,
                            active_, stream_);
}

step_report gpu_backend::train_batch(const batch_view& batch, float learning_rate) {
    HSLIDE_CHECK(batch.size > 0 && batch.data, "empty batch");
    activate();
    const drain_on_throw drain(stream_);
    const int parity = step_parity_;
    cudaEvent_t* events = handles_.events[parity];
    const uint32_t b = batch.size;
    ensure_work(b);
    HSLIDE_CUDA_CHECK(cudaEventRecord(events[0], stream_));
    const uint32_t max_labels = upload_batch(batch, /*check_labels=*/true);
    const batch_csr csr = device_batch(b);
    HSLIDE_CUDA_CHECK(cudaEventRecord(events[1], stream_));

    if (catches_up_inputs()) {
        // Every row the forward pass reads (unlabelled points' too), as the CPU's forward pass
        // does; counted in the forward time, as there.
        HSLIDE_ASSERT(input_catch_up_.current() == shape_.adam_step);
        input_catch_up_.catch_up_batch(layers_[0].view(), csr.feature_ids, batch_nnz_,
                                       changed_[0].data(), stream_);
    }
    device_layer& out = layers_[1];
    first_layer_forward(layers_[0].view(), csr, hidden_.data(),
                        use_bf16() ? hidden16_.data() : nullptr, stream_);
    uint64_t active_entries = uint64_t(b) * out.rows;
    const float inv_batch = 1.0f / float(b);
    uint32_t total = 0;
    if (sparse_output()) {
        HSLIDE_CUDA_CHECK(cudaEventRecord(events[2], stream_));
        if (topk_output_) {
            // No hashing: the selection (scoring GEMMs included) counts as active sets.
            HSLIDE_CUDA_CHECK(cudaEventRecord(events[3], stream_));
            total = select_top_k_sets(b, csr, max_labels);
        } else {
            device_hash_.hash_rows(hidden_.data(), layers_[0].stride, b, codes_.data(), stream_);
            HSLIDE_CUDA_CHECK(cudaEventRecord(events[3], stream_));
            adopt_rebuilt_tables(/*wait=*/false);
            total = build_active_sets(
                tables_[front_].view(), codes_.data(), b, csr.label_offsets, csr.label_ids,
                max_labels,
                output_active_params(true,
                                     step_seed(train_.seed, seed_stream::train_sample, shape_.adam_step)),
                active_, stream_);
        }
        active_entries = total;
        HSLIDE_CUDA_CHECK(cudaEventRecord(events[4], stream_));
        logits_.reserve(std::max(total, 1u), "active logits");
        delta_.reserve(std::max(total, 1u), "active gradients");
        sparse_output_forward(out.view(), hidden_.data(), hidden16_.data(), use_bf16(),
                              active_.ids.data(), active_.entry_sample.data(), total,
                              logits_.data(), stream_);
        // The gradient is the softmax over the set (as LSH's; bench/topk.md says why), with
        // top-k's fill raised by its log-Q correction where the layer asks for one.
        const float fill_correction = shape_.config.layers[1].fill_correction;
        float* set_logits = logits_.data();
        if (topk_output_ && fill_correction > 0.0f) {
            corrected_logits_.reserve(std::max(total, 1u), "corrected logits");
            apply_fill_correction(logits_.data(), active_.offsets.data(), b, out.rows,
                                  fill_correction, topk_, corrected_logits_.data(), stream_);
            set_logits = corrected_logits_.data();
        }
        softmax_loss(set_logits, nullptr, active_.offsets.data(), 0,
                     /*labels_first=*/true, csr, delta_.data(), loss_.data(), stream_);
        // Top-k: the loss reported is the full softmax's, through the exact log-partition.
        if (topk_output_)
            full_softmax_loss(logits_.data(), active_.offsets.data(), csr, topk_, loss_.data(),
                              stream_);
        HSLIDE_CUDA_CHECK(cudaEventRecord(events[5], stream_));
        sparse_output_backward(out.view(), use_bf16(), active_.offsets.data(), active_.ids.data(),
                               delta_.data(), hidden_.data(), b, d_hidden_.data(), stream_);
    } else {
        for (int e = 2; e <= 4; ++e) HSLIDE_CUDA_CHECK(cudaEventRecord(events[e], stream_));
        const uint32_t ld = dense_leading_dimension(out.rows);
        if (use_bf16()) {
            logits16_.reserve(size_t(b) * ld, "dense bf16 logits");
            dense_logits(b, logits16_.data(), CUDA_R_16BF, ld);
        } else {
            logits_.reserve(size_t(b) * ld, "dense logits");
            dense_logits(b, logits_.data(), CUDA_R_32F, ld);
        }
        dense_softmax(b, csr, inv_batch);
        HSLIDE_CUDA_CHECK(cudaEventRecord(events[5], stream_));
    }

    // The step counts once its update is queued (an error before leaves the count as it was).
    reserve_first_layer_update(batch_nnz_);
    loss_host_[parity].reserve(b, "losses");
    if (topk_output_) dropped_host_[parity].reserve(b, "dropped mass");
    const uint64_t step = shape_.adam_step + 1;
    const adam_corrections corrections = adam_bias_corrections(train_, step);
    const adam_params adam{learning_rate,       train_.adam_beta1, train_.adam_beta2,
                           train_.adam_epsilon, corrections.c1,    corrections.c2};
    touched_host_[parity].reserve(1, "touched rows");
    touched_host_[parity].data()[0] = 0;  // read two steps ago at the latest, as the losses
    if (sparse_output()) {
        HSLIDE_CUDA_CHECK(cudaEventRecord(events[6], stream_));
        row_groups& g = output_groups_;
        g.reserve(total);
        if (total > 0) {
            HSLIDE_CUDA_CHECK(cudaMemcpyAsync(g.keys.data(), active_.ids.data(), size_t(total) * 4,
                                              cudaMemcpyDeviceToDevice, stream_));
            iota(g.index.data(), total, stream_);
            g.group(total, bits_for(out.rows), stream_);
            output_rows_adam(out.view(), g.unique.data(), g.begin.data(), g.n_unique.data(), total,
                             g.order.data(), active_.entry_sample.data(), delta_.data(),
                             hidden_.data(), inv_batch, adam, stream_);
            mark_rows(changed_[1].data(), g.unique.data(), g.n_unique.data(), total, stream_);
            HSLIDE_CUDA_CHECK(cudaMemcpyAsync(touched_host_[parity].data(), g.n_unique.data(), 4,
                                              cudaMemcpyDeviceToHost, stream_));
        }
    } else {
        dense_backward_and_update(b, inv_batch, adam);  // backward and update in one
        all_changed_[1] = true;
        HSLIDE_CUDA_CHECK(cudaEventRecord(events[6], stream_));
    }
    first_layer_update(b, batch_nnz_, inv_batch, adam);
    shape_.adam_step = step;
    if (catches_up_inputs()) {
        input_catch_up_.record_step(learning_rate);
        rows_behind_ = true;
    }
    // This parity's loss block was last read two steps ago (its report is taken).
    HSLIDE_CUDA_CHECK(cudaMemcpyAsync(loss_host_[parity].data(), loss_.data(), size_t(b) * 4,
                                      cudaMemcpyDeviceToHost, stream_));
    if (topk_output_)
        HSLIDE_CUDA_CHECK(cudaMemcpyAsync(dropped_host_[parity].data(), topk_.dropped.data(),
                                          size_t(b) * 4, cudaMemcpyDeviceToHost, stream_));
    HSLIDE_CUDA_CHECK(cudaEventRecord(events[7], stream_));
    // A rebuild asked for while one ran starts now, from this step's weights, beside the
    // host's staging of the next batch.
    if (rebuild_wanted_ && !rebuild_in_flight_) start_async_rebuild();
    // The step before is done (in the LSH path the wait for the set sizes came after it), or
    // finishes while this one is queued: its report goes back now, and this step runs on
    // while the caller prepares the next batch.
    step_report report = finish_pending_step();
    report.times.rebuild += std::exchange(rebuild_seconds_, 0.0);
    uint32_t labelled = 0;
    for (uint32_t s = 0; s < b; ++s) labelled += batch.data->labels(batch.rows[s]).count > 0;
    pending_ = pending_step{true, parity, b, active_entries, labelled, !sparse_output()};
    last_batch_ = b;
    step_parity_ ^= 1;
    return report;
}

step_report gpu_backend::finish_pending_step() {
    step_report report;
    if (!pending_.active) return report;
    pending_.active = false;  // an error below is reported once
    cudaEvent_t* events = handles_.events[pending_.parity];
    HSLIDE_CUDA_CHECK(cudaEventSynchronize(events[7]));
    const uint32_t b = pending_.samples;
    report.samples = b;
    const float* loss = loss_host_[pending_.parity].data();
    for (uint32_t s = 0; s < b; ++s) report.loss_sum += loss[s];
    if (topk_output_) {
        // Unlabelled samples have 0 there and are not counted.
        const float* dropped = dropped_host_[pending_.parity].data();
        for (uint32_t s = 0; s < b; ++s) report.dropped_mass_sum += dropped[s];
        report.full_softmax_samples = pending_.labelled;
    }
    report.active_per_layer = {uint64_t(b) * layers_[0].width, pending_.active_entries};
    const double out_rows = double(layers_[1].rows);
    report.output_touched_share_sum =
        pending_.every_row ? 1.0 : touched_host_[pending_.parity].data()[0] / out_rows;
    report.steps_counted = 1;
    auto elapsed = [&](int from, int to) {
        float ms = 0;
        HSLIDE_CUDA_CHECK(cudaEventElapsedTime(&ms, events[from], events[to]));
        return double(ms) / 1000.0;
    };
    // GPU time between the step's marks: waits for the host (staging the batch while the GPU
    // was idle, reading the set sizes) fall into the stage they interrupt.
    stage_times& st = report.times;
    st.transfer = elapsed(0, 1);
    st.forward = elapsed(1, 2) + elapsed(4, 5);
    st.hashing = elapsed(2, 3);
    st.active_sets = elapsed(3, 4);
    st.backward = elapsed(5, 6);
    st.update = elapsed(6, 7);
    report.seconds = elapsed(0, 7);
    return report;
}

step_report gpu_backend::synchronize() {
    activate();
    step_report report = finish_pending_step();
    // A table rebuild is not a batch: one still running goes on (finish_table_rebuild waits).
    adopt_rebuilt_tables(/*wait=*/false);
    report.times.rebuild += std::exchange(rebuild_seconds_, 0.0);
    return report;
}

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

void gpu_backend::export_state(model_state& out, bool with_optimizer) const {
    activate();
    // Logically const: bringing the rows up to date changes when the deferred steps are
    // applied, not what the model is (the CPU backend's host_state does the same).
    const_cast<gpu_backend*>(this)->complete_deferred_updates();
    out = model_state::layout(shape_.config);
    out.adam_step = shape_.adam_step;
    out.hash_seeds = shape_.hash_seeds;
    for (size_t l = 0; l < 2; ++l) {
        const device_layer& src = layers_[l];
        layer_state& dst = out.layers[l];
        const size_t n = size_t(src.rows) * src.stride;
        auto get = [&](auto& to, const device_array<float>& from, size_t count) {
            to.resize(count);
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
    shape_.hash_seeds = in.hash_seeds;
    if (lsh_output()) rebuild_output_tables();
    reset_changed_rows();
    HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void gpu_backend::reset_changed_rows() {
    for (size_t l = 0; l < 2; ++l) {
        changed_[l].reserve(layers_[l].rows, "row change flags");
        changed_[l].zero(stream_);
        all_changed_[l] = false;
    }
}

bool gpu_backend::take_changed_rows(row_sets& rows) {
    activate();
    rows.assign(2, {});
    for (size_t l = 0; l < 2; ++l) {
        const uint32_t n = layers_[l].rows;
        if (all_changed_[l]) {
            rows[l].resize(n);
            std::iota(rows[l].begin(), rows[l].end(), 0u);
            continue;
        }
        changed_host_.reserve(n, "row change flags");
        HSLIDE_CUDA_CHECK(cudaMemcpyAsync(changed_host_.data(), changed_[l].data(), n,
                                          cudaMemcpyDeviceToHost, stream_));
        HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream_));
        const uint8_t* flags = changed_host_.data();
        for (uint32_t r = 0; r < n; ++r)
            if (flags[r]) rows[l].push_back(r);
    }
    reset_changed_rows();
    return true;
}

template <class Chunk>
void gpu_backend::for_row_chunks(size_t l, const std::vector<uint32_t>& rows, Chunk&& chunk) const {
    const uint32_t n_rows = layers_[l].rows;
    for (size_t begin = 0; begin < rows.size(); begin += rows_per_chunk) {
        const uint32_t n = uint32_t(std::min<size_t>(rows_per_chunk, rows.size() - begin));
        row_ids_host_.reserve(n, "row transfer staging");
        for (uint32_t i = 0; i < n; ++i) {
            const uint32_t r = rows[begin + i];
            HSLIDE_CHECK(r < n_rows, "row transfer: row {} of layer {} is out of range ({} rows)",
                         r, l, n_rows);
            row_ids_host_.data()[i] = r;
        }
        row_ids_.reserve(n, "row transfer staging");
        HSLIDE_CUDA_CHECK(cudaMemcpyAsync(row_ids_.data(), row_ids_host_.data(), size_t(n) * 4,
                                          cudaMemcpyHostToDevice, stream_));
        chunk(row_ids_host_.data(), n);
    }
}

size_t gpu_backend::reserve_row_staging(uint32_t n, uint32_t stride) const {
    const size_t floats = size_t(n) * stride;
    row_block_.reserve(floats, "row transfer staging");
    row_bias_.reserve(n, "row transfer staging");
    row_block_host_.reserve(floats, "row transfer staging");
    row_bias_host_.reserve(n, "row transfer staging");
    return floats;
}

void gpu_backend::export_rows(const row_sets& rows, model_state& out) const {
    shape_.check_same_layout(out);
    HSLIDE_CHECK(rows.size() == 2, "row export: {} layers of rows for a 2-layer model",
                 rows.size());
    activate();
    for (size_t l = 0; l < 2; ++l) {
        const device_layer& src = layers_[l];
        layer_state& dst = out.layers[l];
        const bool row_bias = l > 0;  // layer 0's bias is one vector, copied whole below
        for_row_chunks(l, rows[l], [&](const uint32_t* ids, uint32_t n) {
            const size_t floats = reserve_row_staging(n, src.stride);
            gather_rows(src.view(), row_ids_.data(), n, row_block_.data(),
                        row_bias ? row_bias_.data() : nullptr, stream_);
            HSLIDE_CUDA_CHECK(cudaMemcpyAsync(row_block_host_.data(), row_block_.data(), floats * 4,
                                              cudaMemcpyDeviceToHost, stream_));
            if (row_bias)
                HSLIDE_CUDA_CHECK(cudaMemcpyAsync(row_bias_host_.data(), row_bias_.data(),
                                                  size_t(n) * 4, cudaMemcpyDeviceToHost, stream_));
            HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream_));
            for (uint32_t i = 0; i < n; ++i) {
                std::memcpy(dst.row(ids[i]), row_block_host_.data() + size_t(i) * src.stride,
                            size_t(src.stride) * 4);
                if (row_bias) dst.bias[ids[i]] = row_bias_host_.data()[i];
            }
        });
        if (!row_bias) {
            HSLIDE_CUDA_CHECK(cudaMemcpyAsync(dst.bias.data(), src.bias.data(), dst.bias.size() * 4,
                                              cudaMemcpyDeviceToHost, stream_));
            HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream_));
        }
    }
}

void gpu_backend::import_rows(const model_state& in, const row_sets& rows) {
    shape_.check_same_layout(in);
    HSLIDE_CHECK(rows.size() == 2, "row import: {} layers of rows for a 2-layer model",
                 rows.size());
    activate();
    for (size_t l = 0; l < 2; ++l) {
        device_layer& dst = layers_[l];
        const layer_state& src = in.layers[l];
        const bool row_bias = l > 0;
        for_row_chunks(l, rows[l], [&](const uint32_t* ids, uint32_t n) {
            const size_t floats = reserve_row_staging(n, dst.stride);
            for (uint32_t i = 0; i < n; ++i) {
                std::memcpy(row_block_host_.data() + size_t(i) * dst.stride, src.row(ids[i]),
                            size_t(dst.stride) * 4);
                if (row_bias) row_bias_host_.data()[i] = src.bias[ids[i]];
            }
            HSLIDE_CUDA_CHECK(cudaMemcpyAsync(row_block_.data(), row_block_host_.data(), floats * 4,
                                              cudaMemcpyHostToDevice, stream_));
            if (row_bias)
                HSLIDE_CUDA_CHECK(cudaMemcpyAsync(row_bias_.data(), row_bias_host_.data(),
                                                  size_t(n) * 4, cudaMemcpyHostToDevice, stream_));
            scatter_rows(dst.view(), row_ids_.data(), n, row_block_.data(),
                         row_bias ? row_bias_.data() : nullptr, stream_);
            // The staging blocks are refilled by the next chunk.
            HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream_));
        });
        if (!row_bias) {
            HSLIDE_CUDA_CHECK(cudaMemcpyAsync(dst.bias.data(), src.bias.data(), src.bias.size() * 4,
                                              cudaMemcpyHostToDevice, stream_));
            HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream_));
        }
    }
}

bool gpu_backend::complete_deferred_updates() {
    if (!rows_behind_) return false;
    activate();
    const drain_on_throw drain(stream_);
    // The rows it moves are changes of this replica's own (flagged for take_changed_rows).
    const bool moved = input_catch_up_.catch_up_all(layers_[0].view(), changed_[0].data(), stream_);
    rows_behind_ = false;
    return moved;
}

backend_info gpu_backend::info() const {
    backend_info bi;
    bi.kind = to_string(backend_kind::gpu);
    bi.device = device_name_ + (dense_output_  ? " (dense output, cuBLAS)"
                                : topk_output_ ? (top_k_fused_requested() && use_bf16()
                                                      ? " (top-k output, fused scoring)"
                                                      : " (top-k output, cuBLAS scoring)")
                                               : " (LSH output)");
    bi.precision = to_string(precision_);
    for (const device_layer& l : layers_)
        bi.memory_bytes += l.weights.bytes() + l.adam_m.bytes() + l.adam_v.bytes() +
                           l.bias.bytes() * 3 + l.weights16.bytes();
    bi.memory_bytes += topk_.memory_bytes() + input_catch_up_.memory_bytes();
    bi.memory_bytes += tables_[0].memory_bytes() + tables_[1].memory_bytes() +
                       table_scratch_.memory_bytes() + table_codes_.bytes();
    activate();
    bi.free_memory_bytes = device_memory_info().first;
    return bi;
}

}  // namespace

void finish_table_rebuild(backend& b) {
    if (auto* g = dynamic_cast<gpu_backend*>(&b)) g->finish_table_rebuild();
}

std::vector<std::vector<uint32_t>> last_output_active_sets(backend& b) {
    if (auto* g = dynamic_cast<gpu_backend*>(&b)) return g->last_active_sets();
    return {};
}

std::unique_ptr<backend> create_gpu_backend(model_state initial, const train_config& train,
                                            int device, precision_mode precision, bool dense_output,
                                            bool async_rebuild) {
    return std::make_unique<gpu_backend>(std::move(initial), train, device, precision, dense_output,
                                         async_rebuild);
}

}  // namespace hslide::gpu
