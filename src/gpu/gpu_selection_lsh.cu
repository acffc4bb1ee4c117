// The LSH selection of the GPU backend's output layer (gpu_selection.cuh): the hash functions
// and two sets of tables, the samples' codes, and the rebuilds: on the main stream, or on a
// side stream (--gpu-async-rebuild) whose tables are swapped in when they land.
#include "gpu_selection.cuh"
#include "hslide/config.hpp"
#include "hslide/error.hpp"
#include "hslide/lsh.hpp"
#include "hslide/rng.hpp"

#include <utility>

namespace hslide::gpu {

namespace {

/// The side stream of asynchronous rebuilds, the main stream's point they start after, and
/// their start and end (timed); released by their own destructor, so that a constructor that
/// throws part-way leaks none of them.
struct side_handles {
    cudaStream_t side = nullptr;
    cudaEvent_t weights_ready = nullptr, rebuild_begin = nullptr, rebuild_end = nullptr;
    ~side_handles() {
        // Errors are ignored: a destructor must not throw (the process may be exiting).
        if (side) cudaStreamSynchronize(side);
        for (cudaEvent_t e : {weights_ready, rebuild_begin, rebuild_end})
            if (e) cudaEventDestroy(e);
        if (side) cudaStreamDestroy(side);
    }
};

class lsh_selection final : public output_selection {
  public:
    lsh_selection(const layer_view& layer, const layer_config& config, uint64_t& hash_seed,
                  const uint64_t& step, bool async_rebuild, cudaStream_t stream)
        : lsh_(config.lsh),
          active_(config.active),
          hash_seed_(hash_seed),
          step_(step),
          async_(async_rebuild),
          stream_(stream) {
        if (async_) {
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
        rebuild(layer);
        // The spare set is allocated (and filled) now: an out-of-memory error comes at
        // creation, not from a rebuild in the middle of training.
        if (async_) build_tables(layer, tables_[front_ ^ 1], stream_);
    }

    uint32_t select_sets(const selection_batch& b, active_sets& sets,
                         cudaStream_t stream) override {
        codes_.reserve(size_t(b.size) * lsh_.L, "LSH codes");
        device_hash_.hash_rows(b.hidden, b.hidden_stride, b.size, codes_.data(), stream);
        if (b.hashed) HSLIDE_CUDA_CHECK(cudaEventRecord(b.hashed, stream));
        // A prediction waited for every rebuild (finish_refresh); a step takes one that landed.
        if (b.training) adopt_rebuilt_tables(/*wait=*/false);
        return build_active_sets(
            tables_[front_].view(), codes_.data(), b.size,
            b.training ? b.csr->label_offsets : nullptr, b.training ? b.csr->label_ids : nullptr,
            b.training ? b.max_labels : 0,
            active_set_params::of(b.layer.rows, lsh_, active_, b.training, b.sample_seed), sets,
            stream);
    }

    void refresh(bool new_functions, const layer_view& layer) override {
        if (new_functions) hash_seed_ = derive_seed(hash_seed_, step_ + 1);
        if (async_ && !new_functions) {
            // New functions change the samples' codes too: those rebuilds stay synchronous.
            start_async_rebuild(layer);
            return;
        }
        rebuild(layer);
        // Wait for it, so that its time is counted as a rebuild, not in the next batch's update.
        HSLIDE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    }

    void rows_changed(const layer_view& layer) override { rebuild(layer); }

    void step_queued(const layer_view& layer) override {
        // A rebuild asked for while one ran starts now, from this step's weights, beside the
        // host's staging of the next batch.
        if (rebuild_wanted_ && !rebuild_in_flight_) start_async_rebuild(layer);
    }

    void finish_refresh(const layer_view& layer) override {
        adopt_rebuilt_tables(/*wait=*/true);
        if (rebuild_wanted_) {
            start_async_rebuild(layer);
            adopt_rebuilt_tables(/*wait=*/true);
        }
    }

    double take_refresh_seconds(bool adopt_landed) override {
        // A table rebuild is not a batch: one still running goes on (finish_refresh waits).
        if (adopt_landed) adopt_rebuilt_tables(/*wait=*/false);
        return std::exchange(rebuild_seconds_, 0.0);
    }

    bool predicts_from_sets() const override { return true; }

    size_t memory_bytes() const override {
        return tables_[0].memory_bytes() + tables_[1].memory_bytes() + scratch_.memory_bytes() +
               table_codes_.bytes() + codes_.bytes();
    }

    std::string describe() const override { return " (LSH output)"; }

  private:
    /// Rebuilds the tables in use on the main stream (new hash functions first if the seed
    /// changed), after any rebuild still running on the side stream.
    void rebuild(const layer_view& layer) {
        if (rebuild_in_flight_) {
            // It uses the codes and the scratch, and this rebuild is newer: the main stream
            // waits for it, and its tables are not used.
            HSLIDE_CUDA_CHECK(cudaStreamWaitEvent(stream_, handles_.rebuild_end, 0));
            rebuild_in_flight_ = rebuild_wanted_ = false;
        }
        if (!hash_ || hash_->seed() != hash_seed_) {
            // Taken only once uploaded: after a failed upload the next call tries again.
            auto family = hash_family::create(lsh_, layer.width, hash_seed_);
            device_hash_.upload(family->function_data(), stream_);
            hash_ = std::move(family);
        }
        build_tables(layer, tables_[front_], stream_);
    }

    /// Hashes the layer's rows and builds `tables` from them on `stream`.
    void build_tables(const layer_view& layer, device_tables& tables, cudaStream_t stream) {
        table_codes_.reserve(size_t(layer.rows) * lsh_.L, "LSH codes of the output neurons");
        device_hash_.hash_rows(layer.weights, layer.stride, layer.rows, table_codes_.data(),
                               stream);
        // The priorities depend on the step count, as the CPU's insertion order does.
        tables.build(table_codes_.data(), layer.rows, lsh_.L, lsh_.K * lsh_.bits_per_hash,
                     lsh_.bucket_capacity, derive_seed(hash_seed_, step_), scratch_, stream);
    }

    /// Starts a rebuild into the spare tables on the side stream, after the work queued so
    /// far; the steps go on with the tables in use until it lands.
    void start_async_rebuild(const layer_view& layer) {
        adopt_rebuilt_tables(/*wait=*/false);
        if (rebuild_in_flight_) {
            rebuild_wanted_ = true;
            return;
        }
        // The spare tables were last read by work queued on the main stream before the last
        // swap, and the weights are those of the steps queued so far: the side stream starts
        // after both. The steps queued after this one update the weights while they are
        // hashed: a row may be read partly before and partly after an update (each float is
        // old or new), the staleness SLIDE's unsynchronised threads accept on the CPU.
        try {
            HSLIDE_CUDA_CHECK(cudaEventRecord(handles_.weights_ready, stream_));
            HSLIDE_CUDA_CHECK(cudaStreamWaitEvent(handles_.side, handles_.weights_ready, 0));
            HSLIDE_CUDA_CHECK(cudaEventRecord(handles_.rebuild_begin, handles_.side));
            build_tables(layer, tables_[front_ ^ 1], handles_.side);
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

    /// Puts a rebuild from the side stream in use once it is done (with `wait`: waits for
    /// it). A rebuild asked for meanwhile (rebuild_wanted_) is the caller's to start.
    void adopt_rebuilt_tables(bool wait) {
        if (!rebuild_in_flight_) return;
        if (wait) {
            HSLIDE_CUDA_CHECK(cudaEventSynchronize(handles_.rebuild_end));
        } else {
            const cudaError_t status = cudaEventQuery(handles_.rebuild_end);
            if (status == cudaErrorNotReady) {
                cudaGetLastError();  // "not ready" is no error: clear it for the next check
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

    lsh_config lsh_;
    active_set_config active_;
    uint64_t& hash_seed_;  // the backend's model seed of this layer (exported with the model)
    const uint64_t& step_;
    bool async_;
    cudaStream_t stream_;
    std::unique_ptr<hash_family> hash_;  // host copy: the functions' seed and arrays
    device_hash_family device_hash_;
    // tables_[front_] serve the lookups; an asynchronous rebuild writes the other, which is
    // swapped in when it is done. One build runs at a time: they share the codes and scratch.
    device_tables tables_[2];
    int front_ = 0;
    table_build_scratch scratch_;
    device_array<uint32_t> table_codes_, codes_;
    bool rebuild_in_flight_ = false;
    bool rebuild_wanted_ = false;  // asked for while one ran: started when that one lands
    double rebuild_seconds_ = 0;   // GPU time of the rebuilds landed since the last report
    side_handles handles_;         // last: its destructor waits for the side stream first
};

}  // namespace

std::unique_ptr<output_selection> make_lsh_selection(const layer_view& layer,
                                                     const layer_config& config,
                                                     uint64_t& hash_seed, const uint64_t& step,
                                                     bool async_rebuild, cudaStream_t stream) {
    return std::make_unique<lsh_selection>(layer, config, hash_seed, step, async_rebuild, stream);
}

}  // namespace hslide::gpu
