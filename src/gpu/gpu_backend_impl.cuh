// The CUDA backend's class (see gpu_backend.hpp for its factory), shared by its stages:
// gpu_backend.cu (creation, whole-state transfers, info), gpu_backend_step.cu (a training
// step), gpu_backend_predict.cu (prediction) and gpu_backend_rows.cu (row traffic for hybrid
// merges, deferred updates). The output layer's active sets come from its selection object
// (gpu_selection.cuh: LSH with its tables and asynchronous rebuild, or exact top-k with its
// scoring buffers); a dense output layer has none.
//
// One step on the GPU.
//
// A training step, all on one stream:
//  1. the batch goes to the device as one CSR block (features, labels) from pinned memory;
//  2. first layer: each sample's feature rows summed, ReLU;
//  3. output layer (a selection's sets; LSH): bucket codes of the hidden vectors, active
//     sets (labels first),
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
#pragma once

#include "cublas_loader.hpp"
#include "gpu_backend.hpp"
#include "gpu_catch_up.cuh"
#include "gpu_dense.cuh"
#include "gpu_layers.cuh"
#include "gpu_lsh.cuh"
#include "gpu_rows.cuh"
#include "gpu_selection.cuh"
#include "gpu_topk.cuh"
#include "hslide/backend_registry.hpp"
#include "hslide/error.hpp"
#include "hslide/gpu_devices.hpp"
#include "hslide/lsh.hpp"
#include "hslide/rng.hpp"
#include "hslide/row_transfer.hpp"
#include "hslide/seed_streams.hpp"
#include "hslide/shard_softmax.hpp"

#include "cpu/top_k_set.hpp"

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

inline int bits_for(uint64_t n) {  // bits to hold 0..n-1
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
                precision_mode precision, bool dense_output, bool async_rebuild,
                output_shard shard = {});
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

    /// Waits for the selection's refreshes asked for so far (LSH's table rebuilds) and puts
    /// the last one in use.
    void finish_table_rebuild() {
        activate();
        if (selection_) selection_->finish_refresh(layers_[1].view());
    }

    /// The output layer's active sets of the last step (tests): per sample, as built.
    std::vector<std::vector<uint32_t>> last_active_sets() {
        activate();
        std::vector<std::vector<uint32_t>> sets;
        if (!selection_ || last_batch_ == 0) return sets;
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
    /// A step's start: the batch uploaded (`uploaded`, when not null, recorded after it), the
    /// first layer's rows it reads caught up, the hidden activations; returns the largest
    /// label count.
    uint32_t forward_first_layer(const batch_view& batch, cudaEvent_t uploaded);
    /// The next step's Adam parameters, for the first and the output layer (their rates).
    struct step_adam {
        adam_params input, output;
    };
    step_adam adam_for_step(float learning_rate) const;
    /// Queues the output layer's row-sparse update over active_'s `total` entries (their
    /// deltas in delta_), flagging the rows it changed and copying their count to `touched`
    /// (pinned host memory).
    void output_rows_update(uint32_t total, float inv_batch, const adam_params& adam,
                            uint32_t* touched);
    /// Counts the step whose updates are queued (the Adam step; catch-up's schedule).
    void count_step(const adam_params& input_adam);
    batch_csr device_batch(uint32_t size) const;
    /// Sizes the per-batch buffers for `batch` samples (a no-op when they are big enough; an
    /// allocation that failed is tried again).
    void ensure_work(uint32_t batch);
    void upload_layer(size_t l, const layer_state& src, bool with_optimizer);
    void refresh_bf16(size_t l);
    bool use_bf16() const { return precision_ == precision_mode::bf16; }
    /// --adam input-catch-up: the first layer's untouched rows catch up when next read.
    bool catches_up_inputs() const { return adam_catches_up_rows(train_.adam, 0); }
    /// The output layer trains on active sets (LSH or top-k: a selection), not on every neuron.
    bool sparse_output() const { return selection_ != nullptr; }
    /// logits (batch rows of ld >= n_out values of `type`) = hidden . W^T, bias not added:
    /// fp32 (sgemm) or, in bf16, the tensor cores' products written as `type` (fp32 for
    /// predictions, bf16 for a dense training step: gpu_dense.cuh).
    void dense_logits(uint32_t batch, void* logits, cudaDataType_t type, uint32_t ld);
    /// The dense step's loss, output deltas and bias gradient from its logits (rows of
    /// dense_leading_dimension values: logits_ and delta_, or logits16_ and delta16_ in bf16).
    void dense_loss(uint32_t batch, const batch_csr& csr, float inv_batch);
    void dense_backward_and_update(uint32_t batch, float inv_batch, const adam_params& adam);
    /// Allocates what first_layer_update needs, before any update of the step is queued: an
    /// out-of-memory error then leaves the model as it was, never half a step.
    void reserve_first_layer_update(uint32_t nnz);
    void first_layer_update(uint32_t batch, uint32_t nnz, float inv_batch, const adam_params& adam);
    void activate() const { HSLIDE_CUDA_CHECK(cudaSetDevice(device_)); }

    // A label-sharded output layer (gpu_backend_shard.cu; gpu_backend.hpp says how a step runs).
    /// The constructor's refusals of what GPU ranks do not shard.
    void check_shardable() const;
    /// A rank's training step; synchronous (the host takes part in it): returns its own report.
    step_report sharded_train_batch(const batch_view& batch, float learning_rate);
    /// This rank's members of each sample's set, built on the host with the other ranks, into
    /// shard_host_ (local ids, labels first) and active_; returns the entries (the whole sets'
    /// sizes added into `set_entries`).
    uint32_t build_shard_sets(const batch_view& batch, uint64_t& set_entries);
    /// synchronize()'s check that every rank's replicated layer is the same.
    void check_replicas();
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
    bool dense_output_;  // every output neuron, through cuBLAS (no selection)
    bool async_rebuild_;
    /// The stream, cuBLAS handle and timing events, released by their own destructor so that
    /// a constructor that throws part-way (out of memory) leaks none of them.
    struct cuda_handles {
        int device = 0;
        cudaStream_t stream = nullptr;
        cublasHandle_t blas = nullptr;
        cudaEvent_t events[2][8] = {};  // a step's stage boundaries, by step parity
        cudaEvent_t staged[2] = {};     // each staging block's last copy to the device
        ~cuda_handles() {
            // Errors are ignored: a destructor must not throw (the process may be exiting).
            cudaSetDevice(device);
            if (stream) cudaStreamSynchronize(stream);
            if (blas) cublas().destroy(blas);
            for (auto& set : events)
                for (cudaEvent_t e : set)
                    if (e) cudaEventDestroy(e);
            for (cudaEvent_t e : staged)
                if (e) cudaEventDestroy(e);
            if (stream) cudaStreamDestroy(stream);
        }
    };
    cuda_handles handles_;
    cudaStream_t& stream_ = handles_.stream;
    cublasHandle_t& blas_ = handles_.blas;

    device_layer layers_[2];

    // The batch: pinned blocks (two, used in turn) and one device block with the same layout.
    pinned_array<uint32_t> staging_[2];
    int next_staging_ = 0;
    device_array<uint32_t> batch_block_;
    uint32_t batch_nnz_ = 0, batch_labels_ = 0;

    // Work arrays, grown to the largest batch.
    device_array<float> hidden_, d_hidden_, loss_;
    device_array<__nv_bfloat16> hidden16_, delta16_;
    device_array<__nv_bfloat16> logits16_, dense_gradient16_;  // a dense bf16 step's
    active_sets active_;
    top_k_workspace exact_;  // exact prediction's chunked scoring (score_top_k)
    device_array<float> logits_, delta_;
    device_array<float> dense_gradient_, bias_gradient_, dense_softmax_work_;
    row_groups output_groups_, input_groups_;
    device_array<uint32_t> nonzero_sample_;
    device_array<uint8_t> input_touched_;  // --adam input-dense: the step's first-layer rows
    device_array<uint32_t> top_labels_;
    device_array<float> top_scores_;
    input_catch_up input_catch_up_;           // --adam input-catch-up's schedule and row steps
    bool rows_behind_ = false;                // input-catch-up: rows may lag the step count
    pinned_array<float> loss_host_[2];        // per-sample losses, by step parity
    pinned_array<float> dropped_host_[2];     // per-sample dropped mass (top-k), by parity
    pinned_array<uint32_t> touched_host_[2];  // output rows the step's update touched, by parity

    /// The last step queued, whose report is built once it is done.
    struct pending_step {
        bool active = false;
        int parity = 0;
        uint32_t samples = 0;
        uint64_t active_entries = 0;
        uint32_t labelled = 0;   // samples with labels (their dropped mass is reported)
        bool dropped = false;    // the selection reported the mass outside the sets
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

    // A label-sharded output layer: which rows this rank holds (default: all, not sharded), and
    // the host side of its steps.
    output_shard shard_;
    struct shard_host {
        std::vector<uint32_t> best;          // batch x k candidates (local, then merged: global)
        std::vector<float> best_score;       // their scores
        std::vector<float> log_partition32;  // the rank's log-partitions, as scored
        std::vector<double> log_partition;   // the whole layer's, after the merge
        std::vector<unsigned char> merge_scratch;
        cpu::set_member_marks marks;
        std::vector<uint32_t> set;                         // one sample's whole set
        std::vector<uint32_t> offsets, ids, entry_sample;  // this rank's members (CSR)
        std::vector<uint32_t> label_members;               // per sample: its labels among them
        std::vector<uint32_t> label_index, label_begin;    // every-row layers: labels' rows
        // The step's largest transfers, in page-locked memory (asynchronous, full-speed copies).
        pinned_array<float> logits, delta;
        std::vector<shard_softmax_sample> softmax;
        shard_softmax_scratch softmax_scratch;
        pinned_array<double> share;    // batch x width: the hidden gradient, summed over ranks
        pinned_array<float> d_hidden;  // batch x stride: rounded
    };
    shard_host shard_host_;
    device_array<double> shard_share_;  // batch x width: this rank's share of the hidden gradient
    pinned_array<uint32_t> shard_touched_;

    // The output layer's selection (gpu_selection.cuh): LSH or exact top-k; none for a dense
    // output layer or a sharded one. Last: destroyed first, while the stream and the layers it
    // reads exist.
    std::unique_ptr<output_selection> selection_;
};

}  // namespace hslide::gpu
